#!/usr/bin/env bash
# Carry an experiment patch (bench/device/experiments/) on top of the series to the H200 without a
# build there: apply series + experiment to a scratch tree, copy the files it changes into
# build_cuda_here.sh's persistent tree, rebuild the local CUDA build (only what changed: a minute or
# two for one .cu file), then prepare.py --patch <each series patch> --patch EXPERIMENT --prebuilt.
#
#   bash bench/device/prepare_experiment.sh EXPERIMENT.patch [BUILD_DIR]   (default build/cuda-local)
#   bash bench/device/prepare_experiment.sh --restore [BUILD_DIR]           (the series again)
#
# PYTHONPATH reaches prepare.py (its --prebuilt carries the `llama_cpp` package it imports).
#
# The persistent tree then differs from the series until --restore; `python patches/build.py --dev`
# and the wheel build start from the series whatever it holds.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
PY=${PY:-.venv/bin/python}
EXP=${1:?usage: prepare_experiment.sh EXPERIMENT.patch|--restore [BUILD_DIR]}
BUILD=${2:-build/cuda-local}
DEV=build/llama-dev/src/vendor/llama.cpp
[ -d "$DEV" ] && [ -d "$BUILD" ] || { echo "no $DEV or $BUILD: see build_cuda_here.sh" >&2; exit 1; }
SCRATCH=$(mktemp -d /tmp/clover-exp-XXXXXX)
trap 'rm -rf "$SCRATCH"' EXIT

patches=()
for p in "$ROOT"/patches/*.patch; do patches+=("$p"); done
[ "$EXP" = --restore ] || patches+=("$(realpath "$EXP")")
"$PY" - "$SCRATCH" "${patches[@]}" <<'EOF'
import sys, pathlib
sys.path.insert(0, "patches")
import build
build.prepare_tree(pathlib.Path(sys.argv[1]), [pathlib.Path(p) for p in sys.argv[2:]])
EOF
NEW="$SCRATCH/$(ls "$SCRATCH")/vendor/llama.cpp"
d=$(diff -rq "$NEW" "$DEV" || true)
! grep -v '^Files ' <<< "$d" | grep -q . || { echo "files only on one side:" >&2; grep -v '^Files ' <<< "$d" >&2; exit 1; }
changed=$(awk '/^Files /{print $2}' <<< "$d" | sed "s#^$NEW/##")
for f in $changed; do echo "  $f"; cp "$NEW/$f" "$DEV/$f"; done
ninja -C "$BUILD" llama
if [ "$EXP" = --restore ]; then
  echo "$DEV and $BUILD hold the series again"
else
  args=(); for p in "${patches[@]}"; do args+=(--patch "$p"); done
  PYTHONPATH=${PYTHONPATH:-} "$PY" bench/device/prepare.py "${args[@]}" --prebuilt "$BUILD"
fi
