#!/usr/bin/env bash
# The H200 session of issues 11, 12 and 15 as three calls (each under the device tool's 10 minutes; the
# machine stays warm 30 s between calls: a later call on a cold one rebuilds, or takes prepare.py --prebuilt).
# Everything lands in $WORK (/tmp/clover-dev) and a later call reuses it; what comes back is
# $OUT/result.json, $OUT/run.log and $OUT/all.tgz (the rest: ops logs, stderr, notes), since the
# tool returns at most 8 files.
#
#   bash bench/device/session.sh 1   # build, 8-layer checkpoint + Q4_K_M, baseline and clover timings (4, 8 layers),
#                                    # spec_iterations with patch 0401's graph slots on and off
#   bash bench/device/session.sh 2   # 4-layer checkpoint + Q4_K_M, graph_slots (0401 on / off, CUDA graphs on / off),
#                                    # clover verify parity on CPU and GPU: tiny, small, full-width (4 layers)
#   bash bench/device/session.sh 3   # dense MMVQ column limit 8 / 32 / 64 (8 layers), profile, test-backend-ops
#                                    # checks and op timings, experts on the CPU (--cpu-moe)
set -u
call=${1:?which call: 1, 2 or 3}
export QUANTS=q4_k_m
case $call in
  1) STAGES=build,gen,convert,baseline,clover,spec LAYERS="4 8" BUDGET_S=560 bash bench/device/run.sh ;;
  2) STAGES=build,gen,convert,slots,parity LAYERS=4 PARITY_PRESETS=tiny,small,full-width BUDGET_S=570 \
     bash bench/device/run.sh ;;
  3) STAGES=build,gen,convert,sweep,profile,ops,cpumoe LAYERS="4 8" BUDGET_S=545 SWEEP_LAYERS=8 \
     SWEEP="cols8:GGML_CUDA_MMVQ_MAX_COLS=8 cols32:GGML_CUDA_MMVQ_MAX_COLS=32 cols64:GGML_CUDA_MMVQ_MAX_COLS=64" \
     PROFILE_PASSES="preview fused" bash bench/device/run.sh ;;
  *) echo "call 1, 2 or 3" >&2; exit 2 ;;
esac
rc=$?
OUT=${OUT:-/tmp/clover-out}
( cd "$OUT" && tar czf all.tgz --exclude=all.tgz --exclude=result.json --exclude=run.log . 2>/dev/null \
    && find . -mindepth 1 ! -name all.tgz ! -name result.json ! -name run.log -delete )
exit $rc
