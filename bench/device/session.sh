#!/usr/bin/env bash
# The H200 session of issue 12 as it last ran (2026-12-04 10:06-10:35 UTC: the narrow kernel of patch
# 0105 with the next step's weights loaded during this one, for dense matmuls of up to 64 columns with
# the activations staged once wherever they fit, and for experts in column chunks; where its
# instructions go; docs/performance.md of that date) as calls on one machine,
# each under the device tool's 10 minutes, with the CUDA libraries built here (prepare.py
# --prebuilt): a cold machine needs no build. Everything lands in $WORK (/tmp/clover-dev); a second
# call on the still-warm machine reuses it. What comes back is $OUT/result.json, $OUT/run.log,
# $OUT/kernels.json and $OUT/all.tgz (the rest: op logs, stderr, notes), since the tool returns at
# most 8 files.
#
# The switches below exist only with the experiment patch
# bench/device/experiments/0107-CUDA-narrow-kernel-the-next-step-s-weights-in-regist.patch (in the
# repository's history at commit 9840ef2): it was copied into patches/ for prepare.py and for the
# build of build/cuda-local. Everything it tried lost or tied, so the series does not have it.
#
# One build times every variant through GGML_CUDA_MMQ_NARROW_DENSE_V (0: the kernel as landed in
# 0105, 2: the activations staged once where they fit, 1 (default): that and the second step in
# registers) and GGML_CUDA_MMQ_NARROW_DENSE_MAX (16 as landed: MMQ above; 32 or 64: the narrow
# kernel up to there); GGML_CUDA_MMQ_NARROW_ID_DBUF=1 loads the second step during the first in its
# MUL_MAT_ID too ("iddb"; "id64db" with the narrow kernel up to 64 tokens). "old" is the series as
# it landed.
#
#   bash bench/device/session.sh 1   # 8 layers: test-backend-ops of MUL_MAT_SMALL, MUL_MAT_ID_SMALL and
#                                    # upstream's MUL_MAT of 9-64 columns against the CPU with the narrow
#                                    # kernel on every dense matmul of 9-64 columns (DENSE_MIN_ROWS=16)
#                                    # and ID_DBUF=1; per-op times of the projections in every mode;
#                                    # upstream's step; the passes in every mode
#   bash bench/device/session.sh 2   # Nsight Compute's source page of the narrow kernel (stalls.sh
#                                    # SOURCE=...): three expert cases, two dense ones
#   bash bench/device/session.sh 3   # the experts in 8- and 16-column chunks, the K split forced:
#                                    # test-backend-ops against the CPU, per-op times, 8 layers
#                                    # (as run, the checks took the time of the per-op stage; a last
#                                    # warm call timed the series and 8-column chunks A, B, A, B:
#                                    # SWEEP="a:CLOVER_SWEEP_REPEAT=1 idc8:... b:CLOVER_SWEEP_REPEAT=2
#                                    # idc8b:..." STAGES=build,gen,convert,sweep run.sh)
#   bash bench/device/session.sh 4   # the expert kernel's K split and grid forced, per op
set -u
call=${1:?which call: 1, 2, 3 or 4}
WORK=${WORK:-/tmp/clover-dev}
export QUANTS=q4_k_m GEN_LAYERS=8
export MODE_old="GGML_CUDA_MMQ_NARROW_DENSE_V=0"
export MODE_n64v0="GGML_CUDA_MMQ_NARROW_DENSE_MAX=64 GGML_CUDA_MMQ_NARROW_DENSE_V=0"
export MODE_n64v2="GGML_CUDA_MMQ_NARROW_DENSE_MAX=64 GGML_CUDA_MMQ_NARROW_DENSE_V=2"
export MODE_n64v1="GGML_CUDA_MMQ_NARROW_DENSE_MAX=64 GGML_CUDA_MMQ_NARROW_DENSE_V=1"
export MODE_iddb="GGML_CUDA_MMQ_NARROW_ID_DBUF=1"
export MODE_id64db="GGML_CUDA_MMQ_NARROW_ID_DBUF=1 GGML_CUDA_MMQ_NARROW_ID_MAX=64"
export MODE_e1="$MODE_n64v1 GGML_CUDA_MMQ_NARROW_DENSE_MIN_ROWS=16 $MODE_iddb"
export MODE_kw1="GGML_CUDA_MMQ_NARROW_KW=1" MODE_kw8="GGML_CUDA_MMQ_NARROW_KW=8"
T0=$(date +%s)
OUT=${OUT:-/tmp/clover-out}
case $call in
  1) STAGES=build,gen,convert,ops LAYERS=8 OPS_STAGES=eval,perf EVAL_WIDE=0 EVAL_OPS=MUL_MAT_SMALL,MUL_MAT,MUL_MAT_ID_SMALL \
     EVAL_MODES="e1" EVAL_FILTER='type_a=(q4_K|q5_K|q6_K|q8_0),.*,n=(9|[1-5][0-9]|6[0-4]),' \
     MODES="old n64v0 n64v2 n64v1 default iddb id64db" PERF_S=20 PERF_FILTER='type_a=(q4_K|q6_K),.*,m=(8192|2048|512),n=(16|24|32|64),' \
     BUDGET_S=330 bash bench/device/run.sh
     SWEEP="n64:GGML_CUDA_MMQ_NARROW_DENSE_MAX=64 iddb:GGML_CUDA_MMQ_NARROW_ID_DBUF=1 old:GGML_CUDA_MMQ_NARROW_DENSE_V=0
            n32:GGML_CUDA_MMQ_NARROW_DENSE_MAX=32 n64iddb:GGML_CUDA_MMQ_NARROW_DENSE_MAX=64,GGML_CUDA_MMQ_NARROW_ID_DBUF=1
            id64db:GGML_CUDA_MMQ_NARROW_ID_DBUF=1,GGML_CUDA_MMQ_NARROW_ID_MAX=64" \
       LAYERS=8 STAGES=build,baseline,clover,sweep BUDGET_S=$(( 560 - $(date +%s) + T0 )) bash bench/device/run.sh ;;
  2) # where the narrow kernel's instructions and stalls go, per SASS instruction (Nsight's source page);
     # (run as stalls.sh alone, the tool's limit of 8 files left the experts' pages behind and a second
     # call fetched them; through this script they come back in all.tgz)
     SOURCE=mul_mat_q_narrow CASES="
