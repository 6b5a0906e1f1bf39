#!/usr/bin/env bash
# The H200 session of issue 12 as it last ran (2026-12-04 morning: a patch 0012 of batched
# conv-state snapshots, measured and dropped: docs/performance.md) as two calls, each under the
# device tool's 10 minutes, with the CUDA libraries built here (prepare.py --prebuilt): a cold
# machine needs no build. Everything lands in $WORK
# (/tmp/clover-dev); a later call on the still-warm machine reuses it. What comes back is
# $OUT/result.json, $OUT/run.log, $OUT/kernels.json and $OUT/all.tgz (the rest: op logs, stderr,
# notes), since the tool returns at most 8 files.
#
# "before" times the same CUDA libraries with the libllama of the series without patch 0012
# (.devcarry/before/libllama.so.0.5.0: `prepare.py --prebuilt build/cuda-local --before LIB`), through
# llama-cpp-python's LLAMA_CPP_LIB_PATH: a lib dir of that libllama beside links to the carried
# ggml libraries; "same" sets a variable nothing reads: the series with the patch, timed beside it (the
# clover stage's context is larger than the sweep's).
#
#   bash bench/device/session.sh 1   # 8 layers: upstream's step, the passes and loop simulations,
#                                    # same and before, then one fused pass under Nsight Compute
#   bash bench/device/session.sh 2   # the real 40-layer shapes: upstream's step, the passes and
#                                    # loop simulations, before timed the same way (SWEEP_FULL)
set -u
call=${1:?which call: 1 or 2}
WORK=${WORK:-/tmp/clover-dev}
[ -f .devcarry/before/libllama.so.0.5.0 ] || { echo "no .devcarry/before/libllama.so.0.5.0: prepare.py --before LIB" >&2; exit 2; }
mkdir -p "$WORK/before-lib"
cp .devcarry/before/libllama.so.0.5.0 "$WORK/before-lib/"
( cd "$WORK/before-lib" && ln -sf libllama.so.0.5.0 libllama.so.0 && ln -sf libllama.so.0 libllama.so &&
  for f in libggml-base libggml-cpu libggml-cuda libggml-rpc libggml; do
    ln -sf "$WORK/site/llama_cpp/lib/$f.so.0" . && ln -sf "$f.so.0" "$f.so"
  done )
export QUANTS=q4_k_m GEN_LAYERS=8
SWEEP="same:CLOVER_SWEEP_SAME=1 before:LLAMA_CPP_LIB_PATH=$WORK/before-lib"
case $call in
  1) LAYERS=8 STAGES=build,gen,convert,baseline,clover,sweep,profile SWEEP="$SWEEP" PROFILE_PASSES="fused" \
     BUDGET_S=550 bash bench/device/run.sh ;;
  2) LAYERS=40 STAGES=build,gen,convert,baseline,clover,sweep SWEEP="before:LLAMA_CPP_LIB_PATH=$WORK/before-lib" \
     SWEEP_FULL=1 BUDGET_S=550 bash bench/device/run.sh ;;
  *) echo "call 1 or 2" >&2; exit 2 ;;
esac
rc=$?
OUT=${OUT:-/tmp/clover-out}
cp "$OUT/ops/kernels.json" "$OUT/" 2>/dev/null
( cd "$OUT" && tar czf all.tgz --exclude=all.tgz --exclude=result.json --exclude=run.log --exclude=kernels.json . 2>/dev/null \
    && find . -mindepth 1 ! -name all.tgz ! -name result.json ! -name run.log ! -name kernels.json -delete )
exit $rc
