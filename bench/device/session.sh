#!/usr/bin/env bash
# The H200 session of issue 12 as it last ran (2026-12-04: an experimental patch 0106, MMQ's stream-k
# fix-up inside the matmul kernel, measured slower and not in the series: commit a85fde3 has it under
# bench/device/experiments/; apply it to build/llama-dev's tree before build_cuda_here.sh to run this
# again) as two calls, each under the device tool's 10 minutes, with the CUDA libraries built here
# (prepare.py --prebuilt): a cold machine needs no build. Everything lands in $WORK
# (/tmp/clover-dev); a later call on the still-warm machine reuses it. What comes back is
# $OUT/result.json, $OUT/run.log, $OUT/kernels.json and $OUT/all.tgz (the rest: op logs, stderr,
# notes), since the tool returns at most 8 files.
#
# "fixupkernel" is the same build with GGML_CUDA_MMQ_FIXUP_KERNEL=1 (0106's switch): the fix-up as the
# kernel of its own it is in the series, timed in the same call by the sweep stage (call 2 with
# SWEEP_FULL: as the clover stage times, loop simulations included).
#
#   bash bench/device/session.sh 1   # 8 layers: test-backend-ops of every MMQ case of 17 columns or
#                                    # more against the CPU (Q4_K, Q6_K; upstream's cases and ours),
#                                    # per-op times both ways, the logits of 32- and 64-row batches
#                                    # both ways (bench/device/same_logits.py), upstream's step, the
#                                    # passes both ways
#   bash bench/device/session.sh 2   # the real 40-layer shapes: upstream's step, the passes and
#                                    # loop simulations both ways
set -u
call=${1:?which call: 1 or 2}
WORK=${WORK:-/tmp/clover-dev}
export QUANTS=q4_k_m GEN_LAYERS=8 SWEEP="fixupkernel:GGML_CUDA_MMQ_FIXUP_KERNEL=1"
export MODE_fixupkernel="GGML_CUDA_MMQ_FIXUP_KERNEL=1"
T0=$(date +%s)
OUT=${OUT:-/tmp/clover-out}
case $call in
  1) STAGES=build,gen,convert,ops LAYERS=8 OPS_STAGES=eval,perf EVAL_WIDE=0 \
     EVAL_OPS=MUL_MAT_ID_SMALL,MUL_MAT_SMALL,MUL_MAT,MUL_MAT_ID \
     EVAL_FILTER='type_a=(q4_K|q6_K),.*,n=(1[7-9]|[2-9][0-9]|[1-9][0-9][0-9]+),' \
     MODES="default fixupkernel" PERF_S=45 PERF_FILTER='type_a=(q4_K|q6_K),.*,n=(24|32|64),' \
     BUDGET_S=400 bash bench/device/run.sh
     # bit-identical logits with the fix-up kernel; the narrow kernel off must differ (the check can fail)
     ( export PYTHONPATH="$WORK/site:$WORK/pure" LD_LIBRARY_PATH="$(find /usr/local /opt -name libcublas.so.13 -printf '%h:' 2>/dev/null)${LD_LIBRARY_PATH:-}"
       G="$WORK/clover-8-q4_k_m.gguf"
       timeout 90 python3 bench/device/same_logits.py "$G" GGML_CUDA_MMQ_FIXUP_KERNEL=1
       timeout 60 python3 bench/device/same_logits.py "$G" GGML_CUDA_MMQ_NARROW=0 --rows 32 ) > "$OUT/same-logits.txt" 2>&1
     cat "$OUT/same-logits.txt"
     STAGES=build,baseline,clover,sweep LAYERS=8 BUDGET_S=$(( 560 - $(date +%s) + T0 )) bash bench/device/run.sh ;;
  2) LAYERS=40 STAGES=build,gen,convert,baseline,clover,sweep SWEEP_FULL=1 BUDGET_S=550 bash bench/device/run.sh ;;
  *) echo "call 1 or 2" >&2; exit 2 ;;
esac
rc=$?
cp "$OUT/ops/kernels.json" "$OUT/" 2>/dev/null
( cd "$OUT" && tar czf all.tgz --exclude=all.tgz --exclude=result.json --exclude=run.log --exclude=kernels.json . 2>/dev/null \
    && find . -mindepth 1 ! -name all.tgz ! -name result.json ! -name run.log ! -name kernels.json -delete )
exit $rc
