#!/usr/bin/env bash
# The small-batch CUDA kernels of patches/01xx (issue 12) on the lent H200, in one call: build the
# patched tree's CUDA libraries with CMake, check the changed ops against the CPU
# (test-backend-ops), time them before/after in the same build, time the engine's passes
# before/after, print a short table last; everything under $OUT.
#
#   bash bench/device/kernels.sh        (in the repo root there; carry [".devcarry"], made here by
#                                        `.venv/bin/python bench/device/prepare.py`)
#
# Before/after: one build; each mode is a measurement switch read once per process: legacy
# (GGML_CUDA_CLOVER_LEGACY=1) puts the kernels back on their upstream paths, nosmall
# (GGML_CUDA_MMQ_SMALL_BLOCKS=0) only MMQ's 8-32 column configs (patch 0103), default is the series
# (0103's small blocks for routed experts), smalldense the series with the small blocks for dense
# matmuls too (=2), tiles the series with MMQ's stream-k run one block per tile, no fix-up (patch
# 0104's switch at 0), nonarrow the series without patch 0105's narrow kernel (GGML_CUDA_MMQ_NARROW=0:
# dense 9-16 columns back on 0102's MMVQ chunks, experts of 9-32 tokens on MMQ), narrowall the narrow
# kernel from 1 column on (GGML_CUDA_MMQ_NARROW_MIN=1, instead of MMVQ at 1-8). "wide" also lets the
# new paths take larger batches than their defaults
# (GGML_CUDA_MMVQ_MAX_COLS=64, GGML_CUDA_MMQ_TILE_PER_EXPERT_MAX_BATCH=512), to find the crossovers.
#
# Environment (all optional):
#   STAGES    comma list of build,gen,eval,perf,passes,wide,upstream
#             (default build,gen,eval,perf,passes; what does not fit in BUDGET_S is skipped and a
#             second call on the still-warm machine, e.g. STAGES=build,gen,passes,wide, picks it up:
#             the build, the model file and the logs stay in $WORK, the table covers all calls)
#             gen: the 4-layer Q4_K_M file for `passes` (run.sh's gen + convert, while building);
#             eval: test-backend-ops `test` of MUL_MAT_ID_SMALL / MUL_MAT_SMALL / MUL_MAT_ID_SMALL_GLU (the
#             cases of bench/device/kernels-test-cases.patch) against the CPU, default and wide paths;
#             perf: the same ops' perf cases at the model's shapes, in each of MODES;
#             passes: bench/device/timing.py (engine passes, no simulations; experts in one dispatch
#             and in chunks of 8 rows, llama_clover_bench_tuning of patch 0007), in each of
#             PASS_MODES (a mode named twice runs twice: the table takes the median per pass);
#             wide: the perf cases with the new paths beyond their default limits;
#             upstream: upstream's own MUL_MAT_ID eval cases with the wide paths
#   MODES     the perf stage's modes, in order (default "legacy nosmall default"); with narrowall among
#             MODES or PASS_MODES the eval stage also checks the narrow kernel at 1-8 columns
#   EVAL_MODES  the modes whose paths the eval stage checks (default "default"; e.g. a MODE_<tag>)
#   EVAL_OPS   the ops the eval stage checks (default MUL_MAT_ID_SMALL,MUL_MAT_SMALL,MUL_MAT_ID_SMALL_GLU,MUL_MAT_SMALL_GLU;
#             e.g. add upstream's MUL_MAT,MUL_MAT_ID for a change to every MMQ launch; on the H200
#             MUL_MAT_ID_SMALL with MUL_MAT_ID_SMALL_GLU, 692 cases, take about 150 s a mode, the
#             dense and 9-64-column cases of MUL_MAT_SMALL, MUL_MAT and MUL_MAT_ID_SMALL about 45 s)
#   PERF_OPS   the ops the perf stage times (default MUL_MAT_ID_SMALL,MUL_MAT_SMALL and the two _GLU ops;
#             e.g. add GATED_DELTA_NET, whose perf cases at the model's head shape the cases patch adds)
#   EVAL_WIDE  0: no eval of the wide paths (default 1)
#   EVAL_FILTER, PERF_FILTER  test-backend-ops -p regexes on the cases' parameters (default: all)
#   MODE_<tag>  "VAR=V ..." : a mode of its own for MODES / PASS_MODES, e.g. MODE_kw8="GGML_CUDA_MMQ_NARROW_KW=8"
#   PASS_MODES  the passes stage's (default "legacy nosmall default nosmall default")
#   BUDGET_S  seconds after which the remaining stages are skipped        (default 550)
#   PERF_S    seconds a perf mode may run (default 150: all cases took more than 110 s on the H200)
#   JOBS      build jobs (default: all cores);  WORK  scratch (default /tmp/clover-kernels)
#   LAYERS    layers of the timed file (default 4);  REPS  timing.py repetitions (default 20)
#   GGML_CUDA, BACKEND  ON, CUDA0 (OFF, CPU: a dry run of the script on a machine without a GPU)
#   VARIANT_PATCH  an experiment on top of the series (a patch file), applied
#             before the build; its before/after is the carried prebuilt libraries (run.sh's ops stage)
#   PREBUILT  1: no build; the libraries in LIBDIR and the test-backend-ops binary TBO are used as
#             they are (run.sh's ops stage: its wheel's libraries, test-backend-ops built beside them)
set -u -o pipefail
T0=$(date +%s)
REPO=$(pwd)
OUT=${OUT:-/tmp/clover-kernels-out}; mkdir -p "$OUT"
WORK=${WORK:-/tmp/clover-kernels}; mkdir -p "$WORK"
CARRY=${CARRY:-$REPO/.devcarry}
STAGES=${STAGES:-build,gen,eval,perf,passes}
BUDGET_S=${BUDGET_S:-550}
MODES=${MODES:-legacy nosmall default}
PASS_MODES=${PASS_MODES:-legacy nosmall default nosmall default}
EVAL_MODES=${EVAL_MODES:-default}
EVAL_WIDE=${EVAL_WIDE:-1}
JOBS=${JOBS:-$(nproc)}
LAYERS=${LAYERS:-4}
REPS=${REPS:-20}
PERF_S=${PERF_S:-150}
PY=${PY:-python3}
GGML_CUDA=${GGML_CUDA:-ON}
BACKEND=${BACKEND:-CUDA0}
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1

log() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/kernels.log"; }
left() { echo $(( BUDGET_S - ($(date +%s) - T0) )); }
want() { [[ ",$STAGES," == *",$1,"* ]]; }
skip() { log "SKIP $1: $2"; echo "{\"stage\": \"$1\", \"skipped\": \"$2\"}" >> "$OUT/notes.jsonl"; }
mode_env() {  # the switches of a mode (see the header; MODE_<tag>="VAR=V ..." defines a mode <tag>)
  local custom="MODE_$1"
  if [ -n "${!custom:-}" ]; then echo "GGML_CUDA_CLOVER_LEGACY=0 ${!custom}"; return; fi
  case $1 in
    legacy) echo GGML_CUDA_CLOVER_LEGACY=1 ;;
    nosmall) echo GGML_CUDA_CLOVER_LEGACY=0 GGML_CUDA_MMQ_SMALL_BLOCKS=0 ;;
    default) echo GGML_CUDA_CLOVER_LEGACY=0 ;;
    smalldense) echo GGML_CUDA_CLOVER_LEGACY=0 GGML_CUDA_MMQ_SMALL_BLOCKS=2 ;;
    tiles) echo GGML_CUDA_CLOVER_LEGACY=0 GGML_CUDA_MMQ_TILES_MIN_EFFICIENCY=0 ;;
    nonarrow) echo GGML_CUDA_CLOVER_LEGACY=0 GGML_CUDA_MMQ_NARROW=0 ;;
    narrowall) echo GGML_CUDA_CLOVER_LEGACY=0 GGML_CUDA_MMQ_NARROW_MIN=1 ;;
    *) echo "unknown mode $1" >&2; exit 2 ;;
  esac
}

SRC_TGZ="$CARRY/llama-src.tar.gz"
[ -f "$SRC_TGZ" ] || { log "no $SRC_TGZ: run bench/device/prepare.py here and carry .devcarry"; exit 2; }
SRC_SHA=$( (sha256sum "$SRC_TGZ" bench/device/kernels-test-cases.patch ${VARIANT_PATCH:+"$VARIANT_PATCH"} | cut -c1-64) \
    | sha256sum | cut -c1-16)
log "kernels.sh: stages=$STAGES budget=${BUDGET_S}s jobs=$JOBS src=$SRC_SHA"
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader
  nvcc --version | tail -2 | head -1; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt" | tee -a "$OUT/kernels.log"

