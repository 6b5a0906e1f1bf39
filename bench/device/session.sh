#!/usr/bin/env bash
# The H200 session of issue 12 as it last ran (2026-12-04 13:26-13:59 UTC: patch 0109, the narrow
# kernel's activations staged a warp per column; 0110, its int8 variant of the K-quants summing in
# integers per step over activations scaled per 256 values; 0111, the experts' gate, up and GLU in
# one launch; docs/performance.md of that date) as calls on one machine, each under the device
# tool's 10 minutes, with the CUDA libraries built here (prepare.py --prebuilt): a cold machine needs
# no build. Everything lands in $WORK (/tmp/clover-dev); a later call on the still-warm machine
# reuses it. What comes back is $OUT/result.json, $OUT/run.log, $OUT/kernels.json and $OUT/all.tgz
# (the rest: op logs, stderr, notes), since the tool returns at most 8 files.
#
# Calls 1-2 ran a build of the series up to 0110 plus the experiment patch
# bench/device/experiments/0112-EXPERIMENT-narrow-MMQ-0108-s-staging-loop.patch (in the repository
# at commit ede9305 only; it applies on 0110, not on 0111): "oldst" is its switch
# GGML_CUDA_MMQ_NARROW_OLD_STAGING=1, 0108's staging loop (the series before 0109); "q8k0" is
# GGML_CUDA_MMQ_NARROW_Q8K=0 (the int8 variant without 0110); "before" is both, the series before
# this session; "i8" is GGML_CUDA_MMQ_NARROW_F16=0, the int8 variant wherever the narrow kernel runs
# (its check against the CPU on every type and shape of the test cases). Calls 3-4 ran the series
# through 0111 without the experiment: "glu0" is GGML_CUDA_MMQ_NARROW_GLU=0 (without 0111).
#
#   bash bench/device/session.sh 1   # 8 layers: test-backend-ops of MUL_MAT_ID_SMALL(_GLU) and
#                                    # MUL_MAT_SMALL against the CPU (default and i8); per-op times
#                                    # in every mode; upstream's step; the passes before and after
#   bash bench/device/session.sh 2   # the real 40-layer shapes: upstream's step, the passes and
#                                    # loop simulations; the passes before, with 0109 alone, and the
#                                    # series and before again
#   bash bench/device/session.sh 3   # 0111: test-backend-ops of the expert ops (default and i8),
#                                    # per op with and without the fusion (did not fit: the checks
#                                    # took 154 s a mode), the 8-layer passes
#   bash bench/device/session.sh 4   # 0111 at 40 layers: the passes without and with it, A, B, A, B
set -u
call=${1:?which call: 1, 2, 3 or 4}
WORK=${WORK:-/tmp/clover-dev}
export QUANTS=q4_k_m GEN_LAYERS=8
BEFORE="GGML_CUDA_MMQ_NARROW_Q8K=0,GGML_CUDA_MMQ_NARROW_OLD_STAGING=1"
export MODE_q8k0="GGML_CUDA_MMQ_NARROW_Q8K=0" MODE_oldst="GGML_CUDA_MMQ_NARROW_OLD_STAGING=1"
export MODE_before="${BEFORE/,/ }" MODE_i8="GGML_CUDA_MMQ_NARROW_F16=0"
T0=$(date +%s)
OUT=${OUT:-/tmp/clover-out}
case $call in
  1) STAGES=build,gen,convert,ops LAYERS=8 OPS_STAGES=eval,perf EVAL_WIDE=0 \
     EVAL_OPS=MUL_MAT_ID_SMALL,MUL_MAT_ID_SMALL_GLU,MUL_MAT_SMALL EVAL_MODES="default i8" \
     EVAL_FILTER='type_a=(q4_K|q5_K|q6_K|q8_0),' MODES="before oldst q8k0 default" PERF_S=20 \
     PERF_FILTER='type_a=(q4_K|q6_K|q8_0),type_b=f32,(n_mats=256,.*n=(16|32)|m=[0-9]+,n=16),' \
     BUDGET_S=430 bash bench/device/run.sh
     SWEEP="before:$BEFORE" LAYERS=8 STAGES=build,baseline,clover,sweep \
       BUDGET_S=$(( 565 - $(date +%s) + T0 )) bash bench/device/run.sh ;;
  2) # 40 layers: upstream's step, the series with its loop simulations, then before, 0109 alone,
     # the series and before again (A, B): the passes
     SWEEP="before:$BEFORE q8k0:GGML_CUDA_MMQ_NARROW_Q8K=0 b:CLOVER_SWEEP_REPEAT=2 beforeb:$BEFORE,CLOVER_SWEEP_REPEAT=2" \
       LAYERS=40 STAGES=build,gen,convert,baseline,clover,sweep BUDGET_S=570 bash bench/device/run.sh ;;
  3) # patch 0111 (the experts' gate, up and GLU in one launch; the build without the experiment):
     # test-backend-ops of the expert ops against the CPU (default and i8), per op with the fusion
     # off ("glu0") and on, the 8-layer passes A, B (A, B again did not fit)
     export MODE_glu0="GGML_CUDA_MMQ_NARROW_GLU=0"
     STAGES=build,gen,convert,ops LAYERS=8 OPS_STAGES=eval,perf EVAL_WIDE=0 \
     EVAL_OPS=MUL_MAT_ID_SMALL,MUL_MAT_ID_SMALL_GLU EVAL_MODES="default i8" \
     EVAL_FILTER='type_a=(q4_K|q5_K|q6_K|q8_0),|type=(q4_K|q6_K|q8_0),' MODES="glu0 default" PERF_S=20 \
     PERF_FILTER='type_a=(q4_K|q6_K),type_b=f32,n_mats=256,.*n=(16|32),|glu_op=SWIGLU,m=(16|32),n=512,k=2048,use_id=1' \
     BUDGET_S=380 bash bench/device/run.sh
     SWEEP="glu0:GGML_CUDA_MMQ_NARROW_GLU=0 b:CLOVER_SWEEP_REPEAT=2 glu0b:GGML_CUDA_MMQ_NARROW_GLU=0,CLOVER_SWEEP_REPEAT=2" \
       LAYERS=8 STAGES=build,baseline,clover,sweep BUDGET_S=$(( 565 - $(date +%s) + T0 )) bash bench/device/run.sh ;;
  4) # 40 layers (the 8-layer file of call 3 still on the machine): without 0111 and with it, A, B, A, B
     SWEEP="glu0:GGML_CUDA_MMQ_NARROW_GLU=0 a:CLOVER_SWEEP_REPEAT=1 glu0b:GGML_CUDA_MMQ_NARROW_GLU=0,CLOVER_SWEEP_REPEAT=2
            b:CLOVER_SWEEP_REPEAT=2" LAYERS=40 STAGES=build,gen,convert,sweep BUDGET_S=320 bash bench/device/run.sh ;;
  *) echo "call 1, 2, 3 or 4" >&2; exit 2 ;;
esac
rc=$?
cp "$OUT/ops/kernels.json" "$OUT/" 2>/dev/null
# (the archive written beside $OUT, then moved in: a tar of a folder it writes into exits 1)
( cd "$OUT" && tar czf "$OUT.all.tgz" --exclude=all.tgz --exclude=result.json --exclude=run.log --exclude=kernels.json . \
    && mv "$OUT.all.tgz" all.tgz && find . -mindepth 1 -type f ! -name all.tgz ! -name result.json ! -name run.log ! -name kernels.json -delete \
    && find . -mindepth 1 -type d -empty -delete )
exit $rc