experts-q4k-256|-|MUL_MAT_ID_SMALL|type_a=q4_K,type_b=f32,n_mats=256,n_used=8,b=1,m=512,n=32,k=2048,.*n_active=256\$
experts-q6k-256|-|MUL_MAT_ID_SMALL|type_a=q6_K,type_b=f32,n_mats=256,n_used=8,b=0,m=2048,n=32,k=512,.*n_active=256\$
experts-q4k-8|-|MUL_MAT_ID_SMALL|type_a=q4_K,type_b=f32,n_mats=256,n_used=8,b=1,m=512,n=32,k=2048,.*n_active=8\$
dense-q6k-8192-n16|-|MUL_MAT_SMALL|type_a=q6_K,.*m=8192,n=16,k=2048,
dense-q6k-8192-n32-narrow|GGML_CUDA_MMQ_NARROW_DENSE_MAX=64|MUL_MAT_SMALL|type_a=q6_K,.*m=8192,n=32,k=2048,
" bash bench/device/stalls.sh ;;
  3) # the experts' columns in chunks of 8 or 16 (halves where they were int8), with and without the
     # second step in registers, and the K split forced: test-backend-ops of the routed experts
     # against the CPU, per-op times, the passes at 8 layers
     export MODE_idc8="GGML_CUDA_MMQ_NARROW_ID_COLS=8" MODE_idc16="GGML_CUDA_MMQ_NARROW_ID_COLS=16"
     export MODE_idc8db="GGML_CUDA_MMQ_NARROW_ID_COLS=8 GGML_CUDA_MMQ_NARROW_ID_DBUF=1"
     STAGES=build,gen,convert,ops LAYERS=8 OPS_STAGES=eval,perf EVAL_WIDE=0 EVAL_OPS=MUL_MAT_ID_SMALL,MUL_MAT_ID_SMALL_GLU \
     EVAL_MODES="idc8db idc16" MODES="default idc8 idc8db idc16 kw1 kw8" PERF_S=20 \
     PERF_FILTER='type_a=(q4_K|q6_K),type_b=f32,n_mats=256,.*n=(16|32|64),' BUDGET_S=300 bash bench/device/run.sh
     SWEEP="idc8:GGML_CUDA_MMQ_NARROW_ID_COLS=8 idc8db:GGML_CUDA_MMQ_NARROW_ID_COLS=8,GGML_CUDA_MMQ_NARROW_ID_DBUF=1
            idc16:GGML_CUDA_MMQ_NARROW_ID_COLS=16 kw1:GGML_CUDA_MMQ_NARROW_KW=1" \
       LAYERS=8 STAGES=build,baseline,clover,sweep BUDGET_S=$(( 560 - $(date +%s) + T0 )) bash bench/device/run.sh ;;
  4) # the narrow kernel's K split and CTAs per row block of MUL_MAT_ID forced (switches of the series),
     # per op only
     export MODE_grid8="GGML_CUDA_MMQ_NARROW_EXPERT_GRID=8" MODE_grid16="GGML_CUDA_MMQ_NARROW_EXPERT_GRID=16"
     export MODE_grid256="GGML_CUDA_MMQ_NARROW_EXPERT_GRID=256"
     STAGES=build,ops OPS_STAGES=perf MODES="default kw1 kw8 grid8 grid16 grid256" PERF_S=18 \
       PERF_FILTER='type_a=(q4_K|q6_K),type_b=f32,n_mats=256,.*n=(16|32),' BUDGET_S=225 bash bench/device/run.sh ;;
  *) echo "call 1, 2, 3 or 4" >&2; exit 2 ;;
esac
rc=$?
cp "$OUT/ops/kernels.json" "$OUT/" 2>/dev/null
( cd "$OUT" && tar czf all.tgz --exclude=all.tgz --exclude=result.json --exclude=run.log --exclude=kernels.json . 2>/dev/null \
    && find . -mindepth 1 -type f ! -name all.tgz ! -name result.json ! -name run.log ! -name kernels.json -delete \
    && find . -mindepth 1 -type d -empty -delete )
exit $rc
