#!/usr/bin/env bash
# The H200 session of issue 12 as it last ran (2026-12-04 21:xx UTC; docs/performance.md of that
# date) as calls on one machine, each under the device tool's 10 minutes, with the CUDA libraries
# built here (prepare.py --prebuilt): a cold machine needs no build. Everything lands in $WORK
# (/tmp/clover-dev); a later call on the still-warm machine reuses it. What comes back is
# $OUT/result.json, $OUT/run.log, $OUT/kernels.json and $OUT/all.tgz (the rest: op logs, Nsight CSVs,
# stderr, notes), since the tool returns at most 8 files.
#
# The calls ran on the series plus the experiment bench/device/experiments/0114-*.patch (prepare.py
# --patch for each, the experiment last): MUL_MAT_ID's experts of at most 8 columns in a kernel
# instance of 8 columns ("sp", GGML_CUDA_MMQ_NARROW_ID_SMALL=1), that instance at 3 CTAs per SM
# ("sp3", _ID8_CTAS=3: 80 registers), and the L2 prefetch distance in steps ("pf4"/"pf8", _PF=4/8;
# 2 is the series').
#   bash bench/device/session.sh 1   # the experiment against the CPU (MUL_MAT_ID_SMALL, _GLU), the
#                                    # experts per op in each mode
#   bash bench/device/session.sh 2   # a single column tile at compile time ("ft2", _FULL_TILES=2)
#                                    # against the CPU; the experts per op with it and with "pf4"
#   bash bench/device/session.sh 3   # 40 layers: upstream's step, the series with its loop
#                                    # simulations, the modes as passes
set -u
call=${1:?which call: 1-3}
WORK=${WORK:-/tmp/clover-dev}
export QUANTS=q4_k_m GEN_LAYERS=8
NB=GGML_CUDA_MMQ_NARROW
T0=$(date +%s)
OUT=${OUT:-/tmp/clover-out}
K4="(q4_K|q5_K|q6_K|q8_0)"
case $call in
  1) # the experiment against the CPU, then the experts per op (16-64 tokens over 256, coresets of
     # 8 and 32, gate + up + GLU) in each mode
     export MODE_sp="${NB}_ID_SMALL=1" MODE_sp3="${NB}_ID_SMALL=1 ${NB}_ID8_CTAS=3" MODE_pf4="${NB}_PF=4"
     export MODE_pf8="${NB}_PF=8" MODE_sp3pf4="${NB}_ID_SMALL=1 ${NB}_ID8_CTAS=3 ${NB}_PF=4"
     STAGES=build,ops OPS_STAGES=eval,perf EVAL_WIDE=0 EVAL_MODES="sp3 pf8 sp" \
     EVAL_OPS=MUL_MAT_ID_SMALL,MUL_MAT_ID_SMALL_GLU EVAL_FILTER="type_a=$K4|type=$K4" \
     MODES="default sp sp3 pf4 pf8 sp3pf4" PERF_S=25 \
     PERF_FILTER='type_a=(q4_K|q6_K),type_b=f32,n_mats=256,n_used=8,b=[0-9a-z]+,m=[0-9]+,n=(16|32|64),|type=q4_K,glu_op=SWIGLU,m=(16|32),.*use_id=1' \
     BUDGET_S=560 bash bench/device/run.sh ;;
  2) # the single column tile at compile time (ft2) against the CPU, then the experts per op with it
     # and with the prefetch distance at 4 steps
     export MODE_ft2="${NB}_FULL_TILES=2" MODE_pf4="${NB}_PF=4" MODE_ft2pf4="${NB}_FULL_TILES=2 ${NB}_PF=4"
     STAGES=build,ops OPS_STAGES=eval,perf EVAL_WIDE=0 EVAL_MODES="ft2" \
     EVAL_OPS=MUL_MAT_ID_SMALL,MUL_MAT_ID_SMALL_GLU EVAL_FILTER="type_a=$K4|type=$K4" \
     MODES="default ft2 pf4 ft2pf4" PERF_S=20 \
     PERF_FILTER='type_a=(q4_K|q6_K),type_b=f32,n_mats=256,n_used=8,b=[0-9a-z]+,m=[0-9]+,n=(16|32|64),' \
     BUDGET_S=330 bash bench/device/run.sh ;;
  3) # 40 layers: upstream's step, the series with its loop simulations, the modes as passes
     SWEEP=${SWEEP:-"ft2:${NB}_FULL_TILES=2 pf4:${NB}_PF=4 ft2pf4:${NB}_FULL_TILES=2,${NB}_PF=4 b:CLOVER_SWEEP_REPEAT=2 ft2b:${NB}_FULL_TILES=2,CLOVER_SWEEP_REPEAT=2"} \
       LAYERS=40 STAGES=build,gen,convert,baseline,clover,sweep BUDGET_S=575 bash bench/device/run.sh ;;
  *) echo "call 1-3" >&2; exit 2 ;;
esac
rc=$?
cp "$OUT/ops/kernels.json" "$OUT/" 2>/dev/null
# (the archive written beside $OUT, then moved in: a tar of a folder it writes into exits 1)
( cd "$OUT" && tar czf "$OUT.all.tgz" --exclude=all.tgz --exclude=result.json --exclude=run.log --exclude=kernels.json . \
    && mv "$OUT.all.tgz" all.tgz && find . -mindepth 1 -type f ! -name all.tgz ! -name result.json ! -name run.log ! -name kernels.json -delete \
    && find . -mindepth 1 -type d -empty -delete )
exit $rc
