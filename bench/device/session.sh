#!/usr/bin/env bash
# The H200 calls of issue 12, each under the device tool's 10 minutes, with the CUDA libraries built here
# (prepare.py --prebuilt): a cold machine needs no build. Everything lands in run.sh's $WORK (/tmp/clover-dev); a later
# call on the still-warm machine reuses it. What comes back is $OUT/result.json, $OUT/run.log, $OUT/kernels.json
# and $OUT/all.tgz (the rest: op logs, traces, Nsight CSVs, stderr, notes), since the tool returns at most 8 files.
#
# Earlier sessions' calls are in git history: the 2026-12-05 01:58-02:38 UTC round at commit 624b4ee (six
# experiments against the CPU and per op, at 40 layers by switch, 8-layer kernel traces by switch, and the series with
# 0116 and 0117 as patches, whose GPU `clover verify` failed), and the 04:37 UTC bisection at commit 36f688d (its
# call 1: `clover verify` failed only with both experiments on; 0117's conv kernel read qkv and the conv state from
# memory the allocator had given its output, which 0116's graph makes happen in a preview: 2 of the tiny preset's 3
# GDN layers, fusion_on_cpu/check.sh real). The fix (the conv writes a pool buffer there, copied to the output)
# landed with both as patches 0012 and 0114 and was measured by call 1 (05:00); call 3 (05:03) traced it, and call 2's
# first form (05:14) measured a second coreset kernel against the first. The next session's calls:
#
#   bash bench/device/session.sh 1   # the series (carry: prepare.py --prebuilt build/cuda-local) at 40 layers:
#                                    # upstream's step and prompt processing, the passes, the loop simulations;
#                                    # then `clover verify` on the GPU (tiny preset, F32, Q8_0, Q4_K_M)
#   bash bench/device/session.sh 2   # branch wip-coreset2 (0114 with the second coreset kernel: 1024 threads, rows in
#                                    # registers, ranks by counting, every thread writing the output; its 05:14 form
#                                    # against the first: docs/performance.md): MOE_CORESET and PREVIEW_CONV against
#                                    # the CPU, then `clover verify` (tiny). Carry: on the branch, patches/build.py
#                                    # --dev, build_cuda_here.sh, prepare.py --prebuilt; merge it if both pass
#   bash bench/device/session.sh 3   # 8 layers: CUPTI traces of the preview (coreset off and forced to 8), the fused
#                                    # pass and a commit (kernels per pass and kernel time by kind)
#   bash bench/device/session.sh 4   # experiments/0115-* (its own carry): lean2, sp against the CPU, the experts per
#                                    # op with lean, lean2, sp
#   bash bench/device/session.sh 5   # the series at 40 layers, then dense matmuls of 33-64 columns from 4096 rows on the
#                                    # narrow kernel in int8 (a switch of 0113, no build): the fused pass's head has 33
#                                    # rows and runs on MMQ, which at 32 columns took 433 us against the narrow kernel's
#                                    # 310; per op MMQ won at 64 columns on 8192x2048 (31.0 against 33.2 us), so only
#                                    # the passes tell. With a B run of both
set -u
call=${1:?which call: 1-5}
export QUANTS=q4_k_m GEN_LAYERS=8
NB=GGML_CUDA_MMQ_NARROW
OUT=${OUT:-/tmp/clover-out}
K4="(q4_K|q5_K|q6_K|q8_0)"
ID_PERF='type_a=(q4_K|q6_K),type_b=f32,n_mats=256,n_used=8,b=[0-9a-z]+,m=[0-9]+,n=(16|32|64),'
# the experts (MUL_MAT_ID_SMALL, _GLU) against the CPU in the modes $1, then their perf cases at 16-64
# tokens (over 256 experts, coresets of 8 and 32) in the modes $2: PERF_S $3, BUDGET_S $4, PERF_FILTER
# $5 (default ID_PERF)
experts_ops() {
  STAGES=build,ops OPS_STAGES=eval,perf EVAL_WIDE=0 EVAL_MODES="$1" \
  EVAL_OPS=MUL_MAT_ID_SMALL,MUL_MAT_ID_SMALL_GLU EVAL_FILTER="type_a=$K4|type=$K4" \
  MODES="$2" PERF_S=$3 BUDGET_S=$4 PERF_FILTER="${5:-$ID_PERF}" bash bench/device/run.sh
}
case $call in
  1) LAYERS=40 STAGES=build,gen,convert,baseline,clover,loops,parity PARITY_PRESETS=tiny BUDGET_S=575 \
       bash bench/device/run.sh ;;
  2) OUT=$OUT/ops-eval STAGES=build,ops OPS_STAGES=eval EVAL_WIDE=0 EVAL_MODES=default \
       EVAL_OPS=MOE_CORESET,PREVIEW_CONV BUDGET_S=165 bash bench/device/run.sh > /dev/null 2>&1
     grep -ah "FAIL\|passed" "$OUT"/ops-eval/ops/tbo-eval-*.log
     mkdir -p "$OUT/parity"; OUT=$OUT/parity STAGES=build,parity PARITY_PRESETS=tiny BUDGET_S=70 bash bench/device/run.sh > /dev/null 2>&1
     grep -h "verify tiny" "$OUT/parity/run.log" ;;
  3) export LAYERS=8 TRACE_REPS=3 TRACE_PASSES="preview preview-c8 fused commit"
     STAGES=build,gen,convert,trace BUDGET_S=300 bash bench/device/run.sh ;;
  4) export MODE_lean="${NB}_LEAN=1" MODE_lean2="${NB}_LEAN=2" MODE_sp="${NB}_ID_SMALL=1"
     experts_ops "lean2 sp" "default lean lean2 sp" 25 430 ;;
  5) # (nothing reads CLOVER_SWEEP_REPEAT: b is the default in a process of its own, the drift between processes)
     W64=GGML_CUDA_MMQ_NARROW_DENSE_I8_MAX=64 R2=CLOVER_SWEEP_REPEAT=2
     SWEEP="w64:$W64 b:$R2 w64b:$W64,$R2" LAYERS=40 STAGES=build,gen,convert,baseline,clover,sweep BUDGET_S=575 \
       bash bench/device/run.sh ;;
  *) echo "call 1-5" >&2; exit 2 ;;
esac
rc=$?
cp "$OUT/ops/kernels.json" "$OUT/" 2>/dev/null
# (the archive written beside $OUT, then moved in: a tar of a folder it writes into exits 1)
( cd "$OUT" && tar czf "$OUT.all.tgz" --exclude=all.tgz --exclude=result.json --exclude=run.log --exclude=kernels.json . \
    && mv "$OUT.all.tgz" all.tgz && find . -mindepth 1 -type f ! -name all.tgz ! -name result.json ! -name run.log ! -name kernels.json -delete \
    && find . -mindepth 1 -type d -empty -delete )
exit $rc
