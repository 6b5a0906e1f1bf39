# Sourced by the host checks (fusion_on_cpu/check.sh, streams_on_cpu/check.sh, narrow_on_cpu/check.sh): the repo root
# as the working folder, PY (default the venv's python), T a scratch folder removed on exit, and series_tree
# [EXTRA.patch...], which prints the vendor llama.cpp tree of the series (and the extra patches, applied after it)
# prepared in $T by patches/build.py.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
PY=${PY:-.venv/bin/python}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
series_tree() {
  "$PY" - "$T" "$@" <<'PYEOF'
import sys
from pathlib import Path
from clover_patches import build
extra = [Path(p).resolve() for p in sys.argv[2:]]
print(build.prepare_tree(Path(sys.argv[1]) / "tree", build.series() + extra) / build.VENDOR)
PYEOF
}