# ---- the model file for the pass timings: run.sh's gen + convert, in the background ---------------
RUN_PID=""
GGUF="$WORK/run/clover-$LAYERS-q4_k_m.gguf"
if want gen && [ ! -f "$GGUF" ]; then
  mkdir -p "$OUT/run" "$WORK/run"
  threads=$JOBS; want build && [ ! -f "$WORK/.built-$SRC_SHA" ] && threads=4
  ( STAGES=gen,convert LAYERS=$LAYERS QUANTS=q4_k_m JOBS=$threads BUDGET_S=400 OUT="$OUT/run" WORK="$WORK/run" \
      bash bench/device/run.sh > "$WORK/run.log" 2>&1 ) &
  RUN_PID=$!
fi

# ---- build: ggml + llama (shared, CUDA sm_90) and test-backend-ops --------------------------------
TREE="$WORK/src/llama_cpp_python-0.3.36"
V="$TREE/vendor/llama.cpp"
B="$WORK/build"
TBO=${TBO:-$WORK/test-backend-ops}
LIBDIR=${LIBDIR:-$B/bin}
if [ -n "${PREBUILT:-}" ]; then
  [ -x "$TBO" ] && [ -d "$LIBDIR" ] || { log "PREBUILT: no executable TBO=$TBO or no LIBDIR=$LIBDIR"; exit 1; }
  log "prebuilt: libraries in $LIBDIR, $TBO"
elif want build && [ ! -f "$WORK/.built-$SRC_SHA" ]; then
  rm -rf "$WORK/src" "$B" "$TBO"; mkdir -p "$WORK/src"
  tar xzf "$SRC_TGZ" -C "$WORK/src"
  if [ ! -f "$V/tests/test-backend-ops.cpp" ]; then
    log "no tests/test-backend-ops.cpp in the carried source (prepare.py keeps it): no op checks"
  else
    ( cd "$V" && patch -p1 --forward --batch < "$REPO/bench/device/kernels-test-cases.patch" ) >> "$OUT/kernels.log" 2>&1 \
      || log "kernels-test-cases.patch does not apply"
  fi
  if [ -n "${VARIANT_PATCH:-}" ]; then
    ( cd "$V" && patch -p1 --forward --batch < "$REPO/$VARIANT_PATCH" ) >> "$OUT/kernels.log" 2>&1 \
      || { log "VARIANT_PATCH $VARIANT_PATCH does not apply"; exit 1; }
    log "variant: $VARIANT_PATCH applied on top of the series"
  fi
  log "build: cmake ggml + llama (CUDA sm_90, $JOBS jobs)"
  t=$(date +%s)
  cmake -S "$V" -B "$B" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
      -DGGML_CUDA=$GGML_CUDA -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_GRAPHS=ON -DGGML_NATIVE=ON \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF \
      -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF > "$WORK/cmake.log" 2>&1 \
    || { tail -30 "$WORK/cmake.log" | tee -a "$OUT/kernels.log"; log "cmake configure FAILED"; exit 1; }
  CXX_USED=$(grep -m1 '^CMAKE_CXX_COMPILER:' "$B/CMakeCache.txt" | cut -d= -f2)
  # test-backend-ops needs only ggml's headers to compile: alongside the CUDA build, linked after it
  if [ -f "$V/tests/test-backend-ops.cpp" ]; then
    ( "$CXX_USED" -O2 -std=c++17 -pthread -I"$V/ggml/include" -c "$V/tests/test-backend-ops.cpp" -o "$WORK/tbo.o" \
        > "$WORK/tbo.log" 2>&1 ) &
    TBO_PID=$!
  fi
  cmake --build "$B" -j "$JOBS" --target llama > "$WORK/build.log" 2>&1
  rc=$?
  tail -c 30000 "$WORK/build.log" > "$OUT/build-tail.log"
  [ $rc -eq 0 ] || { log "build FAILED (rc $rc): see build-tail.log"; grep -m20 -E "error" "$WORK/build.log" | tee -a "$OUT/kernels.log"; exit 1; }
  echo $(( $(date +%s) - t )) > "$WORK/build_s.txt"
  log "build done in $(cat "$WORK/build_s.txt") s"
  if [ -n "${TBO_PID:-}" ]; then
    wait "$TBO_PID" && "$CXX_USED" -o "$TBO" "$WORK/tbo.o" -L"$B/bin" -lggml -lggml-base -pthread -Wl,-rpath,"$B/bin" \
        >> "$WORK/tbo.log" 2>&1 || { tail -20 "$WORK/tbo.log" | tee -a "$OUT/kernels.log"; log "test-backend-ops did not build"; }
  fi
  rm -rf "$WORK/logs"
  touch "$WORK/.built-$SRC_SHA"
