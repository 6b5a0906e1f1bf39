#!/usr/bin/env bash
# The H200 session of issue 12 as it last ran (2026-12-04 21:19-21:37 UTC; docs/performance.md of
# that date), and the next session's calls, each under the device tool's 10 minutes, with the CUDA
# libraries built here (prepare.py --prebuilt): a cold machine needs no build. Everything lands in
# $WORK (/tmp/clover-dev); a later call on the still-warm machine reuses it. What comes back is
# $OUT/result.json, $OUT/run.log, $OUT/kernels.json and $OUT/all.tgz (the rest: op logs, Nsight CSVs,
# stderr, notes), since the tool returns at most 8 files.
#
# Calls 1-2 ran on the series plus an experiment patch (bench/device/experiments/0114-*, call 1's
# form at commit 5bde425, call 2's at 28a3994; prepare.py --patch for each series patch, the experiment last):
# MUL_MAT_ID's experts of at most 8 columns in a second launch of the 8-column instance ("sp",
# GGML_CUDA_MMQ_NARROW_ID_SMALL=1), that instance at 3 CTAs per SM ("sp3", _ID8_CTAS=3: 80 registers
# and spills), the L2 prefetch distance in steps ("pf4", _PF=4; 2 is the series'), and (call 2 only)
# a single column tile at compile time per step ("ft2", _FULL_TILES=2). Call 3 (40 layers with ft2
# and sp) was lost with its machine.
#
# Calls 3-7 are the next session's, for the experiments now in bench/device/experiments/ (compiled
# for sm_90, unmeasured), every variant a switch of one build. 0114's:
#   "lean" (GGML_CUDA_MMQ_NARROW_LEAN=1): MUL_MAT_ID's units of one column tile in code of their own;
#   "lean2" (=2): of one or two tiles;
#   "sp" (GGML_CUDA_MMQ_NARROW_ID_SMALL=1): the split of call 1, to compare against;
#   "ks4", "ks8" (GGML_CUDA_MMQ_NARROW_DENSE_KSPLIT=4|8, with the int8 range from 2048 rows so that the
#   2048x4096 output projections leave MMQ): MUL_MAT's K over 4 or 8 CTAs a row block, the last slice
#   to finish adding the parts in order (deterministic), no fix-up kernel.
# The same build carries a second experiment, bench/device/experiments/0115-* (compiled for sm_90,
# unmeasured): gated delta net of several tokens with each chunk of 32 tokens' q, k, gates and v
# columns staged in shared memory ("gdn0", GGML_CUDA_GDN_STAGED=0, is the token-by-token kernel;
# the results are meant to be bit for bit the same). It moves every pass with causal rows (commit,
# fused, verifications, prompts), not the preview, and not the 1-token step.
# A third, bench/device/experiments/0116-* (libllama; checked on the CPU here: the same outputs bit for
# bit), takes four copies and a repeat a GDN layer out of the preview's graph: q and k normalized from
# their permuted rows, the right conv taps padded from a strided view, q.k over the repeated queries,
# the block's output handed to the gated norm as a strided view ("conts", LLAMA_CLOVER_PREVIEW_CONTS=1,
# keeps them). It moves the preview and the fused pass.
# A fourth, bench/device/experiments/0117-* (CUDA), runs a block's expert coreset, twenty small nodes a MoE
# layer from the router softmax to logits + log(keep), as one kernel ("cs0", GGML_CUDA_CLOVER_CORESET_FUSION=0,
# runs them one by one). It moves previews with the coreset on (the default, and the forced sizes of the
# coreset goal): at 40 layers a preview forced to keep all 256 experts cost 1.1-1.6 ms more than one
# without the coreset (2026-12-04 19:17), which is about what those 800 launches cost.
# A fifth, bench/device/experiments/0118-* (CUDA), runs a GDN layer's block softmax with its history slot, about
# twenty nodes from the queries' repeat to the final ADD, as one kernel ("bs0",
# GGML_CUDA_CLOVER_BLOCK_SOFTMAX_FUSION=0, runs them one by one). It moves the preview and the fused pass (30 of
# the 40 layers).
# A sixth, bench/device/experiments/0119-* (CUDA), runs a GDN layer's conv with its right taps, eight nodes from the
# block's transposing copy to the SILU, as one kernel ("pc0", GGML_CUDA_CLOVER_PREVIEW_CONV_FUSION=0, runs them
# one by one).
# experiments/on_cpu.sh checks 0115, 0117, 0118 and 0119 from their own source on host threads, without a GPU.
# Build and carry the six with `bash bench/device/prepare_experiment.sh bench/device/experiments/011[4-9]-*.patch`
# (then --restore). With every 0114 switch off its kernel is not the series' code (its row-block loop
# became a lambda; ptxas's spills differ), so call 6 times the series itself on the same, still-warm
# machine, from a .devcarry of the series (prepare.py --prebuilt of the restored build).
#   bash bench/device/session.sh 1   # (ran) the experiment against the CPU (MUL_MAT_ID_SMALL, _GLU),
#                                    # the experts per op in each mode
#   bash bench/device/session.sh 2   # (ran) ft2 against the CPU; the experts per op with it, with pf4
#   bash bench/device/session.sh 3   # lean2, sp against the CPU; the experts per op with lean, lean2, sp
#   bash bench/device/session.sh 4   # the K split, the staged gated delta net, the coreset, block softmax
#                                    # and conv kernels against the CPU; per op (gdn0, cs0, bs0, pc0: without them)
#   bash bench/device/session.sh 5   # 40 layers: upstream's step, the experiment's default with its
#                                    # loop simulations, cs0, bs0, pc0, gdn0, conts, A and B
#   bash bench/device/session.sh 7   # (warm, after 5) 40 layers: lean2, ks4, A and B
#   bash bench/device/session.sh 6   # 40 layers from the series' own carry: upstream's step, passes
# Calls 3-7 ask for about 2200 s with a cold start, more than a session's 1800: drop call 6 first (its
# point is the series' code against the experiment's default), then call 7 or 3.
set -u
call=${1:?which call: 1-7}
WORK=${WORK:-/tmp/clover-dev}
export QUANTS=q4_k_m GEN_LAYERS=8
NB=GGML_CUDA_MMQ_NARROW
T0=$(date +%s)
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
# a new kernel (0115, 0117-0119) whose cases failed against the CPU in call 4, or did not finish there, stays off in
# the 40-layer calls that follow on the warm machine, so that a bad kernel costs its A/B and not the call
guard_new_kernels() {
  local log=$WORK/ops/logs/tbo-eval-ksc.log pair op var
  [ -f "$log" ] || return 0
  for pair in MOE_CORESET:GGML_CUDA_CLOVER_CORESET_FUSION BLOCK_SOFTMAX_HISTORY:GGML_CUDA_CLOVER_BLOCK_SOFTMAX_FUSION \
      PREVIEW_CONV:GGML_CUDA_CLOVER_PREVIEW_CONV_FUSION GATED_DELTA_NET:GGML_CUDA_GDN_STAGED; do
    op=${pair%%:*} var=${pair#*:}
    if grep -aq "$op(.*FAIL" "$log" || ! grep -aq "$op(.*OK" "$log"; then
      export "$var=0"
      mkdir -p "$OUT" && echo "session.sh: $op failed or did not finish its check in call 4: $var=0" | tee -a "$OUT/guard.txt"
    fi
  done
}
case $call in
  1) # (ran) the experiment against the CPU, then the experts per op (16-64 tokens over 256, coresets of
     # 8 and 32, gate + up + GLU) in each mode
     export MODE_sp="${NB}_ID_SMALL=1" MODE_sp3="${NB}_ID_SMALL=1 ${NB}_ID8_CTAS=3" MODE_pf4="${NB}_PF=4"
     export MODE_pf8="${NB}_PF=8" MODE_sp3pf4="${NB}_ID_SMALL=1 ${NB}_ID8_CTAS=3 ${NB}_PF=4"
     # (its GLU alternative matched no perf case)
     experts_ops "sp3 pf8 sp" "default sp sp3 pf4 pf8 sp3pf4" 25 560 "$ID_PERF|type=q4_K,glu_op=SWIGLU,m=(16|32),.*use_id=1" ;;
  2) # (ran) the single column tile at compile time (ft2) against the CPU, then the experts per op with it
     # and with the prefetch distance at 4 steps
     export MODE_ft2="${NB}_FULL_TILES=2" MODE_pf4="${NB}_PF=4" MODE_ft2pf4="${NB}_FULL_TILES=2 ${NB}_PF=4"
     experts_ops ft2 "default ft2 pf4 ft2pf4" 20 330 ;;
  3) # the next session: lean2 and sp against the CPU, then the experts per op with lean, lean2, sp
     export MODE_lean="${NB}_LEAN=1" MODE_lean2="${NB}_LEAN=2" MODE_sp="${NB}_ID_SMALL=1"
     experts_ops "lean2 sp" "default lean lean2 sp" 25 430 ;;
  4) # the next session: the dense K split against the CPU (every dense matmul of 9-32 columns from 16
     # rows on the narrow kernel, split over 4 CTAs), the staged gated delta net (on in every mode but
     # gdn0: all of upstream's cases and the patch's at the model's head shape) and 0116's q.k (F32, the
     # keys broadcast over dim 3), then dense, gated delta net and that q.k per op
     I8="${NB}_DENSE_I8_MIN_ROWS=2048"
     export MODE_ksc="${NB}_DENSE_KSPLIT=4 ${NB}_DENSE_MIN_ROWS=16 ${NB}_DENSE_I8_MIN_ROWS=16"
     export MODE_i8="$I8" MODE_ks2="${NB}_DENSE_KSPLIT=2 $I8" MODE_ks4="${NB}_DENSE_KSPLIT=4 $I8" MODE_ks8="${NB}_DENSE_KSPLIT=8 $I8"
     export MODE_gdn0="GGML_CUDA_GDN_STAGED=0" MODE_cs0="GGML_CUDA_CLOVER_CORESET_FUSION=0"
     export MODE_bs0="GGML_CUDA_CLOVER_BLOCK_SOFTMAX_FUSION=0" MODE_pc0="GGML_CUDA_CLOVER_PREVIEW_CONV_FUSION=0"
     N932="n=(9|[12][0-9]|3[0-2]),"
     STAGES=build,ops OPS_STAGES=eval,perf EVAL_WIDE=0 EVAL_MODES="ksc" \
     EVAL_OPS=MUL_MAT,MUL_MAT_SMALL,GATED_DELTA_NET,MOE_CORESET,BLOCK_SOFTMAX_HISTORY,PREVIEW_CONV \
     EVAL_FILTER="type_a=$K4,type_b=f32,m=[0-9]+,$N932|head_count=|nr=\[1,2\]|n_expert=|d_k=|channels=" \
     MODES="default gdn0 cs0 bs0 pc0 i8 ks2 ks4 ks8" PERF_S=25 \
     PERF_OPS=MUL_MAT_SMALL,GATED_DELTA_NET,MOE_CORESET,BLOCK_SOFTMAX_HISTORY,PREVIEW_CONV \
     PERF_FILTER='type_a=(q4_K|q6_K),type_b=f32,m=(8192|4096|2048),n=(16|32),k=(2048|4096),|head_count=16,head_size=128,|nr=\[1,2\]|n_expert=|d_k=|channels=' \
     BUDGET_S=450 bash bench/device/run.sh ;;
  5) # the next session: 40 layers, the experiment's default with its loop simulations, then cs0, bs0,
     # pc0, gdn0, conts, A and B (what does not fit in the budget is skipped: reorder after calls 3-4)
     guard_new_kernels
     R2=CLOVER_SWEEP_REPEAT=2 CS0=GGML_CUDA_CLOVER_CORESET_FUSION=0 GDN0=GGML_CUDA_GDN_STAGED=0 CONTS=LLAMA_CLOVER_PREVIEW_CONTS=1
     BS0=GGML_CUDA_CLOVER_BLOCK_SOFTMAX_FUSION=0 PC0=GGML_CUDA_CLOVER_PREVIEW_CONV_FUSION=0
     SWEEP=${SWEEP:-"cs0:$CS0 bs0:$BS0 pc0:$PC0 gdn0:$GDN0 conts:$CONTS b:$R2 cs0b:$CS0,$R2 bs0b:$BS0,$R2 pc0b:$PC0,$R2 gdn0b:$GDN0,$R2"} \
       LAYERS=40 STAGES=build,gen,convert,baseline,clover,sweep BUDGET_S=575 bash bench/device/run.sh ;;
  7) # the next session, warm after call 5: 40 layers, lean2 and ks4, A and B
     guard_new_kernels
     KS4="${NB}_DENSE_KSPLIT=4,${NB}_DENSE_I8_MIN_ROWS=2048" R2=CLOVER_SWEEP_REPEAT=2
     SWEEP=${SWEEP:-"lean2:${NB}_LEAN=2 ks4:$KS4 lean2b:${NB}_LEAN=2,$R2 ks4b:$KS4,$R2"} \
       LAYERS=40 STAGES=build,gen,convert,sweep BUDGET_S=400 bash bench/device/run.sh ;;
  6) # the next session: the series' own libraries (its .devcarry) at 40 layers on the same machine
     LAYERS=40 STAGES=build,gen,convert,baseline,clover BUDGET_S=500 bash bench/device/run.sh ;;
  *) echo "call 1-7" >&2; exit 2 ;;
esac
rc=$?
cp "$OUT/ops/kernels.json" "$OUT/" 2>/dev/null
# (the archive written beside $OUT, then moved in: a tar of a folder it writes into exits 1)
( cd "$OUT" && tar czf "$OUT.all.tgz" --exclude=all.tgz --exclude=result.json --exclude=run.log --exclude=kernels.json . \
    && mv "$OUT.all.tgz" all.tgz && find . -mindepth 1 -type f ! -name all.tgz ! -name result.json ! -name run.log ! -name kernels.json -delete \
    && find . -mindepth 1 -type d -empty -delete )
exit $rc
