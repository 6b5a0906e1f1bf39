#!/usr/bin/env bash
# The H200 session of issue 12 as it last ran (2026-12-04 18:54-19:29 UTC; docs/performance.md of
# that date) as calls on one machine, each under the device tool's 10 minutes, with the CUDA
# libraries built here (prepare.py --prebuilt): a cold machine needs no build. Everything lands in
# $WORK (/tmp/clover-dev); a later call on the still-warm machine reuses it. What comes back is
# $OUT/result.json, $OUT/run.log, $OUT/kernels.json and $OUT/all.tgz (the rest: op logs, Nsight CSVs,
# stderr, notes), since the tool returns at most 8 files.
#
# Call 1 ran on the series through 0112 plus the experiment written last session (MMVF column chunks
# for F32 matrices at 17-64 columns, in the repository at commit 44f4b89 only, under
# bench/device/experiments/, applied as patch 0113; "mmvf0" is its switch off); calls 2-3 on the series
# plus patch 0113 as first written (its int8 range off by default: "d32" turns it on); calls 4-5 on 0113
# as landed (int8 at 17-32 columns from 4096 rows by default).
#   bash bench/device/session.sh 1   # the experiment against the CPU (every F32 MUL_MAT and
#                                    # MUL_MAT_SMALL case) and per op with and without it; Nsight of the
#                                    # dense Q6_K projections at 32 columns, MMQ and the narrow kernel in int8
#   bash bench/device/session.sh 2   # 0113 against the CPU (int8 everywhere from 16 rows, and the
#                                    # default paths), per op in each mode
#   bash bench/device/session.sh 3   # 40 layers: upstream's step, the series with its loop simulations,
#                                    # d32 and ft0 (whole tiles off), A and B
#   bash bench/device/session.sh 4   # per op: the experts at 32 tokens with and without whole tiles,
#                                    # the Q6_K output head on MMQ and in int8
#   bash bench/device/session.sh 5   # the 8-layer profile, Nsight of the head and of the int8 dense kernel
set -u
call=${1:?which call: 1-5}
WORK=${WORK:-/tmp/clover-dev}
export QUANTS=q4_k_m GEN_LAYERS=8
NB=GGML_CUDA_MMQ_NARROW
T0=$(date +%s)
OUT=${OUT:-/tmp/clover-out}
K4="(q4_K|q5_K|q6_K|q8_0)"
case $call in
  1) # the experiment (MMVF column chunks for F32 at 17-64 columns, applied as 0113) against the CPU (every
     # F32 MUL_MAT and MUL_MAT_SMALL case), per op with and without it, then Nsight of the dense Q6_K
     # projections at 32 columns, MMQ and the narrow kernel in int8
     export MODE_mmvf0="GGML_CUDA_MMVF_MAX_COLS=0"
     STAGES=build,ops OPS_STAGES=eval,perf EVAL_WIDE=0 EVAL_MODES=default EVAL_OPS=MUL_MAT,MUL_MAT_SMALL \
     EVAL_FILTER='type_a=f32,' MODES="default mmvf0" PERF_S=20 PERF_FILTER='type_a=f32,' \
     BUDGET_S=260 bash bench/device/run.sh
     I8="GGML_CUDA_MMQ_NARROW_F16=0 GGML_CUDA_MMQ_NARROW_DENSE_MAX=32"
     CASES="mmq-8192|-|MUL_MAT_SMALL|type_a=q6_K,.*m=8192,n=32,k=2048,
