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
# first form (05:14) measured a second coreset kernel against the first, its final form checked by call 2 (07:50).
#
# A call takes the carry in $CARRY (run.sh's default .devcarry): with an experiment's carry there, the series' own goes
# to another ignored folder, e.g. `prepare.py --prebuilt build/cuda-local --out .devcarry-series`, and calls 1-3
# and 5 run as CARRY=$PWD/.devcarry-series bash bench/device/session.sh N, carry [".devcarry-series"]. The calls:
#
#   bash bench/device/session.sh 1   # the series (carry: prepare.py --prebuilt build/cuda-local) at 40 layers:
#                                    # upstream's step and prompt processing, the passes, the loop simulations;
#                                    # then `clover verify` on the GPU (tiny preset, F32, Q8_0, Q4_K_M)
#   bash bench/device/session.sh 2   # the fusions' kernels (0114's preview conv, 0117's coreset kernels) against the
#                                    # CPU, MOE_CORESET and PREVIEW_CONV, then `clover verify` (tiny); its 07:50 run
#                                    # checked 0114's second coreset kernel, which 0117 has since replaced
#   bash bench/device/session.sh 3   # 8 layers: CUPTI traces of the preview (coreset off and forced to 8), the fused
#                                    # pass, a commit and the plain 1-row step (raw-ar: what each kind of kernel
#                                    # costs a 32-row pass against the step it is measured by)
#   bash bench/device/session.sh 4   # an experiment's carry (prepare_experiment.sh; .devcarry): the experts
#                                    # (MUL_MAT_ID_SMALL, _GLU) against the CPU in the modes EVAL_M, then per op in
#                                    # the modes PERF_M (default "default" and EVAL_M's), PERF_S s a mode, BUDGET_S;
#                                    # a mode is an exported MODE_<tag>="VAR=V ...", e.g. MODE_lean2=GGML_CUDA_MMQ_NARROW_LEAN=2
#   bash bench/device/session.sh 5   # the series at 40 layers, then each of SWEEP's settings ("tag:VAR=V,... ...",
#                                    # run.sh's sweep: the passes without the loop simulations), e.g. SWEEP="x:VAR=1
#                                    # b:CLOVER_SWEEP_REPEAT=2 xb:VAR=1,CLOVER_SWEEP_REPEAT=2" (b: the default in a
#                                    # process of its own, the drift between processes; nothing reads that variable)
#   bash bench/device/session.sh 9   # the narrow kernel's knobs on the dense Q6_K projections at 32 columns (DENSE32),
#                                    # per op: one CTA per SM (its activations staged once for two row blocks), K splits
#                                    # of 2 and 8, int8 from 2048 rows (the output projection), MMQ (about 120 s; any
#                                    # carry of the series); MODES9 picks others: h32 (halves to 32 columns), h32kw8,
#                                    # q81 (int8 with q8_1's scales per 32 values), ft0 (column tiles counted at run time)
#   bash bench/device/session.sh 10  # Nsight Compute (stalls.sh, with each kernel's source page) of a GDN layer's block
#                                    # softmax at the model's size, the z and qkv projections at 32 columns (z also with one
#                                    # CTA per SM) and patch 0118's head chunks kernel: where their time goes (about
#                                    # 120 s)
#   bash bench/device/session.sh 11  # the series (or a carry's) against the CPU on the GPU, in one short call (about 230
#                                    # s started): the experts (MUL_MAT_ID_SMALL, _GLU) in the defaults, then `clover
#                                    # verify` on the GPU (tiny preset, F32 and Q4_K_M)
#   bash bench/device/session.sh 12  # patches 0125 (a dense matmul's K split sized to one wave) and 0126 (its CTAs of 16
#                                    # warps): MUL_MAT_SMALL of the K-quants against the CPU in the defaults and with every
#                                    # dense case on the narrow kernel (nd), DENSE32 per op in the defaults, with the split
#                                    # before 0125 (w0) and with CTAs of 8 warps (w8), then `clover verify` on the GPU (tiny
#                                    # preset, F32 and Q4_K_M); about 290 s started. Their traces: call 3 with
#                                    # TRACE_PASSES="preview commit" and the switch (GGML_CUDA_MMQ_NARROW_DENSE_WARPS=8) set
#   bash bench/device/session.sh 13  # the speculative loop's common verification (2 causal rows + a 2-row preview) against
#                                    # the 1-row step: 8 layers, CUPTI traces of both (profile.py --pass verify-2-2 / raw-ar),
#                                    # then timing.py's passes on the 8-layer file (verify_2_2_ms beside the AR step and
#                                    # the fused pass); about 200 s started, 300 cold
#   bash bench/device/session.sh 14  # patches 0128-0130 (CONCAT of short rows, MMVF for thin F32 matrices, the block softmax
#                                    # of a short block): `clover verify` on the GPU (tiny preset, F32 and Q4_K_M), call 13 (in
#                                    # $OUT/c13), then CONCAT, MUL_MAT of F32 at 1-9 columns and BLOCK_SOFTMAX_HISTORY against the
#                                    # CPU (EVAL14: the cases' filter); about 450 s cold
#   bash bench/device/session.sh 15  # patch 0401's graph slots at 40 layers: graph_slots.py's labelled simulations on two speculative
#                                    # engines side by side (SLOTS15, default 4 and 8 slots), each pass shape's calls and time
#                                    # (where graph rebuilds go in the speculative loop); about 500 s cold
#   bash bench/device/session.sh 16  # experiment 0131's carry: MMVQ's MoE kernel at 1-8 tokens against the CPU (EVAL16, modes
#                                    # default, r1, r4: rows per block), then the experts' gate/up (with its GLU) and down at 2-8
#                                    # tokens per op in MODES16 (r4s: 4 rows a block for K <= 1024 only; r1l: 1 for K > 1024 only)
#   bash bench/device/session.sh 17  # 40 layers: pass_in_loop.py (the 2 + 2 verification alone, advancing, inside the a = 1 loop,
#                                    # with ggml-cuda's CUDA graph events), then graph_slots.py with 4 and 24 slots (SLOTS17; none:
#                                    # skipped); about 330 s cold, 200 without graph_slots.py
#   bash bench/device/session.sh 18  # call 17, then call 16 in the time left of 560 s (in $OUT/c17 and $OUT/c16)
#   bash bench/device/session.sh 19  # the carry of experiments 0131-0134, 40 layers: graph_slots.py with patch 0401's four
#                                    # slots against 0134's pool bounded in memory (SLOTS19), in three processes
#                                    # (PROCS19): as built; CUDA graphs never evicted (0132's GGML_CUDA_GRAPH_EVICT_S=0);
#                                    # and a shape's first call captured (GGML_CUDA_GRAPH_CAPTURE_FIRST=1); what the
#                                    # first calls of a shape cost a run. 2026-12-07 23:03 UTC ran it as it is; the next
#                                    # form: PROCS19="pad256:LLAMA_KV_PAD=256 pad1024:LLAMA_KV_PAD=1024" (0133) with
#                                    # SLOTS19="slots4:LLAMA_GRAPH_CACHE=4,LLAMA_GRAPH_CACHE_MIB=0
#                                    # slots16:LLAMA_GRAPH_CACHE=16,LLAMA_GRAPH_CACHE_MIB=0" BUDGET_S=500
#   bash bench/device/session.sh 20  # call 17 without its slots part (pass_in_loop.py), then call 16
#   bash bench/device/session.sh 6   # an experiment's carry, checked before it is timed: `clover verify` on the GPU
#                                    # (tiny preset, F32 and Q4_K_M; VERIFY6=0 skips it), then call 5's 40-layer series and SWEEP (BUDGET_S,
#                                    # default 400; STAGES6 replaces its stages), then same_logits.py on the 8-layer file for SAME ("VAR=V": the
#                                    # logits of causal batches of 32 and 64 rows must not move a bit; with SAME_ARGS=--cpu
#                                    # both settings against the CPU backend instead, e.g. SAME=GGML_CUDA_MMQ_NARROW=0: the
#                                    # narrow kernels within twice MMQ's difference; the tiny preset never reaches them)
#
# 2026-12-05 08:56-09:11 UTC ran call 5 with SWEEP w64 (dense int8 to 64 columns, slower) and call 4 on experiment
# 0115 (lean MUL_MAT_ID units), then its 40-layer sweep, as commit 3a3a001 has them (docs/performance.md).
# 2026-12-06 04:23-04:54 UTC ran calls 11 (experiments 0118-0122: the dense cases and CLOVER_HEAD against the CPU, then
# 40 layers with a sweep) and 12 (the same checks, then per op), as commit 7567a59 has them; 0121 (dense matmuls in K
# slices) lost per op and was dropped with 0122, which was built on it.
# 2026-12-06 06:13-06:42 UTC ran calls 8 (0118-0120 at 40 layers, one switch a process), 10, 9, 7p (per op; test-backend-ops
# perf times only a case's last op) and 10h (Nsight of 0118-0120's kernels under each switch), as commit 2bed542 has
# them; experiment 0120 became patch 0118, experiments 0118 and 0119 were dropped (their patches are at 2bed542 too).
# 2026-12-06 09:03-09:21 UTC ran call 11 (experiments 0119 and 0120 against the CPU, per op, 8-layer traces with and
# without), call 6 with SWEEP old / b / oldb / f16all, a check of the experts in halves everywhere with two more sweep runs,
# and Nsight Compute of the experts' narrow kernel (stalls.sh), as commit 94b8e89 has call 11; both experiments became
# patches 0119 and 0120. At 09:38-09:42 UTC a second call 11 checked experiment 0121 (MUL_MAT_ID units of up to 4 row
# blocks) against the CPU and a call timed it per op; it was dropped (the patch and that call 11 are at commit 16d87b1).
# 2026-12-06 11:48-11:54 UTC ran call 11 (experiment 0121's first form: the experts against the CPU in modes dbuf and t8dbuf,
# then per op) and 13:09 call 12 (40 layers, the series against t8dbufti in two processes each; not landed, the coresets
# lose); call 13 (t8dbufti against the CPU, per op, GPU `clover verify` under its switches) has not run.
# 2026-12-06 14:17-14:37 UTC ran calls 14, 15 and 16 (experiment 0122: a coreset's ids keep the 32-column path, over
# 0121); both became patches 0121 and 0122 with tiles of 16 as the default, and calls 11-16, which set 0121's switches
# against the defaults of then, are at commit b0b5733.
# 2026-12-06 18:07-18:17 UTC ran call 6 (VERIFY6=0, SWEEP q6t8 pf4, SAME=GGML_CUDA_MMQ_NARROW=0 SAME_ARGS=--cpu) on experiment
# 0123 (the Q6_K experts' own column tile, the L2 prefetch distance), then a sweep of the default and q6t8 twice more;
# neither setting landed (inside the spread between processes); 0123 and its calls 17 and 18 (not run) are at commit 9bb4af1.
# 2026-12-06 20:07-20:44 UTC checked a second experiment 0123 (MUL_MAT_ID's weights through shared memory) with call 4
# (EVAL_M=default PERF_M="default pipe0" MODE_pipe0=GGML_CUDA_MMQ_NARROW_ID_PIPE=0) and timed it with call 6 (VERIFY6=0,
# SWEEP="p0:GGML_CUDA_MMQ_NARROW_ID_PIPE=0 b:… p0b:…", SAME=GGML_CUDA_MMQ_NARROW_ID_PIPE=0 SAME_ARGS=--cpu), then two more
# sweep pairs with STAGES6=build,sweep on the warm machine; it became patch 0123.
# 2026-12-07 02:59-03:15 UTC ran call 7 (experiments 0124-0126 against the CPU and per op in the modes default, p1024, s0
# and bs16), call 6 (VERIFY6=0, SWEEP="bs16:… p1024:… b:…", then STAGES6=build,sweep with bs16b / c / bs16c / d) and
# call 3 five times under those switches (TRACE_PASSES="preview commit"), as commit 705f650 has them; 0124 became patch
# 0124 for Q6_K only, 0125 and 0126 were dropped.
# 2026-12-07 05:31-05:38 UTC ran call 7 on a second experiment 0125 (the dense matmuls of the K-quants through 0123's
# weights' pipeline; its eval, then its perf stage in a call of its own) and call 3 twice (TRACE_PASSES="preview
# commit", once with GGML_CUDA_MMQ_NARROW_DENSE_PIPE=0), as commit 5e58a79 has them; 0125 was dropped.
set -u
call=${1:?which call: 1-6, 9-20}
export QUANTS=q4_k_m GEN_LAYERS=8
OUT=${OUT:-/tmp/clover-out}
K4="(q4_K|q5_K|q6_K|q8_0)"
ID_PERF='type_a=(q4_K|q6_K),type_b=f32,n_mats=256,n_used=8,b=[0-9a-z]+,m=[0-9]+,n=(16|32|64),'
# the dense Q6_K projections at 32 columns (a GDN layer's qkv, z and output, the output head, merged shapes)
DENSE32='type_a=q6_K,.*m=(248320|12288|9216|8192|4096|2048),n=32,k=(2048|4096),'
# the experts (MUL_MAT_ID_SMALL, _GLU) against the CPU in the modes $1, then their perf cases at 16-64
# tokens (over 256 experts, coresets of 8 and 32) in the modes $2: PERF_S $3, BUDGET_S $4, PERF_FILTER
# $5 (default ID_PERF)
experts_ops() {
  STAGES=build,ops OPS_STAGES=${EXPERTS_OPS_STAGES:-eval,perf} EVAL_WIDE=0 EVAL_MODES="$1" \
  EVAL_OPS=MUL_MAT_ID_SMALL,MUL_MAT_ID_SMALL_GLU EVAL_FILTER="type_a=$K4|type=$K4" \
  MODES="$2" PERF_S=$3 BUDGET_S=$4 PERF_FILTER="${5:-$ID_PERF}" bash bench/device/run.sh
}
# `clover verify` on the GPU (tiny preset; file types $2, else run.sh's PARITY_QUANTS) under BUDGET_S $1 in $OUT/parity:
# its verdict lines
gpu_verify() {
  mkdir -p "$OUT/parity"
  ( [ -z "${2:-}" ] || export PARITY_QUANTS=$2
    OUT=$OUT/parity STAGES=build,parity PARITY_PRESETS=tiny BUDGET_S=$1 bash bench/device/run.sh > /dev/null 2>&1 )
  grep -h "verify tiny\|parity: kept" "$OUT/parity/run.log"
}
case $call in
  1) LAYERS=40 STAGES=build,gen,convert,baseline,clover,loops,parity PARITY_PRESETS=tiny BUDGET_S=575 \
       bash bench/device/run.sh ;;
  2) OUT=$OUT/ops-eval STAGES=build,ops OPS_STAGES=eval EVAL_WIDE=0 EVAL_MODES=default \
       EVAL_OPS=MOE_CORESET,PREVIEW_CONV BUDGET_S=165 bash bench/device/run.sh > /dev/null 2>&1
     grep -ah "FAIL\|passed" "$OUT"/ops-eval/ops/tbo-eval-*.log
     gpu_verify 70 ;;
  3) export LAYERS=8 TRACE_REPS=3 TRACE_PASSES="${TRACE_PASSES:-preview preview-c8 fused commit raw-ar}"
     STAGES=build,gen,convert,trace BUDGET_S=300 bash bench/device/run.sh ;;
  4) experts_ops "${EVAL_M:?the modes to check against the CPU}" "${PERF_M:-default $EVAL_M}" "${PERF_S:-25}" "${BUDGET_S:-430}" ;;
  5) SWEEP="${SWEEP:-}" LAYERS=40 STAGES=build,gen,convert,baseline,clover,sweep BUDGET_S=575 bash bench/device/run.sh ;;
  6) if [ "${VERIFY6:-1}" = 1 ]; then
       gpu_verify 110 f32,q4_k_m
     fi
     SWEEP="${SWEEP:-}" LAYERS=40 STAGES="${STAGES6:-build,gen,convert,baseline,clover,sweep}" BUDGET_S="${BUDGET_S:-400}" \
       bash bench/device/run.sh
     if [ -n "${SAME:-}" ]; then
       W=${WORK:-/tmp/clover-dev}
       PYTHONPATH="$W/site:$W/pure:$W/pylink:$PWD" python3 bench/device/same_logits.py "$W/clover-8-q4_k_m.gguf" "$SAME" \
         --rows 32,64 ${SAME_ARGS:-} 2>&1 | tail -6 | tee "$OUT/same_logits.txt"
     fi ;;
  9) OUT=$OUT/ops STAGES=build,ops OPS_STAGES=perf PERF_OPS=MUL_MAT_SMALL PERF_FILTER="$DENSE32" \
       MODES="${MODES9:-default cta1 kw2 kw8 i8r2k nonarrow}" MODE_cta1=GGML_CUDA_MMQ_NARROW_CTAS_PER_SM=1 \
       MODE_kw2=GGML_CUDA_MMQ_NARROW_KW=2 MODE_kw8=GGML_CUDA_MMQ_NARROW_KW=8 \
       MODE_i8r2k=GGML_CUDA_MMQ_NARROW_DENSE_I8_MIN_ROWS=2048 MODE_nonarrow=GGML_CUDA_MMQ_NARROW=0 \
       MODE_h32=GGML_CUDA_MMQ_NARROW_DENSE_MAX=32 MODE_h32kw8="GGML_CUDA_MMQ_NARROW_DENSE_MAX=32 GGML_CUDA_MMQ_NARROW_KW=8" \
       MODE_q81=GGML_CUDA_MMQ_NARROW_Q8K=0 MODE_ft0=GGML_CUDA_MMQ_NARROW_FULL_TILES=0 PERF_S=40 \
       BUDGET_S=${BUDGET_S:-330} bash bench/device/run.sh ;;
  10) CASES="
