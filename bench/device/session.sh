#!/usr/bin/env bash
# The H200 session of issue 12's narrow kernel (patch 0105) as calls, each under the device tool's 10
# minutes, with the CUDA libraries built here (prepare.py --prebuilt): a cold machine needs no build.
# Everything lands in $WORK (/tmp/clover-dev) and a later call on the still-warm machine reuses it;
# what comes back is $OUT/result.json, $OUT/run.log, $OUT/kernels.json and $OUT/all.tgz (the rest:
# op logs, stderr, notes), since the tool returns at most 8 files.
#
#   bash bench/device/session.sh 1   # 4 layers: test-backend-ops of the narrow kernel against the CPU, per-op
#                                    # times with it and without (nonarrow), the engine's passes both ways,
#                                    # Nsight kernel times of a preview and a fused pass
#   bash bench/device/session.sh 2   # the real 40-layer shapes (from an 8-layer checkpoint) and 8 layers against
#                                    # upstream's step: passes, the labelled simulations, the loops, and the
#                                    # 40-layer passes without the narrow kernel
set -u
call=${1:?which call: 1 or 2}
export QUANTS=q4_k_m SWEEP="nonarrow:GGML_CUDA_MMQ_NARROW=0"
case $call in
  1) STAGES=build,gen,convert,ops,clover,sweep,profile LAYERS=4 OPS_STAGES=eval,perf MODES="${MODES:-nonarrow default}" \
     EVAL_FILTER="type_a=(q4_K|q5_K|q6_K|q8_0)" PERF_FILTER="type_a=q6_K|n_mats" PERF_S=90 \
     PROFILE_PASSES="preview fused" BUDGET_S=540 bash bench/device/run.sh ;;
  2) STAGES=build,gen,convert,baseline,clover,loops,sweep LAYERS="8 40" GEN_LAYERS=8 SWEEP_LAYERS=40 \
     BUDGET_S=550 bash bench/device/run.sh ;;
  *) echo "call 1 or 2" >&2; exit 2 ;;
esac
rc=$?
OUT=${OUT:-/tmp/clover-out}
cp "$OUT/ops/kernels.json" "$OUT/" 2>/dev/null
( cd "$OUT" && tar czf all.tgz --exclude=all.tgz --exclude=result.json --exclude=run.log --exclude=kernels.json . 2>/dev/null \
    && find . -mindepth 1 ! -name all.tgz ! -name result.json ! -name run.log ! -name kernels.json -delete )
exit $rc