fi
if [ -n "${PREBUILT:-}" ]; then
  export LD_LIBRARY_PATH="$LIBDIR:${LD_LIBRARY_PATH:-}"
else
  [ -f "$WORK/.built-$SRC_SHA" ] || { log "no build for this source: add build to STAGES"; exit 1; }
  # the build compiler's libstdc++ first (the image's /opt/gcc: see run.sh's runtime_check)
  CXX_USED=$(grep -m1 '^CMAKE_CXX_COMPILER:' "$B/CMakeCache.txt" | cut -d= -f2)
  export LD_LIBRARY_PATH="$(dirname "$("$CXX_USED" -print-file-name=libstdc++.so.6)"):$LIBDIR:${LD_LIBRARY_PATH:-}"
fi

# ---- test-backend-ops: correctness against the CPU, then per-op timings -------------------------
LOGS="$WORK/logs"; mkdir -p "$LOGS"  # this build's logs, of every call
OPS="MUL_MAT_ID_SMALL,MUL_MAT_SMALL"
GLU_OPS="MUL_MAT_ID_SMALL_GLU,MUL_MAT_SMALL_GLU" # gate + up + GLU: whole graphs, as the fusion sees them
WIDE=(GGML_CUDA_MMVQ_MAX_COLS=64 GGML_CUDA_MMQ_TILE_PER_EXPERT_MAX_BATCH=512)
tbo() {  # $1 log name, $2 seconds allowed, then env assignments and test-backend-ops arguments
  local name=$1 limit=$2; shift 2
  log "test-backend-ops $name: $*"
  timeout "$limit" env "$@" > "$LOGS/tbo-$name.log" 2>&1
  local rc=$?
  tail -3 "$LOGS/tbo-$name.log" | tee -a "$OUT/kernels.log"
  [ $rc -eq 124 ] && skip "tbo-$name" "timed out after $limit s (partial log kept)"
  # a crash (not a failed comparison, not the time limit): the case it died in once more under
  # compute-sanitizer, whose report names the kernel and the bad access
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $rc -ne 1 ] && command -v compute-sanitizer > /dev/null; then
    local last; last=$(grep -aoE '^  MUL_MAT\w*\(([^)]*)\)' "$LOGS/tbo-$name.log" | tail -1 | sed -E 's/^  (\w+)\((.*)\)$/\1 \2/')
    if [ -n "$last" ]; then
      log "tbo-$name crashed (rc $rc) in ${last%% *}(${last#* }): compute-sanitizer"
      timeout 120 compute-sanitizer --print-limit 5 env "$@" -o "${last%% *}" -p "^$(printf '%s' "${last#* }" | sed 's/[][().*+?^$|\\]/\\&/g')\$" \
          > "$LOGS/tbo-$name-sanitizer.log" 2>&1
      grep -m12 -E "=========|Invalid|Address|at 0x" "$LOGS/tbo-$name-sanitizer.log" | tee -a "$OUT/kernels.log"
    fi
  fi
  return 0
}
if [ -x "$TBO" ]; then
  if want eval; then
    for mode in $EVAL_MODES; do
      tbo eval-$mode 240 $(mode_env $mode) "$TBO" test -b $BACKEND -o "${EVAL_OPS:-$OPS,$GLU_OPS}" ${EVAL_FILTER:+-p "$EVAL_FILTER"}
    done
    [[ " $MODES $PASS_MODES " == *" narrowall "* ]] && tbo eval-narrowall 120 $(mode_env narrowall) "$TBO" test -b $BACKEND \
        -o "$OPS" -p "${EVAL_FILTER:+$EVAL_FILTER.*}n=[1-8],"
    [[ " $MODES $PASS_MODES " == *" tiles "* ]] && tbo eval-tiles 120 $(mode_env tiles) "$TBO" test -b $BACKEND -o "$OPS"
    # wide moves only MUL_MAT_SMALL's paths (the MUL_MAT_ID_SMALL cases stay within 64 rows)
    [ "$EVAL_WIDE" = 1 ] && tbo eval-wide 60 "${WIDE[@]}" "$TBO" test -b $BACKEND -o MUL_MAT_SMALL
  fi
  if want perf; then
    for mode in $MODES; do
      if (( $(left) < PERF_S + 10 )); then skip "perf-$mode" "too little time left ($(left) s)"; continue; fi
      tbo perf-$mode "$PERF_S" $(mode_env $mode) "$TBO" perf -b $BACKEND -o "${PERF_OPS:-$OPS,$GLU_OPS}" ${PERF_FILTER:+-p "$PERF_FILTER"}
    done
  fi
