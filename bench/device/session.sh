#!/usr/bin/env bash
# The H200 session of issue 12 as it last ran (2026-12-04 11:41-12:07 UTC: patch 0107, the narrow
# kernel's K split of MUL_MAT_ID picked on the device, and 0108, its Q6_K / Q8_0 loads behind one
# alignment branch per block; docs/performance.md of that date) as calls on one machine, each under
# the device tool's 10 minutes, with the CUDA libraries built here (prepare.py --prebuilt): a cold
# machine needs no build. Everything lands in $WORK (/tmp/clover-dev); a later call on the
# still-warm machine reuses it. What comes back is $OUT/result.json, $OUT/run.log,
# $OUT/kernels.json and $OUT/all.tgz (the rest: op logs, stderr, notes), since the tool returns at
# most 8 files.
#
# One build times before and after: "kwfix" is GGML_CUDA_MMQ_NARROW_KW=-1 (0105's fixed K split,
# the series before 0107); "oldl" is GGML_CUDA_MMQ_NARROW_OLD_LOADS=1, a switch of the experiment
# patch bench/device/experiments/0109-EXPERIMENT-narrow-MMQ-0105-s-Q6_K-Q8_0-loads.patch (in the
# repository at commit 7275970; copied into patches/ for prepare.py and the build of
# build/cuda-local; not in the series): 0105's loads, the series before 0108; "before" is both, the series before this session; "kw1" one warp per 16
# rows over the whole K everywhere.
#
#   bash bench/device/session.sh 1   # 8 layers: test-backend-ops of MUL_MAT_ID_SMALL(_GLU) and
#                                    # MUL_MAT_SMALL against the CPU (the K split as the kernel picks
#                                    # it); per-op times in every mode; upstream's step; the passes
#                                    # before and after
#   bash bench/device/session.sh 2   # the passes again A, B, A, B, and with the K split aiming
#                                    # at 132 units (one per SM) instead of 264 ("u132"); test-backend-ops
#                                    # with the K split forced to 1 (every op on the direct write of the sums)
#   bash bench/device/session.sh 3   # the real 40-layer shapes: upstream's step, the passes
#                                    # and loop simulations before and after
#   bash bench/device/session.sh 4   # the K split aiming at 132 units against 264: per op, and the
#                                    # 40-layer passes A, B, A, B
#   bash bench/device/session.sh 5   # the landed series: Nsight's source page of the narrow kernel,
#                                    # three expert cases (stalls.sh SOURCE=...)
set -u
call=${1:?which call: 1, 2, 3, 4 or 5}
WORK=${WORK:-/tmp/clover-dev}
export QUANTS=q4_k_m GEN_LAYERS=8
BEFORE="GGML_CUDA_MMQ_NARROW_KW=-1,GGML_CUDA_MMQ_NARROW_OLD_LOADS=1"
export MODE_kwfix="GGML_CUDA_MMQ_NARROW_KW=-1" MODE_oldl="GGML_CUDA_MMQ_NARROW_OLD_LOADS=1"
export MODE_before="${BEFORE/,/ }" MODE_kw1="GGML_CUDA_MMQ_NARROW_KW=1"
T0=$(date +%s)
OUT=${OUT:-/tmp/clover-out}
case $call in
  1) STAGES=build,gen,convert,ops LAYERS=8 OPS_STAGES=eval,perf EVAL_WIDE=0 \
     EVAL_OPS=MUL_MAT_ID_SMALL,MUL_MAT_ID_SMALL_GLU,MUL_MAT_SMALL EVAL_MODES=default \
     EVAL_FILTER='type_a=(q4_K|q5_K|q6_K|q8_0),' MODES="before kwfix oldl default kw1" PERF_S=25 \
     PERF_FILTER='type_a=(q4_K|q6_K|q8_0),type_b=f32,(n_mats=256,.*n=(16|32)|m=[0-9]+,n=16),' \
     BUDGET_S=430 bash bench/device/run.sh
     SWEEP="before:$BEFORE" LAYERS=8 STAGES=build,baseline,clover,sweep \
       BUDGET_S=$(( 565 - $(date +%s) + T0 )) bash bench/device/run.sh ;;
  2) SWEEP="a:CLOVER_SWEEP_REPEAT=1 beforeb:$BEFORE,CLOVER_SWEEP_REPEAT=2 b:CLOVER_SWEEP_REPEAT=2
            u132:GGML_CUDA_MMQ_NARROW_ID_UNITS=132 kwfix:GGML_CUDA_MMQ_NARROW_KW=-1 oldl:GGML_CUDA_MMQ_NARROW_OLD_LOADS=1
            u132b:GGML_CUDA_MMQ_NARROW_ID_UNITS=132,CLOVER_SWEEP_REPEAT=2" \
       LAYERS=8 STAGES=build,gen,convert,sweep BUDGET_S=390 bash bench/device/run.sh
     STAGES=build,ops OPS_STAGES=eval EVAL_WIDE=0 EVAL_OPS=MUL_MAT_ID_SMALL,MUL_MAT_ID_SMALL_GLU EVAL_MODES=kw1 \
       EVAL_FILTER='type_a=(q4_K|q5_K|q6_K|q8_0),' BUDGET_S=$(( 565 - $(date +%s) + T0 )) bash bench/device/run.sh ;;
  3) SWEEP="before:$BEFORE" LAYERS=40 SWEEP_FULL=1 STAGES=build,gen,convert,baseline,clover,sweep BUDGET_S=560 \
       bash bench/device/run.sh ;;
  4) # the units the K split aims at: 132 (one per SM) against the default 264 (two per SM), per op
     # with the split forced to 2 and 4 beside them, and the 40-layer passes A, B, A, B
     export MODE_u132="GGML_CUDA_MMQ_NARROW_ID_UNITS=132" MODE_kw2="GGML_CUDA_MMQ_NARROW_KW=2"
     STAGES=build,gen,convert,ops LAYERS=8 OPS_STAGES=perf MODES="kwfix kw2 u132 default" PERF_S=18 \
       PERF_FILTER='type_a=(q4_K|q6_K),type_b=f32,n_mats=256,.*n=(16|32),' BUDGET_S=250 bash bench/device/run.sh
     SWEEP="u132:GGML_CUDA_MMQ_NARROW_ID_UNITS=132 a:CLOVER_SWEEP_REPEAT=1
            u132b:GGML_CUDA_MMQ_NARROW_ID_UNITS=132,CLOVER_SWEEP_REPEAT=2 b:CLOVER_SWEEP_REPEAT=2" \
       LAYERS=40 STAGES=build,sweep BUDGET_S=$(( 540 - $(date +%s) + T0 )) bash bench/device/run.sh ;;
  5) # (the landed series, no experiment) Nsight Compute's source page of the narrow kernel: the
     # gate at 32 tokens over 256 experts (a K split of 1 now) and on a coreset of 8 (8), the Q6_K down
     SOURCE=mul_mat_q_narrow CASES="
