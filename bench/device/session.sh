#!/usr/bin/env bash
# The H200 session of issue 12 as it last ran (2026-12-04 15:44-16:15 UTC: the experiment patches
# bench/device/experiments/0112 (a dense gate, up and GLU of full column chunks in one MMVQ launch)
# and 0113 (two measurement switches of the narrow kernel), in the repository at commit 7694e7d
# only, then patch 0112 as it landed; docs/performance.md of that date) as
# calls on one machine, each under the device tool's 10 minutes, with the CUDA libraries built here
# from the series plus both experiments (prepare.py --prebuilt): a cold machine needs no build.
# Everything lands in $WORK (/tmp/clover-dev); a later call on the still-warm machine reuses it.
# What comes back is $OUT/result.json, $OUT/run.log, $OUT/kernels.json and $OUT/all.tgz (the rest:
# op logs, stderr, notes), since the tool returns at most 8 files.
#
# The modes (switches read once per process, all in one build):
#   cg0   GGML_CUDA_MMVQ_CHUNK_GLU=0: without 0112
#   i8d   dense matmuls of 9-64 columns from 1024 rows on the narrow kernel in int8 (0113's
#         GGML_CUDA_MMQ_NARROW_DENSE_F16_MAX=8), i8d32 the same to 32 columns, h64 in halves
#   id64  MUL_MAT_ID of up to 64 tokens on the narrow kernel (its 64-column instances), id64t the
#         same with 0113's GGML_CUDA_MMQ_NARROW_ID_TILE=32 (an expert's columns in tiles of 32)
#   both  i8d32 and id64t
#   chk   every new path at once where the checks reach it: i8d from 16 rows, id64t
#
#   bash bench/device/session.sh 1   # 8-layer file; test-backend-ops against the CPU (chk: dense
#                                    # int8, the experts at 33-64 tokens; default: 0112); per op in
#                                    # each mode
#   bash bench/device/session.sh 2   # the real 40-layer shapes: upstream's step, the series with
#                                    # loop simulations, the passes in each mode
#   bash bench/device/session.sh 3   # the winners again (A, B) and the 8-layer profile
#
# Calls 4-5 ran the series with patch 0112 as it landed (MUL_MAT_ID of 33-64 tokens in column tiles
# of 32: 0113's id64t made the default), no experiment: "id32" is GGML_CUDA_MMQ_NARROW_ID_MAX=32, the
# series before it; "i8all" GGML_CUDA_MMQ_NARROW_F16=0 with dense matmuls to 32 columns (the dense
# Q6_K cases in int8, which call 1 did not reach).
#   bash bench/device/session.sh 4   # 0112's checks against the CPU (the expert ops at 33-64
#                                    # tokens), per op before / after, the dense Q6_K in int8
#   bash bench/device/session.sh 5   # 40 layers: upstream's step, the series with its loop
#                                    # simulations, before / after A, B
#
# Call 6 ran the series plus an experiment patch (in the repository at commit 4fa0445 only, under
# bench/device/experiments/): "dir" is GGML_CUDA_MMQ_NARROW_DIRECT=1, dense matmuls of
# 9-64 columns on the narrow kernel in int8 with their activations read from global memory instead
# of staged in shared memory; no model file, only test-backend-ops.
#   bash bench/device/session.sh 6   # its checks against the CPU (from 16 rows), per op against MMQ
set -u
call=${1:?which call: 1-6}
WORK=${WORK:-/tmp/clover-dev}
export QUANTS=q4_k_m GEN_LAYERS=8
NB=GGML_CUDA_MMQ_NARROW
I8D="${NB}_DENSE_MAX=64,${NB}_DENSE_F16_MAX=8"
I8D32="${NB}_DENSE_MAX=32,${NB}_DENSE_F16_MAX=16"
ID64T="${NB}_ID_MAX=64,${NB}_ID_TILE=32"
export MODE_cg0="GGML_CUDA_MMVQ_CHUNK_GLU=0" MODE_i8d="${I8D//,/ }" MODE_h64="${NB}_DENSE_MAX=64"
export MODE_id64="${NB}_ID_MAX=64" MODE_id64t="${ID64T//,/ }"
export MODE_chk="${I8D//,/ } ${ID64T//,/ } ${NB}_DENSE_MIN_ROWS=16"
T0=$(date +%s)
OUT=${OUT:-/tmp/clover-out}
K4="(q4_K|q5_K|q6_K|q8_0)"
case $call in
  1) # checks: dense 9-64 columns (upstream's MUL_MAT too), the experts and their GLU at 33-64 tokens
     STAGES=build,gen,convert,ops LAYERS=8 OPS_STAGES=eval,perf EVAL_WIDE=0 EVAL_MODES=chk \
     EVAL_OPS=MUL_MAT,MUL_MAT_SMALL,MUL_MAT_ID_SMALL,MUL_MAT_ID_SMALL_GLU \
     EVAL_FILTER="type_a=$K4,type_b=f32,m=[0-9]+,n=(9|[1-5][0-9]|6[0-4]),|type_a=$K4,type_b=f32,n_mats=[0-9]+,n_used=[0-9]+,b=[0-9a-z]+,m=[0-9]+,n=(3[3-9]|[4-6][0-9]),|type=$K4,glu_op=[A-Z]+,m=(3[3-9]|[4-6][0-9]),.*use_id=1" \
     MODES="default cg0 i8d h64 id64 id64t" PERF_S=25 \
     PERF_FILTER='type_a=(q4_K|q6_K),type_b=f32,m=(8192|2048),n=(16|24|32|64),k=(2048|4096),|type=q6_K,glu_op=SWIGLU,m=(16|32),n=512,k=2048,use_id=0|type_a=(q4_K|q6_K),type_b=f32,n_mats=256,n_used=8,b=[0-9a-z]+,m=[0-9]+,n=(32|64),' \
     BUDGET_S=500 bash bench/device/run.sh
     # 0112 against the CPU: the dense gate + up + GLU at its default (the 512-row matrices on MMVQ)
     PREBUILT=1 TBO="$WORK/test-backend-ops" LIBDIR="$WORK/site/llama_cpp/lib" STAGES=eval OUT="$OUT/ops-glu" \
       WORK="$WORK/ops-glu" EVAL_MODES=default EVAL_WIDE=0 EVAL_OPS=MUL_MAT_SMALL_GLU EVAL_FILTER="type=$K4," \
       BUDGET_S=$(( 575 - $(date +%s) + T0 )) bash bench/device/kernels.sh 2>&1 | tail -8 ;;
  2) # 40 layers: upstream's step, the series (0112 on) with its loop simulations, then each mode
     SWEEP="cg0:GGML_CUDA_MMVQ_CHUNK_GLU=0 i8d32:$I8D32 id64t:$ID64T both:$I8D32,$ID64T" \
       LAYERS=40 STAGES=build,gen,convert,baseline,clover,sweep BUDGET_S=570 bash bench/device/run.sh ;;
  3) # the modes again (B runs) at 40 layers, then the 8-layer profile
     SWEEP="b:CLOVER_SWEEP_REPEAT=2 cg0b:GGML_CUDA_MMVQ_CHUNK_GLU=0,CLOVER_SWEEP_REPEAT=2 i8d32b:$I8D32,CLOVER_SWEEP_REPEAT=2
            id64tb:$ID64T,CLOVER_SWEEP_REPEAT=2 bothb:$I8D32,$ID64T,CLOVER_SWEEP_REPEAT=2" LAYERS=40 STAGES=build,gen,convert,sweep BUDGET_S=330 bash bench/device/run.sh
     LAYERS=8 STAGES=build,profile PROFILE_PASSES="raw-ar preview fused" BUDGET_S=$(( 570 - $(date +%s) + T0 )) \
       bash bench/device/run.sh ;;
  4) export MODE_id32="${NB}_ID_MAX=32" MODE_i8all="${NB}_F16=0 ${NB}_DENSE_MAX=32"
     STAGES=build,gen,convert,ops LAYERS=8 OPS_STAGES=eval,perf EVAL_WIDE=0 EVAL_MODES=default \
     EVAL_OPS=MUL_MAT_ID_SMALL,MUL_MAT_ID_SMALL_GLU \
     EVAL_FILTER="type_a=$K4,type_b=f32,n_mats=[0-9]+,n_used=[0-9]+,b=[0-9a-z]+,m=[0-9]+,n=(3[3-9]|[4-6][0-9]),|type=$K4,glu_op=[A-Z]+,m=(3[3-9]|[4-6][0-9]),.*use_id=1" \
     MODES="default id32 i8all" PERF_S=30 \
     PERF_FILTER='type_a=q6_K,type_b=f32,m=(8192|2048),n=(16|24|32|64),k=(2048|4096),|type_a=(q4_K|q6_K),type_b=f32,n_mats=256,n_used=8,b=[0-9a-z]+,m=[0-9]+,n=(32|64),' \
     BUDGET_S=400 bash bench/device/run.sh ;;
  5) SWEEP="id32:${NB}_ID_MAX=32 b:CLOVER_SWEEP_REPEAT=2 id32b:${NB}_ID_MAX=32,CLOVER_SWEEP_REPEAT=2" \
       LAYERS=40 STAGES=build,gen,convert,baseline,clover,sweep,loops BUDGET_S=560 bash bench/device/run.sh ;;
  6) export MODE_dir="${NB}_DIRECT=1 ${NB}_DENSE_MAX=64" MODE_dirchk="${NB}_DIRECT=1 ${NB}_DENSE_MAX=64 ${NB}_DENSE_MIN_ROWS=16"
     STAGES=build,ops OPS_STAGES=eval,perf EVAL_WIDE=0 EVAL_MODES=dirchk EVAL_OPS=MUL_MAT,MUL_MAT_SMALL \
     EVAL_FILTER="type_a=$K4,type_b=f32,m=[0-9]+,n=(9|[1-5][0-9]|6[0-4])," MODES="default dir" PERF_S=20 \
     PERF_FILTER='type_a=(q4_K|q6_K),type_b=f32,m=(8192|2048),n=(16|32|64),k=(2048|4096),' \
     BUDGET_S=200 bash bench/device/run.sh ;;
  *) echo "call 1-6" >&2; exit 2 ;;
esac
rc=$?
cp "$OUT/ops/kernels.json" "$OUT/" 2>/dev/null
# (the archive written beside $OUT, then moved in: a tar of a folder it writes into exits 1)
( cd "$OUT" && tar czf "$OUT.all.tgz" --exclude=all.tgz --exclude=result.json --exclude=run.log --exclude=kernels.json . \
    && mv "$OUT.all.tgz" all.tgz && find . -mindepth 1 -type f ! -name all.tgz ! -name result.json ! -name run.log ! -name kernels.json -delete \
    && find . -mindepth 1 -type d -empty -delete )
exit $rc
