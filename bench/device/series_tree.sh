# Sourced by the host checks (fusion_on_cpu/check.sh, streams_on_cpu/check.sh, narrow_on_cpu/check.sh): the repo root
# as the working folder, PY (default the venv's python), T a scratch folder removed on exit, and series_tree
# [EXTRA.patch...], which prints the vendor llama.cpp tree of the series (and the extra patches, applied after it)
# prepared in $T by patches/build.py, and cut_switches GGML_CUDA_DIR, which writes $T/switches.inc for the code the
# checks cut out of the tree: the series' switch reader (common.cuh's ggml_cuda_env_int) and ggml_cuda_clover_legacy
# as off.
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
cut_switches() {
  { sed -n '/^inline int ggml_cuda_env_int(/,/^}/p' "$1/common.cuh"
    echo 'static bool ggml_cuda_clover_legacy() { return false; }'; } > "$T/switches.inc"
  grep -q 'ggml_cuda_env_int' "$T/switches.inc" || { echo "could not cut ggml_cuda_env_int out of $1/common.cuh" >&2; exit 2; }
}
