#!/usr/bin/env bash
# The H200 session of issue 12 as it last ran (2026-12-04: patch 0105 as it lands) as three calls,
# each under the device tool's 10 minutes, with the CUDA libraries built here (prepare.py --prebuilt):
# a cold machine needs no build. Everything lands in $WORK (/tmp/clover-dev) and a later call on the
# still-warm machine reuses it (what a call finds done it keeps); what comes back is $OUT/result.json,
# $OUT/run.log, $OUT/kernels.json and $OUT/all.tgz (the rest: op logs, stderr, notes; the Nsight
# summary is in result.json, the ncu CSVs stay in $WORK),
# since the tool returns at most 8 files.
#
#   bash bench/device/session.sh 1   # test-backend-ops against the CPU of the paths as they run by
#                                    # default and with halves everywhere at 2-64 columns (h16x); the
#                                    # expert ops' times with and without the narrow kernel; 8 layers
#                                    # against upstream's step, with the loop simulations
#   bash bench/device/session.sh 2   # the real 40-layer shapes (from the 8-layer checkpoint) against
#                                    # upstream's step, then where an 8-layer pass's GPU time goes
#                                    # (Nsight Compute, one pass of each kind)
#   bash bench/device/session.sh 3   # the passes again at 8 and 40 layers in one call: as they run
#                                    # (same), without the narrow kernel, and with MMQ's stream-k
#                                    # run as one block per tile (patch 0104 at 0, no fix-up)
set -u
call=${1:?which call: 1, 2 or 3}
export QUANTS=q4_k_m LAYERS="8 40" GEN_LAYERS=8
case $call in
  1) export MODE_h16x="GGML_CUDA_MMQ_NARROW_F16=2 GGML_CUDA_MMQ_NARROW_MIN=2 GGML_CUDA_MMQ_NARROW_DENSE_MAX=64 GGML_CUDA_MMQ_NARROW_ID_MAX=64 GGML_CUDA_MMQ_NARROW_DENSE_MIN_ROWS=0"
     STAGES=build,gen,convert,ops,baseline,clover OPS_STAGES=eval,perf EVAL_MODES="default h16x" EVAL_WIDE=0 \
     EVAL_FILTER="type_a=(q4_K|q5_K|q6_K|q8_0)" MODES="nonarrow default" PERF_FILTER="n_mats" PERF_S=40 \
     BUDGET_S=550 bash bench/device/run.sh ;;
  2) STAGES=build,baseline,clover,profile PROFILE_PASSES="raw-ar preview commit fused" BUDGET_S=540 bash bench/device/run.sh ;;
  3) # "same" sets a variable nothing reads: the landed defaults, timed in this call beside the others
     STAGES=build,gen,convert,sweep SWEEP_LAYERS="8 40" \
     SWEEP="same:CLOVER_SWEEP_SAME=1 nonarrow:GGML_CUDA_MMQ_NARROW=0 tiles:GGML_CUDA_MMQ_TILES_MIN_EFFICIENCY=0" \
     BUDGET_S=540 bash bench/device/run.sh ;;
  *) echo "call 1, 2 or 3" >&2; exit 2 ;;
esac
rc=$?
OUT=${OUT:-/tmp/clover-out}
cp "$OUT/ops/kernels.json" "$OUT/" 2>/dev/null
( cd "$OUT" && tar czf all.tgz --exclude=all.tgz --exclude=result.json --exclude=run.log --exclude=kernels.json . 2>/dev/null \
    && find . -mindepth 1 ! -name all.tgz ! -name result.json ! -name run.log ! -name kernels.json -delete )
exit $rc
