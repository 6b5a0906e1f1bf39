#!/usr/bin/env bash
# Why a small-batch matmul kernel runs above its byte floor, on the lent H200: Nsight Compute's
# throughput, occupancy and warp-stall sections for single test-backend-ops cases (the cases of
# bench/device/kernels-test-cases.patch), each op run once in `test` mode (or, for the cases only perf
# mode has, its first launches in `perf` mode) with the caches flushed before every kernel (weights
# come from DRAM, as in a pass). One CSV row per kernel; summary: stalls_table.py.
#
#   bash bench/device/stalls.sh      (in the repo root there; carry [".devcarry"] from
#                                     `prepare.py --prebuilt build/cuda-local`)
#
# Environment (optional): CASES  lines "label|VAR=V ...|op|regex" (the switches of patches 01xx, e.g.
# GGML_CUDA_MMQ_NARROW=0; "-" for none); SOURCE  a kernel-name regex: also the source page of the
# first kernel of that name in each case, in the mode that profiled (SourceCounters and
# InstructionStats: instructions executed and warp-stall samples per SASS instruction) as
# src-<label>.csv; WORK (default /tmp/clover-dev), OUT.
set -u -o pipefail
OUT=${OUT:-/tmp/clover-out}; mkdir -p "$OUT"
WORK=${WORK:-/tmp/clover-dev}
T0=$(date +%s)
log() { echo "[+$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/stalls.log"; }

# the CUDA libraries and test-backend-ops, as run.sh's ops stage makes them (OPS_STAGES=none: no op runs)
STAGES=build,ops OPS_STAGES=none BUDGET_S=300 OUT="$OUT/run" WORK="$WORK" bash bench/device/run.sh > /dev/null 2>&1
TBO="$WORK/test-backend-ops"; LIB="$WORK/site/llama_cpp/lib"
[ -x "$TBO" ] || { log "no test-backend-ops"; tail -20 "$OUT/run/run.log"; exit 1; }
export LD_LIBRARY_PATH="$LIB:${LD_LIBRARY_PATH:-}"

DEFAULT_CASES="
experts-q4k-256|-|MUL_MAT_ID_SMALL|type_a=q4_K,type_b=f32,n_mats=256,n_used=8,b=1,m=512,n=32,k=2048,.*n_active=256$
experts-q4k-256-mmq|GGML_CUDA_MMQ_NARROW=0|MUL_MAT_ID_SMALL|type_a=q4_K,type_b=f32,n_mats=256,n_used=8,b=1,m=512,n=32,k=2048,.*n_active=256$
experts-q6k-256|-|MUL_MAT_ID_SMALL|type_a=q6_K,type_b=f32,n_mats=256,n_used=8,b=0,m=2048,n=32,k=512,.*n_active=256$
experts-q4k-8|-|MUL_MAT_ID_SMALL|type_a=q4_K,type_b=f32,n_mats=256,n_used=8,b=1,m=512,n=32,k=2048,.*n_active=8$
experts-q4k-256-n64|-|MUL_MAT_ID_SMALL|type_a=q4_K,type_b=f32,n_mats=256,n_used=8,b=1,m=512,n=64,k=2048,.*n_active=256$
experts-q4k-256-n4|-|MUL_MAT_ID_SMALL|type_a=q4_K,type_b=f32,n_mats=256,n_used=8,b=1,m=512,n=4,k=2048,.*n_active=256$
dense-q6k-8192-n32|-|MUL_MAT_SMALL|type_a=q6_K,.*m=8192,n=32,k=2048,
dense-q6k-8192-n16|-|MUL_MAT_SMALL|type_a=q6_K,.*m=8192,n=16,k=2048,
dense-q6k-8192-n1|-|MUL_MAT_SMALL|type_a=q6_K,.*m=8192,n=1,k=2048,
dense-q6k-2048-n32|-|MUL_MAT_SMALL|type_a=q6_K,.*m=2048,n=32,k=4096,
"
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats"
NCU="ncu --clock-control none --cache-control all $SECTIONS --csv --page raw"
ncu --version | tail -1 | tee -a "$OUT/stalls.log"
while IFS='|' read -r label envs op regex; do
  [ -n "$label" ] || continue
  [ "$envs" = - ] && envs=""
  log "$label ($envs): $op $regex"
  # test mode runs the op once; perf mode (the first launches only) where test mode profiled nothing
  for m in test perf; do
    extra=""; [ $m = perf ] && extra="--launch-count 12"
    timeout 240 env $envs $NCU $extra --log-file "$OUT/ncu-$label.csv" \
        "$TBO" $m -b CUDA0 -o "$op" -p "$regex" > "$OUT/tbo-$label.log" 2>&1 \
      || log "$label: ncu $m failed ($(tail -2 "$OUT/tbo-$label.log" | tr '\n' ' '))"
    grep -q "No kernels were profiled" "$OUT/ncu-$label.csv" || break
    log "$label: nothing profiled in $m mode"; head -c 1500 "$OUT/tbo-$label.log" >> "$OUT/stalls.log"
  done
  grep -c '^"' "$OUT/ncu-$label.csv" | sed "s/^/$label: csv lines /" | tee -a "$OUT/stalls.log"
  if [ -n "${SOURCE:-}" ]; then
    timeout 240 env $envs ncu --clock-control none --cache-control all --section SourceCounters --section InstructionStats \
        --section WarpStateStats -k "regex:$SOURCE" --launch-count 1 -f -o "$OUT/src-$label" \
        "$TBO" $m -b CUDA0 -o "$op" -p "$regex" > "$OUT/tbo-src-$label.log" 2>&1 \
      && ncu -i "$OUT/src-$label.ncu-rep" --page source --csv --print-source sass > "$OUT/src-$label.csv" 2> "$OUT/src-$label.err" \
      || log "$label: source page failed ($(tail -2 "$OUT/tbo-src-$label.log" "$OUT/src-$label.err" 2>/dev/null | tr '\n' ' '))"
    rm -f "$OUT/src-$label.ncu-rep"
    log "$label: source page $(wc -l < "$OUT/src-$label.csv" 2>/dev/null) lines"
  fi
done <<< "${CASES:-$DEFAULT_CASES}"
log "done"
# written beside $OUT, then moved in: a tar of a folder it writes into reports "file changed" (exit 1)
tar czf "$OUT.stalls.tgz" -C "$OUT" --exclude=stalls.tgz . && mv "$OUT.stalls.tgz" "$OUT/stalls.tgz"
