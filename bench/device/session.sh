#!/usr/bin/env bash
# The H200 calls of issue 12, each under the device tool's 10 minutes, with the CUDA libraries built here
# (prepare.py --prebuilt): a cold machine needs no build. Everything lands in run.sh's $WORK (/tmp/clover-dev); a later
# call on the still-warm machine reuses it. What comes back is $OUT/result.json, $OUT/run.log, $OUT/kernels.json
# and $OUT/all.tgz (the rest: op logs, traces, Nsight CSVs, stderr, notes), since the tool returns at most 8 files.
#
# Earlier sessions' calls are in git history (the 2026-12-05 01:58-02:38 UTC round at commit 624b4ee for its first
# three calls: the six experiments of that day against the CPU and per op, at 40 layers by switch, and 8-layer kernel
# traces by switch; docs/performance.md of that date). Two of them are faster and were meant to land: 0116 (the
# preview without copies) and 0117 (the preview conv and the block coreset in one kernel each, in clover-fusion.cu).
# The fourth call ran the series with both (as patches 0012 and 0114) at 40 layers and then `clover verify` on the
# GPU: the tiny preset's F32 preview failed it (mean relative KL 0.023 against 3e-4; causal rows and commit passed;
# the same check passed on 2026-12-02 with the series of that day). With no device time left to tell which change,
# or an older one, was the cause, both went back to experiments/ with their switches, and this session's calls
# start with that question (0117's matchers and kernels did give the CPU's nodes bit for bit on the tiny preset's
# real passes on host threads: experiments/on_cpu/check.sh real):
#
#   bash bench/device/session.sh 1   # `clover verify` (tiny, F32) on the GPU with 0116 + 0117 (carry:
#                                    # prepare_experiment.sh experiments/0116-* experiments/0117-*), and with each
#                                    # switched off: series (both off: the series' own code), nographs (CUDA graphs
#                                    # off), noslots (0401's graph slots off), conts (LLAMA_CLOVER_PREVIEW_CONTS=1,
#                                    # 0116's graph off), fusion0 (GGML_CUDA_CLOVER_FUSION=0), legacy
#                                    # (GGML_CUDA_CLOVER_LEGACY=1: upstream's kernels), nofusion
#                                    # (GGML_CUDA_DISABLE_FUSION=1: upstream's fusions off too); then test-backend-ops'
#                                    # cases of the preview's subgraphs (block softmax, conv, gated norm, coreset;
#                                    # the tiny preset's shapes among them) against the CPU, fusions on and off
#   bash bench/device/session.sh 2   # the same carry at 40 layers: upstream's step, the passes, and conts, fusion0,
#                                    # A and B
#   bash bench/device/session.sh 3   # 8 layers: CUPTI traces of the preview (coreset off and forced to 8), the fused
#                                    # pass and a commit, with the same carry and with conts and fusion0 (kernels per
#                                    # pass and kernel time by kind, without the 40-layer wall times' drift)
#   bash bench/device/session.sh 4   # experiments/0115-* (its own carry): lean2, sp against the CPU, the experts per
#                                    # op with lean, lean2, sp
set -u
call=${1:?which call: 1-4}
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
CONTS=LLAMA_CLOVER_PREVIEW_CONTS=1 FUSION0=GGML_CUDA_CLOVER_FUSION=0
case $call in
  1) for v in default series:$CONTS,$FUSION0 nographs:GGML_CUDA_DISABLE_GRAPHS=1 noslots:LLAMA_GRAPH_CACHE=0 \
         conts:$CONTS fusion0:$FUSION0 legacy:GGML_CUDA_CLOVER_LEGACY=1 nofusion:GGML_CUDA_DISABLE_FUSION=1; do
       tag=${v%%:*}; vars=${v#"$tag"}; vars=${vars#:}
       mkdir -p "$OUT/$tag"
       env ${vars//,/ } RETIME=1 OUT=$OUT/$tag STAGES=build,parity PARITY_PRESETS=tiny PARITY_QUANTS=f32 \
         BUDGET_S=80 bash bench/device/run.sh > "$OUT/$tag/stdout.txt" 2>&1
       grep -h "verify tiny" "$OUT/$tag/run.log" | sed "s/^/$tag: /"
     done
     # the preview's subgraphs op by op against the CPU (the tiny preset's shapes among them), fusions on and off
     MODE_fusion0=$FUSION0 OUT=$OUT/ops-eval STAGES=build,ops OPS_STAGES=eval EVAL_WIDE=0 EVAL_MODES="default fusion0" \
       EVAL_OPS=BLOCK_SOFTMAX_HISTORY,PREVIEW_CONV,PREVIEW_GATED_NORM,MOE_CORESET BUDGET_S=200 \
       bash bench/device/run.sh > /dev/null 2>&1
     grep -ah "FAIL\|passed" "$OUT"/ops-eval/ops/tbo-eval-*.log ;;
  2) R2=CLOVER_SWEEP_REPEAT=2
     SWEEP=${SWEEP:-"conts:$CONTS fusion0:$FUSION0 b:$R2 contsb:$CONTS,$R2 fusion0b:$FUSION0,$R2"} \
       LAYERS=40 STAGES=build,gen,convert,baseline,clover,sweep BUDGET_S=575 bash bench/device/run.sh ;;
  3) export LAYERS=8 TRACE_REPS=3 TRACE_PASSES="preview preview-c8 fused commit"
     STAGES=build,gen,convert,trace BUDGET_S=200 bash bench/device/run.sh
     for v in conts:$CONTS fusion0:$FUSION0; do
       mkdir -p "$OUT/${v%%:*}"
       env "${v#*:}" OUT=$OUT/${v%%:*} STAGES=build,trace BUDGET_S=100 bash bench/device/run.sh
     done ;;
  4) export MODE_lean="${NB}_LEAN=1" MODE_lean2="${NB}_LEAN=2" MODE_sp="${NB}_ID_SMALL=1"
     experts_ops "lean2 sp" "default lean lean2 sp" 25 430 ;;
  *) echo "call 1-4" >&2; exit 2 ;;
esac
rc=$?
cp "$OUT/ops/kernels.json" "$OUT/" 2>/dev/null
# (the archive written beside $OUT, then moved in: a tar of a folder it writes into exits 1)
( cd "$OUT" && tar czf "$OUT.all.tgz" --exclude=all.tgz --exclude=result.json --exclude=run.log --exclude=kernels.json . \
    && mv "$OUT.all.tgz" all.tgz && find . -mindepth 1 -type f ! -name all.tgz ! -name result.json ! -name run.log ! -name kernels.json -delete \
    && find . -mindepth 1 -type d -empty -delete )
exit $rc
