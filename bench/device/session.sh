#!/usr/bin/env bash
# The H200 session of issue 12 as it last ran (2026-12-04 08:00-08:30 UTC: patch 0106, MMVQ's column
# chunks up to 64 columns for matrices of fewer than 1024 rows; docs/performance.md of that date) as
# two calls on one machine, each under the device tool's 10 minutes, with the CUDA libraries built
# here (prepare.py --prebuilt): a cold machine needs no build. Everything lands in $WORK
# (/tmp/clover-dev); the second call, on the still-warm machine, reuses it. What comes back is
# $OUT/result.json, $OUT/run.log, $OUT/kernels.json and $OUT/all.tgz (the rest: op logs, stderr,
# notes), since the tool returns at most 8 files.
#
# "mvq16" is the same build with GGML_CUDA_MMVQ_MAX_COLS=16: 0106's limit back to 0102's 16 columns
# for every size, i.e. the series before 0106. (A first call that day timed two experiments from
# builds of their own, recorded in performance.md and not in the series: MMQ's small-block table at
# 24-32 columns as 256-thread, 128-row blocks at two per SM, and the chunks gated by bytes.)
#
#   bash bench/device/session.sh 1   # the real 40-layer shapes: test-backend-ops of MUL_MAT_SMALL
#                                    # against the CPU, per-op times both ways, upstream's step, the
#                                    # passes and loop simulations both ways
#   bash bench/device/session.sh 2   # (warm) the passes and simulations again, both ways, the
#                                    # series before 0106 first
#   bash bench/device/session.sh 3   # (cold, the libraries built from the series as it landed)
#                                    # 8 layers: test-backend-ops of MUL_MAT_SMALL and of upstream's
#                                    # MUL_MAT cases of 9-64 columns against the CPU, the passes
#                                    # both ways
set -u
call=${1:?which call: 1, 2 or 3}
WORK=${WORK:-/tmp/clover-dev}
export QUANTS=q4_k_m GEN_LAYERS=8 LAYERS=40 SWEEP_FULL=1
export MODE_mvq16="GGML_CUDA_MMVQ_MAX_COLS=16"
T0=$(date +%s)
OUT=${OUT:-/tmp/clover-out}
case $call in
  1) STAGES=build,gen,convert,ops OPS_STAGES=eval,perf EVAL_WIDE=0 EVAL_OPS=MUL_MAT_SMALL EVAL_MODES=default \
     MODES="mvq16 default" PERF_S=25 PERF_FILTER='type_a=(q4_K|q6_K),.*,m=512,n=(16|24|32|64),' \
     BUDGET_S=330 bash bench/device/run.sh
     SWEEP="mvq16:GGML_CUDA_MMVQ_MAX_COLS=16" STAGES=build,baseline,clover,sweep \
       BUDGET_S=$(( 560 - $(date +%s) + T0 )) bash bench/device/run.sh ;;
  2) # "again" is the series as it is (a variable nothing reads, for a tag of its own)
     SWEEP="mvq16b:GGML_CUDA_MMVQ_MAX_COLS=16 again:CLOVER_SWEEP_REPEAT=1" STAGES=build,sweep BUDGET_S=330 \
       bash bench/device/run.sh ;;
  3) STAGES=build,gen,convert,ops LAYERS=8 OPS_STAGES=eval EVAL_WIDE=0 EVAL_OPS=MUL_MAT_SMALL,MUL_MAT \
     EVAL_MODES="default mvq16" EVAL_FILTER='type_a=(q4_0|q4_1|q5_0|q5_1|q8_0|q4_K|q5_K|q6_K),.*,n=(9|[1-5][0-9]|6[0-4]),' \
     BUDGET_S=250 bash bench/device/run.sh
     SWEEP="mvq16:GGML_CUDA_MMVQ_MAX_COLS=16" LAYERS=8 SWEEP_FULL="" STAGES=build,clover,sweep \
       BUDGET_S=$(( 400 - $(date +%s) + T0 )) bash bench/device/run.sh ;;
  *) echo "call 1, 2 or 3" >&2; exit 2 ;;
esac
rc=$?
cp "$OUT/ops/kernels.json" "$OUT/" 2>/dev/null
( cd "$OUT" && tar czf all.tgz --exclude=all.tgz --exclude=result.json --exclude=run.log --exclude=kernels.json . 2>/dev/null \
    && find . -mindepth 1 -type f ! -name all.tgz ! -name result.json ! -name run.log ! -name kernels.json -delete \
    && find . -mindepth 1 -type d -empty -delete )
exit $rc