experts-q4k-256|-|MUL_MAT_ID_SMALL|type_a=q4_K,type_b=f32,n_mats=256,n_used=8,b=1,m=512,n=32,k=2048,.*n_active=256\$
experts-q4k-8|-|MUL_MAT_ID_SMALL|type_a=q4_K,type_b=f32,n_mats=256,n_used=8,b=1,m=512,n=32,k=2048,.*n_active=8\$
experts-q6k-256|-|MUL_MAT_ID_SMALL|type_a=q6_K,type_b=f32,n_mats=256,n_used=8,b=0,m=2048,n=32,k=512,.*n_active=256\$
" bash bench/device/stalls.sh ;;
  *) echo "call 1, 2, 3, 4 or 5" >&2; exit 2 ;;
esac
rc=$?
cp "$OUT/ops/kernels.json" "$OUT/" 2>/dev/null
# (the archive written beside $OUT, then moved in: a tar of a folder it writes into exits 1)
( cd "$OUT" && tar czf "$OUT.all.tgz" --exclude=all.tgz --exclude=result.json --exclude=run.log --exclude=kernels.json . \
    && mv "$OUT.all.tgz" all.tgz && find . -mindepth 1 -type f ! -name all.tgz ! -name result.json ! -name run.log ! -name kernels.json -delete \
    && find . -mindepth 1 -type d -empty -delete )
exit $rc
