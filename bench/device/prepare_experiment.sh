#!/usr/bin/env bash
# Carry experiment patches (bench/device/experiments/) on top of the series to the H200 without a
# build there: apply series + experiments to a scratch tree, copy the files they change into
# build_cuda_here.sh's persistent tree, rebuild the local CUDA build (only what changed: a minute or
# two for one .cu file), then prepare.py --patch <each series patch> --patch <each experiment> --prebuilt.
#
#   bash bench/device/prepare_experiment.sh EXPERIMENT.patch...   (applied in the order given)
#   bash bench/device/prepare_experiment.sh --restore             (the series again)
#
# BUILD_DIR: the CUDA build to rebuild (default build/cuda-local). PYTHONPATH reaches prepare.py (its
# --prebuilt carries the `llama_cpp` package it imports).
#
# The persistent tree then differs from the series until --restore; `python patches/build.py --dev`
# and the wheel build start from the series whatever it holds.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
PY=${PY:-.venv/bin/python}
[ $# -gt 0 ] || { echo "usage: prepare_experiment.sh EXPERIMENT.patch... | --restore" >&2; exit 2; }
BUILD=${BUILD_DIR:-build/cuda-local}
EXPS=()
[ "$1" = --restore ] || for p in "$@"; do EXPS+=("$(realpath "$p")"); done
[ -d build/llama-dev/src ] && [ -d "$BUILD" ] || { echo "no build/llama-dev/src or $BUILD: see build_cuda_here.sh" >&2; exit 1; }
# the series (+ the experiments) into the persistent tree as patches/build.py --dev does it: only
# changed files are copied, so that ninja rebuilds only what they touch; prints the patches applied
applied=$("$PY" - "${EXPS[@]}" <<'EOF'
import sys, tempfile
from pathlib import Path
from clover_patches import build
patches = build.series() + [Path(p) for p in sys.argv[1:]]
with tempfile.TemporaryDirectory(prefix="clover-exp-") as tmp:
    build.sync_tree(build.prepare_tree(Path(tmp), patches), build.DEV / "src")
print("\n".join(str(p) for p in patches))
EOF
)
mapfile -t patches <<< "$applied"
# configure again: ggml-cuda takes its sources by a glob, so a file an experiment adds (or --restore removes) is
# built only after CMake has run; then no ggml_cuda_ symbol may be left undefined (a library that would not load)
cmake "$BUILD" > /dev/null
ninja -C "$BUILD" llama
if nm -D --undefined-only "$BUILD/bin/libggml-cuda.so" | grep -q ' ggml_cuda_\| _Z[0-9]*ggml_cuda_'; then
  echo "libggml-cuda.so leaves ggml_cuda_ symbols undefined:" >&2
  nm -D --undefined-only "$BUILD/bin/libggml-cuda.so" | grep ' ggml_cuda_\| _Z[0-9]*ggml_cuda_' >&2
  exit 1
fi
if [ ${#EXPS[@]} -eq 0 ]; then
  echo "build/llama-dev/src and $BUILD hold the series again"
else
  args=(); for p in "${patches[@]}"; do args+=(--patch "$p"); done
  "$PY" bench/device/prepare.py "${args[@]}" --prebuilt "$BUILD"
fi