i8-8192|$I8|MUL_MAT_SMALL|type_a=q6_K,.*m=8192,n=32,k=2048,
mmq-2048|-|MUL_MAT_SMALL|type_a=q6_K,.*m=2048,n=32,k=4096,
i8-2048|$I8|MUL_MAT_SMALL|type_a=q6_K,.*m=2048,n=32,k=4096," \
     SOURCE='mul_mat_q' OUT="$OUT/stalls" timeout $(( 580 - $(date +%s) + T0 )) bash bench/device/stalls.sh ;;
  2) # patch 0113 (whole column tiles at compile time, Q6_K's offset without saturation):
     # against the CPU (int8 everywhere from 16 rows, and the default paths), per op in each mode
     export MODE_chk="${NB}_F16=0 ${NB}_DENSE_MAX=64 ${NB}_DENSE_MIN_ROWS=16" MODE_ft0="${NB}_FULL_TILES=0"
     export MODE_d32="${NB}_DENSE_I8_MAX=32" MODE_d64a="${NB}_DENSE_I8_MAX=64 ${NB}_DENSE_I8_MIN_ROWS=1024"
     export MODE_d64aft0="$MODE_d64a ${NB}_FULL_TILES=0" MODE_i8="${NB}_F16=0"
     N964="n=(9|[1-5][0-9]|6[0-4]),"
     STAGES=build,ops OPS_STAGES=eval,perf EVAL_WIDE=0 EVAL_MODES="chk default" \
     EVAL_OPS=MUL_MAT,MUL_MAT_SMALL,MUL_MAT_ID_SMALL,MUL_MAT_ID_SMALL_GLU \
     EVAL_FILTER="type_a=$K4,type_b=f32,m=[0-9]+,$N964|type_a=$K4,type_b=f32,n_mats=[0-9]+,n_used=[0-9]+,b=[0-9a-z]+,m=[0-9]+,$N964|type=$K4,glu_op=[A-Z]+,m=(9|[1-5][0-9]|6[0-4]),.*use_id=1" \
     MODES="default ft0 d32 d64a d64aft0 i8" PERF_S=25 \
     PERF_FILTER='type_a=(q4_K|q6_K),type_b=f32,m=(8192|4096|2048|248320),n=(16|32|64),k=(2048|4096),' \
     BUDGET_S=570 bash bench/device/run.sh ;;
  3) # 40 layers: upstream's step, the series with its loop simulations, then dense Q6_K / Q4_K of
     # 17-32 columns from 4096 rows in int8 (d32; the default since, where "d32" changes nothing and
     # "${NB}_DENSE_I8_MAX=0" is the before), whole tiles off (ft0), each twice (A, B)
     D32="${NB}_DENSE_I8_MAX=32" FT0="${NB}_FULL_TILES=0"
     SWEEP="d32:$D32 ft0:$FT0 b:CLOVER_SWEEP_REPEAT=2 d32b:$D32,CLOVER_SWEEP_REPEAT=2 ft0b:$FT0,CLOVER_SWEEP_REPEAT=2" \
       LAYERS=40 STAGES=build,gen,convert,baseline,clover,sweep BUDGET_S=570 bash bench/device/run.sh ;;
  4) # per op: the experts at 32 tokens (coresets of 8 and 32, all 256) and their gate + up + GLU with
     # whole tiles and without (ft0); the Q6_K output head at 1 and 32 columns on MMQ and in int8 (d32)
     export MODE_ft0="${NB}_FULL_TILES=0" MODE_d32="${NB}_DENSE_I8_MAX=32"
     STAGES=build,ops OPS_STAGES=perf MODES="default ft0 d32" PERF_S=60 \
     PERF_FILTER='type_a=(q4_K|q6_K),type_b=f32,n_mats=256,n_used=8,b=[0-9a-z]+,m=[0-9]+,n=32,|type=q4_K,glu_op=SWIGLU,m=(16|32),.*use_id=1|type_a=q6_K,type_b=f32,m=248320,' \
     BUDGET_S=300 bash bench/device/run.sh ;;
  5) # patch 0113 as landed: the 8-layer profile (40 kernels by name), then Nsight of the Q6_K output
     # head at 1 column (MMVQ) and 32 (int8), and of the dense Q6_K 8192 x 2048 at 32 columns in int8
     LAYERS=8 STAGES=build,gen,convert,profile PROFILE_PASSES="raw-ar preview fused" BUDGET_S=330 bash bench/device/run.sh
     CASES="head-n1|-|MUL_MAT_SMALL|type_a=q6_K,.*m=248320,n=1,k=2048,
head-n32|-|MUL_MAT_SMALL|type_a=q6_K,.*m=248320,n=32,k=2048,
i8-8192|-|MUL_MAT_SMALL|type_a=q6_K,.*m=8192,n=32,k=2048," \
     SOURCE='mul_mat' OUT="$OUT/stalls" timeout $(( 585 - $(date +%s) + T0 )) bash bench/device/stalls.sh ;;
  *) echo "call 1-5" >&2; exit 2 ;;
esac
rc=$?
cp "$OUT/ops/kernels.json" "$OUT/" 2>/dev/null
# (the archive written beside $OUT, then moved in: a tar of a folder it writes into exits 1)
( cd "$OUT" && tar czf "$OUT.all.tgz" --exclude=all.tgz --exclude=result.json --exclude=run.log --exclude=kernels.json . \
    && mv "$OUT.all.tgz" all.tgz && find . -mindepth 1 -type f ! -name all.tgz ! -name result.json ! -name run.log ! -name kernels.json -delete \
    && find . -mindepth 1 -type d -empty -delete )
exit $rc
