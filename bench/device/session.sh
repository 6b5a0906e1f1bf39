#!/usr/bin/env bash
# The H200 session of issues 11, 12, 15 and 20 as three calls on one warm machine (each under the
# device tool's 10 minutes; the machine stays warm 30 s between calls, so issue them back to back).
# Everything lands in $WORK (/tmp/clover-dev) and a later call reuses it; what comes back is
# $OUT/result.json, $OUT/run.log and $OUT/all.tgz (the rest: ops logs, stderr, notes), since the
# tool returns at most 8 files.
#
#   bash bench/device/session.sh 1   # build, 8-layer checkpoint + Q4_K_M, baseline and clover timings (4, 8 layers)
#   bash bench/device/session.sh 2   # dense MMVQ column limit 8 / 32 / 64 against 0102's default (8 layers), clover
#                                    # verify parity on CPU and GPU, profile
#   bash bench/device/session.sh 3   # test-backend-ops checks and op timings, upstream's kernels (legacy), experts
#                                    # on the CPU (--cpu-moe)
set -u
call=${1:?which call: 1, 2 or 3}
export QUANTS=q4_k_m
case $call in
  1) STAGES=build,gen,convert,baseline,clover LAYERS="4 8" BUDGET_S=555 bash bench/device/run.sh ;;
  2) STAGES=build,sweep,parity,profile LAYERS="4 8" BUDGET_S=545 SWEEP_LAYERS=8 \
     SWEEP="cols8:GGML_CUDA_MMVQ_MAX_COLS=8 cols32:GGML_CUDA_MMVQ_MAX_COLS=32 cols64:GGML_CUDA_MMVQ_MAX_COLS=64" \
     PROFILE_PASSES="preview fused" bash bench/device/run.sh ;;
  3) STAGES=build,ops,sweep,cpumoe LAYERS=8 BUDGET_S=545 SWEEP="legacy:GGML_CUDA_CLOVER_LEGACY=1" bash bench/device/run.sh ;;
  *) echo "call 1, 2 or 3" >&2; exit 2 ;;
esac
rc=$?
OUT=${OUT:-/tmp/clover-out}
( cd "$OUT" && tar czf all.tgz --exclude=all.tgz --exclude=result.json --exclude=run.log . 2>/dev/null \
    && find . -mindepth 1 ! -name all.tgz ! -name result.json ! -name run.log -delete )
exit $rc