bs-model|-|BLOCK_SOFTMAX_HISTORY|d_k=128,d_v=128,n=32,h_k=16,h_v=32,gathered_state=1
z-q6k-4096-n32|-|MUL_MAT_SMALL|type_a=q6_K,.*m=4096,n=32,k=2048,
z-q6k-4096-n32-cta1|GGML_CUDA_MMQ_NARROW_CTAS_PER_SM=1|MUL_MAT_SMALL|type_a=q6_K,.*m=4096,n=32,k=2048,
qkv-q6k-8192-n32|-|MUL_MAT_SMALL|type_a=q6_K,.*m=8192,n=32,k=2048,
head-248320-n32|-|CLOVER_HEAD|n_vocab=248320,n_rows=32,
" SOURCE='block_softmax_history_f32|mul_mat_q_narrow|clover_head_chunks_f32' bash bench/device/stalls.sh ;;
  11) ( OUT=$OUT/c4 EXPERTS_OPS_STAGES=eval experts_ops default default 25 190 > /dev/null 2>&1 )
      grep -ah "FAIL\|passed" "$OUT"/c4/ops/tbo-eval-*.log
      gpu_verify 85 f32,q4_k_m ;;
  12) export MODE_nd=GGML_CUDA_MMQ_NARROW_DENSE_MIN_ROWS=16 MODE_w0=GGML_CUDA_MMQ_NARROW_DENSE_WAVE=0 \
        MODE_w8=GGML_CUDA_MMQ_NARROW_DENSE_WARPS=8
      ( OUT=$OUT/ops STAGES=build,ops EVAL_WIDE=0 EVAL_MODES="default nd" EVAL_OPS=MUL_MAT_SMALL EVAL_FILTER="type_a=$K4" \
          PERF_OPS=MUL_MAT_SMALL PERF_FILTER="$DENSE32" MODES="default w0 w8" PERF_S=30 BUDGET_S=260 \
          bash bench/device/run.sh > /dev/null 2>&1 )
      grep -ah "FAIL\|passed" "$OUT"/ops/ops/tbo-eval-*.log
      sed -n '/^== ops/,$p' "$OUT/ops/run.log"
      gpu_verify 85 f32,q4_k_m ;;
  13) W=${WORK:-/tmp/clover-dev}
      LAYERS=8 STAGES=build,gen,convert BUDGET_S=${BUDGET_S:-330} bash bench/device/run.sh > /dev/null 2>&1
      for k in verify-2-2 raw-ar; do
        PYTHONPATH="$W/site:$W/pure:$W/pylink:$PWD" timeout 90 python3 bench/device/profile.py "$W/clover-8-q4_k_m.gguf" \
          --pass $k --trace 3 > "$OUT/trace-$k.json" 2>> "$OUT/trace.stderr" || tail -3 "$OUT/trace.stderr"
      done
      PYTHONPATH="$W/site:$W/pure:$W/pylink:$PWD" timeout 120 python3 bench/device/timing.py "$W/clover-8-q4_k_m.gguf" \
        --pp "" --reps 20 --warmup 3 --no-sim --coreset-sizes 8 --moe-chunks 0 --out "$OUT/result.json" 2>&1 \
        | grep -a "AR step\|verification\|fused pass\|preview (coreset off)" ;;
  14) gpu_verify 85 f32,q4_k_m
      OUT=$OUT/c13 bash "$0" 13
      ( OUT=$OUT/ops STAGES=build,ops OPS_STAGES=eval EVAL_WIDE=0 EVAL_MODES=default EVAL_OPS=CONCAT,MUL_MAT,BLOCK_SOFTMAX_HISTORY \
          EVAL_FILTER="${EVAL14:-^type=|type_a=f32,type_b=f32,.*n=[1-9],|d_k=}" BUDGET_S=200 \
          bash bench/device/run.sh > /dev/null 2>&1 )
      grep -ah "FAIL\|passed" "$OUT"/ops/ops/tbo-eval-*.log ;;
  15) LAYERS=40 STAGES=build,gen,convert,slots SLOTS_LAYERS=40 SLOTS_GRAPHS=on SLOTS_SETTINGS="${SLOTS15:-slots4:4 slots8:8}" \
        SLOTS_REPS=${SLOTS_REPS:-3} BUDGET_S=${BUDGET_S:-540} bash bench/device/run.sh ;;
  16) export MODE_r1=GGML_CUDA_MMVQ_MOE_RPB=1 MODE_r4=GGML_CUDA_MMVQ_MOE_RPB=4 MODE_r4s=GGML_CUDA_MMVQ_MOE_RPB_SMALL_K=4 \
        MODE_r1l="GGML_CUDA_MMVQ_MOE_RPB=1 GGML_CUDA_MMVQ_MOE_RPB_SMALL_K=2"
      ( OUT=$OUT/ops STAGES=build,ops EVAL_WIDE=0 EVAL_MODES="${EVAL16:-default r1 r4}" EVAL_OPS=MUL_MAT_ID_SMALL,MUL_MAT_ID_SMALL_GLU \
          EVAL_FILTER="(type_a=$K4|type=$K4).*,n=[1-8]," PERF_OPS=MUL_MAT_ID_SMALL,MUL_MAT_ID_SMALL_GLU \
          PERF_FILTER='(m=512,n=[2-8],k=2048|m=2048,n=[2-8],k=512),' MODES="${MODES16:-default r1 r4 r4s r1l default}" PERF_S=20 \
          BUDGET_S=${BUDGET_S:-420} bash bench/device/run.sh > /dev/null 2>&1 )
      grep -ah "FAIL\|passed" "$OUT"/ops/ops/tbo-eval-*.log
      sed -n '/^== ops/,$p' "$OUT/ops/run.log" ;;
  17) W=${WORK:-/tmp/clover-dev}
      LAYERS=40 STAGES=build,gen,convert BUDGET_S=330 bash bench/device/run.sh > /dev/null 2>&1
      PYTHONPATH="$W/site:$W/pure:$W/pylink:$PWD" timeout 150 python3 bench/pass_in_loop.py "$W/clover-40-q4_k_m.gguf" \
        --json "$OUT/pass_in_loop.json" 2> "$OUT/pass_in_loop.stderr" | tail -5
      [ "${SLOTS17:-}" = none ] || OUT=$OUT/slots LAYERS=40 STAGES=build,slots SLOTS_LAYERS=40 SLOTS_GRAPHS=on SLOTS_SETTINGS="${SLOTS17:-slots4:4 slots24:24}" \
        SLOTS_REPS=2 BUDGET_S=${BUDGET_S:-250} bash bench/device/run.sh 2>&1 | sed -n '/median tok/,/GPU memory/p' ;;
  18) t0=$SECONDS
      OUT=$OUT/c17 bash "$0" 17
      OUT=$OUT/c16 BUDGET_S=$((560 - (SECONDS - t0))) bash "$0" 16 ;;
  19) LAYERS=40 STAGES=build,gen,convert,slots SLOTS_LAYERS=40 SLOTS_REPS=${SLOTS_REPS:-2} BUDGET_S=${BUDGET_S:-565} \
        SLOTS_SETTINGS="${SLOTS19:-slots4:LLAMA_GRAPH_CACHE=4,LLAMA_GRAPH_CACHE_MIB=0 pool:LLAMA_GRAPH_CACHE=32}" \
        SLOTS_GRAPHS="${PROCS19:-on keep:GGML_CUDA_GRAPH_EVICT_S=0 first:GGML_CUDA_GRAPH_EVICT_S=0,GGML_CUDA_GRAPH_CAPTURE_FIRST=1}" \
        bash bench/device/run.sh 2>&1 | sed -n '/median tok/,/GPU memory/p' ;;
  20) t0=$SECONDS
      OUT=$OUT/c17 SLOTS17=none bash "$0" 17
      OUT=$OUT/c16 BUDGET_S=$((560 - (SECONDS - t0))) bash "$0" 16 ;;
  *) echo "call 1-6, 9-20" >&2; exit 2 ;;
esac
rc=$?
cp "$OUT/ops/kernels.json" "$OUT/" 2>/dev/null
# (the archive written beside $OUT, then moved in: a tar of a folder it writes into exits 1)
( cd "$OUT" && tar czf "$OUT.all.tgz" --exclude=all.tgz --exclude=result.json --exclude=run.log --exclude=kernels.json . \
    && mv "$OUT.all.tgz" all.tgz && find . -mindepth 1 -type f ! -name all.tgz ! -name result.json ! -name run.log ! -name kernels.json -delete \
    && find . -mindepth 1 -type d -empty -delete )
exit $rc