else
  want eval && skip eval "no test-backend-ops"
  want perf && skip perf "no test-backend-ops"
fi

# ---- engine passes in each of PASS_MODES, same build ----------------------------------------------
if want passes; then
  if [ -n "$RUN_PID" ]; then log "waiting for gen + convert"; wait "$RUN_PID"; RUN_PID=""; tail -5 "$WORK/run.log" >> "$OUT/kernels.log"; fi
  SITE="$WORK/site"
  rm -rf "$SITE"; mkdir -p "$SITE/llama_cpp/lib"
  cp -r "$TREE/llama_cpp/." "$SITE/llama_cpp/"
  cp -P "$B"/bin/lib*.so* "$SITE/llama_cpp/lib/"
  export PYTHONPATH="$SITE:$WORK/run/pure:$WORK/run/pylink:$REPO"
  # Python loads a libstdc++ before libllama: the image's older one segfaults a library built by
  # /opt/gcc (run.sh's runtime_check); the build compiler's, preloaded, does not
  if [ -f "$GGUF" ] && ! timeout 60 $PY bench/device/timing.py "$GGUF" --check > "$LOGS/check.log" 2>&1; then
    export LD_PRELOAD="$(dirname "$("$CXX_USED" -print-file-name=libstdc++.so.6)")/libstdc++.so.6"
    log "load check failed; LD_PRELOAD=$LD_PRELOAD"
    timeout 60 $PY bench/device/timing.py "$GGUF" --check > "$LOGS/check.log" 2>&1 || log "load check fails with it too"
  fi
  if [ ! -f "$GGUF" ]; then skip passes "no $GGUF (see run/run.log)"
  else
    declare -A nrun=()
    for mode in $PASS_MODES; do
      nrun[$mode]=$(( ${nrun[$mode]:-0} + 1 ))
      name=$mode; (( ${nrun[$mode]} > 1 )) && name=$mode-${nrun[$mode]}
      [ -f "$LOGS/passes-$name.json" ] && continue  # a warm second call keeps the first call's runs
      if (( $(left) < 60 )); then skip "passes-$name" "too little time left ($(left) s)"; continue; fi
      log "timing.py $name on $GGUF"
      env $(mode_env $mode) timeout 150 $PY bench/device/timing.py "$GGUF" --out "$LOGS/passes-$name.json" \
          --reps "$REPS" --pp 512 --no-sim --moe-chunks 0,8 --label "kernels-$name" \
          > "$LOGS/passes-$name.log" 2>&1 || { tail -15 "$LOGS/passes-$name.log" | tee -a "$OUT/kernels.log"; skip "passes-$name" "timing.py failed"; }
    done
  fi
fi

# what is left: the new paths beyond their default limits, then upstream's own MUL_MAT_ID cases
if want wide && [ -x "$TBO" ]; then
  if (( $(left) < 90 )); then skip perf-wide "too little time left ($(left) s)"
  else tbo perf-wide $(( $(left) - 30 < 100 ? $(left) - 30 : 100 )) "${WIDE[@]}" "$TBO" perf -b $BACKEND -o "$OPS"; fi
fi
if want upstream && [ -x "$TBO" ] && (( $(left) > 60 )); then
  tbo eval-upstream-mmid $(( $(left) - 20 )) "${WIDE[@]}" "$TBO" test -b $BACKEND -o MUL_MAT_ID
fi

# ---- table + JSON --------------------------------------------------------------------------------
if [ -n "$RUN_PID" ]; then  # gen + convert for a later call: let it finish within the budget
  log "waiting for gen + convert (for a later call)"
  ( sleep $(( $(left) > 10 ? $(left) : 10 )); kill "$RUN_PID" 2>/dev/null ) & KILLER=$!
  wait "$RUN_PID"; kill "$KILLER" 2>/dev/null
  tail -3 "$WORK/run.log" >> "$OUT/kernels.log"
fi
log "summary"
[ -f "$OUT/notes.jsonl" ] && cat "$OUT/notes.jsonl" >> "$LOGS/notes.jsonl"
cp "$OUT/machine.txt" "$LOGS/"
cp "$LOGS"/tbo-* "$LOGS"/passes-* "$OUT/" 2>/dev/null
$PY bench/device/kernels_table.py "$LOGS" --out "$OUT/kernels.json" --build-s "$(cat "$WORK/build_s.txt" 2>/dev/null || echo 0)" \
    2>&1 | tee -a "$OUT/kernels.log"
log "done in $(( $(date +%s) - T0 )) s"
