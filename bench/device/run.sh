#!/usr/bin/env bash
# One run on the lent H200 (a bare machine, no network): build the (patched) CUDA wheel, make a
# full-width synthetic checkpoint, convert it, time it, check GPU parity; results under $OUT.
#
#   bash bench/device/run.sh          (in the repo root there; carry [".devcarry"], made here by
#                                      `.venv/bin/python bench/device/prepare.py`)
#
# Environment (all optional):
#   STAGES    comma list of build,gen,convert,baseline,clover,loops,parity,cbench,nographs,spec (default: all but spec)
#             loops: bench/step_in_loop.py on each clover file beside its qwen35moe twin (the `ar` loop, a = 0
#             and upstream's step round-robin in one process) -> result.json's loops_one_process
#             slots: bench/graph_slots.py (the labelled simulations with patch 0401's slots on and off, in one
#             process, with each pass shape's time) on the clover files of $SLOTS_LAYERS (default: the
#             smallest), CUDA graphs on and off ($SLOTS_GRAPHS, default "on off"; an entry "tag:VAR=V[,VAR=V...]"
#             is a process with those variables set, CUDA graphs on) -> $OUT/slots-*.json; $SLOTS_SETTINGS
#             (graph_slots.py's --settings, e.g. "slots:4 slots8:8") and $SLOTS_REPS replace its defaults
#             spec: bench/spec_iterations.py on every clover file of the first quant under each of $SPEC's
#             settings (same form as $SWEEP; default "slots:LLAMA_GRAPH_CACHE=4 one-graph:LLAMA_GRAPH_CACHE=0",
#             patch 0401's graph slots on and off), with $SPEC_ARGS (e.g. "--between --first-draft 3")
#             cbench: `clover bench --simulate` on the largest clover file of the first quant;
#             nographs: its engine passes again with GGML_CUDA_DISABLE_GRAPHS=1 (what CUDA graphs buy)
#             sweep: every clover file of the first quant again under each of $SWEEP's settings,
#             "tag:VAR=V[,VAR=V...] ..." (e.g. "mmvq32:GGML_CUDA_MMVQ_MAX_COLS=32"), tag <file>-<tag>;
#             only the layer counts in $SWEEP_LAYERS (default: all of LAYERS); the first prompt length
#             and no loop simulations, or with SWEEP_FULL=1 as the clover stage times (a before/after
#             of the simulations)
#             legacy: every clover file of the first quant again with GGML_CUDA_CLOVER_LEGACY=1 (the
#             01xx kernels back on upstream's paths, same build: before/after), tag <file>-legacy
#             profile: one pass of each kind under Nsight Compute on the smallest clover file
#             trace: $TRACE_PASSES (default "preview fused") on the smallest clover file, $TRACE_REPS passes
#             (default 5) under CUPTI's activity tracing (bench/device/profile.py --trace): the kernels as
#             they ran in the CUDA graph, overlaps included -> $OUT/trace-<pass>.json
#             cpumoe: the largest clover file of the first quant with the routed experts in system RAM
#             (--cpu-moe) and everything else on the GPU: upstream's AR step on its qwen35moe twin
#             with the same placement, the engine's passes, the labelled simulations; the passes
#             again with --no-op-offload (batches on the CPU's copy of the experts)
#             (bench/device/profile.py: GPU time per kernel kind against the pass's wall time)
#             extrabufts: ggml-cpu's AMX / CPU_REPACK matmuls against plain buffers, the pinned
#             kernel and patch 0201, in a native CPU-only ggml build (bench/device/extra_bufts_check.sh)
#             parity: `clover verify` on CPU (extra buffer types on and off) and GPU, presets
#             $PARITY_PRESETS (default tiny,small; full-width = 4 layers), file types $PARITY_QUANTS
#             (default f32,q8_0,q4_k_m), cut off 20 s before the budget ends (parity.json keeps every
#             file finished; a full-width file's three verifies take more than 5 minutes: one type a call)
#             ops: test-backend-ops with the cases of kernels-test-cases.patch (compiled while the
#             build runs, linked to the built libraries): the changed CUDA ops checked against the CPU
#             (eval), then timed with the 01xx kernels and with GGML_CUDA_CLOVER_LEGACY=1 (perf), by
#             `PREBUILT=1 kernels.sh` into $OUT/ops ($OPS_STAGES, default eval,perf)
#   LAYERS    layer counts to time, e.g. "4 8"; the largest is generated and converted, the
#             others are its first N layers (bench/device/gguf_variant.py)          (default "4 8")
#   GEN_LAYERS  layers generated and converted instead of the largest of LAYERS (a multiple of 4):
#             larger counts repeat its layers, e.g. LAYERS="8 40" GEN_LAYERS=8 times the real
#             40-layer shapes from an 8-layer checkpoint; the checkpoint is then deleted after
#             conversion (disk), unless the parity stage wants it
#   QUANTS    converter outtypes, e.g. "q4_k_m q8_0"                     (default "q4_k_m")
#   BUDGET_S  seconds after which remaining stages are skipped (a run must end inside 600 s,
#             leave margin for the copy back)                            (default 510)
#   REPS      timed repetitions per measurement                           (default 30)
#   PP        prompt lengths for prompt processing                        (default "512,8192")
#   JOBS      build jobs (default: all cores);  WORK  scratch dir (default /tmp/clover-dev)
#   LABEL     run label in the result file name                           (default "h200")
#   BUILD_CC, BUILD_CXX  host compilers for the build (default: the image's, /opt/gcc/bin/g++)
# A later call on the still-warm machine reuses $WORK (wheel, checkpoint, GGUFs) when the carried
# source is the same, so the lead can split the work over up to three calls.
set -u -o pipefail
T0=$(date +%s)
REPO=$(pwd)
OUT=${OUT:-/tmp/clover-out}; mkdir -p "$OUT"
WORK=${WORK:-/tmp/clover-dev}; mkdir -p "$WORK"
CARRY=${CARRY:-$REPO/.devcarry}
STAGES=${STAGES:-build,gen,convert,baseline,clover,loops,parity,cbench,nographs,profile}
LAYERS=${LAYERS:-4 8}
QUANTS=${QUANTS:-q4_k_m}
BUDGET_S=${BUDGET_S:-510}
REPS=${REPS:-30}
PP=${PP:-512,8192}
JOBS=${JOBS:-$(nproc)}
LABEL=${LABEL:-h200}
PY=${PY:-python3}
PRESET=${PRESET:-full-width}
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1

log() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/run.log"; }
left() { echo $(( BUDGET_S - ($(date +%s) - T0) )); }
want() { [[ ",$STAGES," == *",$1,"* ]]; }
note() { log "SKIP $1: $2"; echo "{\"stage\": \"$1\", \"skipped\": \"$2\"}" >> "$OUT/notes.jsonl"; }

LMAX=0; for l in $LAYERS; do (( l > LMAX )) && LMAX=$l; done
LMIN=$LMAX; for l in $LAYERS; do (( l < LMIN )) && LMIN=$l; done
GEN=${GEN_LAYERS:-$LMAX}
SRC_TGZ="$CARRY/llama-src.tar.gz"
[ -f "$SRC_TGZ" ] || { log "no $SRC_TGZ: run bench/device/prepare.py here and carry .devcarry"; exit 2; }
SRC_SHA=$( (sha256sum "$SRC_TGZ" | cut -c1-64; echo "${BUILD_CC:-}${BUILD_CXX:-}") | sha256sum | cut -c1-16)

# ---- machine ---------------------------------------------------------------------------------
log "run.sh: stages=$STAGES layers='$LAYERS' quants='$QUANTS' budget=${BUDGET_S}s jobs=$JOBS src=$SRC_SHA"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader
  nvcc --version | tail -2 | head -1
  $PY -c 'import platform,os; print(platform.platform(), os.cpu_count(), "cores")'
  grep -m1 "model name" /proc/cpuinfo
  df -h /tmp | tail -1
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt" | tee -a "$OUT/run.log"

# the pinned sdist's files our code reads (source.read_member looks in the cache first: no network)
export CLOVER_CACHE="$WORK/cache"
VOCAB=vendor/llama.cpp/models/ggml-vocab-qwen35.gguf
if [ ! -f "$CLOVER_CACHE/members/$VOCAB" ]; then
  mkdir -p "$CLOVER_CACHE/members"
  tar xzf "$SRC_TGZ" -C "$CLOVER_CACHE/members" --strip-components=1 "llama_cpp_python-0.3.36/$VOCAB" \
    || log "could not extract $VOCAB from the carried source"
fi

# python paths: pure wheels + our packages (convert/ is imported as clover_convert, patches/ as clover_patches)
mkdir -p "$WORK/pylink" "$WORK/pure"
ln -sfn "$REPO/convert" "$WORK/pylink/clover_convert"
ln -sfn "$REPO/patches" "$WORK/pylink/clover_patches"
if [ ! -f "$WORK/pure/.done" ]; then
  $PY -m pip install -q --no-deps --no-compile --target "$WORK/pure" "$CARRY"/wheels/*.whl >> "$OUT/run.log" 2>&1 \
    && touch "$WORK/pure/.done" || log "pure wheels did not install"
fi
BASEPATH="$WORK/pure:$WORK/pylink:$REPO"
# before the CUDA wheel exists the converter quantizes with a carried CPU libggml-base
export PYTHONPATH="$CARRY/ggml-base:$BASEPATH"
convert_cmd() { $PY -c 'import sys; from clover_convert.cli import main; sys.argv[0]="clover-convert"; sys.exit(main())' "$@"; }
clover_cmd() { $PY -c 'import sys; from clover_local.cli import app; sys.argv[0]="clover"; app()' "$@"; }

# ---- build (background) --------------------------------------------------------------------
BUILD_PID=""
SITE="$WORK/site"
CMAKE_ARGS_USED=""
# the CUDA libraries built here from the same tree (prepare.py --prebuilt): used when they load
cuda_lib_path() {  # the toolkit's libcublas/libcudart directories, for libraries built elsewhere
  local d
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
           $(find /usr/local /opt -name 'libcublas.so.13' -printf '%h\n' 2>/dev/null | sort -u | head -3); do
    [ -d "$d" ] && printf '%s:' "$d"
  done
}
if want build && [ -f "$CARRY/site.tar.gz" ] && [ ! -f "$SITE/.src-$SRC_SHA" ] && [ -z "${NO_PREBUILT:-}" ]; then
  rm -rf "$SITE"; mkdir -p "$SITE"; tar xzf "$CARRY/site.tar.gz" -C "$SITE"
  export LD_LIBRARY_PATH="$(cuda_lib_path)${LD_LIBRARY_PATH:-}"
  if PYTHONPATH="$SITE:$BASEPATH" $PY -c 'import llama_cpp; from clover_local.llama import capi
assert capi.PATCHED and llama_cpp.llama_supports_gpu_offload()' >> "$OUT/run.log" 2>&1; then
    touch "$SITE/.src-$SRC_SHA"
    echo "prebuilt here (prepare.py --prebuilt): $(cat "$CARRY/site-cmake.txt" 2>/dev/null)" > "$WORK/cmake_args.txt"
    log "build: the carried prebuilt CUDA libraries load (GPU offload on); no build"
  else
    log "build: the carried prebuilt libraries do not load here; building from source"
    ldd "$SITE/llama_cpp/lib/libggml-cuda.so" 2>&1 | grep -E "not found" | tee -a "$OUT/run.log"
    rm -rf "$SITE"
  fi
fi
if want build; then
  if [ -f "$SITE/.src-$SRC_SHA" ]; then
    log "build: reusing $SITE (same source)"
  else
    rm -rf "$WORK/src" "$WORK/wheel" "$SITE"; mkdir -p "$WORK/src" "$WORK/wheel"
    tar xzf "$SRC_TGZ" -C "$WORK/src"
    TREE=$(ls -d "$WORK"/src/llama_cpp_python-*)
    # the same lean options (and the RPC backend) patches/build.py uses, plus CUDA for sm_90 with CUDA graphs
    CMAKE_ARGS_USED=$($PY -c "
import sys; sys.path.insert(0, 'patches')
try:
    import build; print(build.cmake_args(True, {'CMAKE_CUDA_ARCHITECTURES': '90'}))
except Exception:
    print('-DLLAVA_BUILD=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF -DGGML_RPC=ON -DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90')
")" -DGGML_CUDA_GRAPHS=ON -DGGML_NATIVE=ON"
    # BUILD_CXX=/usr/bin/g++ (and BUILD_CC) build with another host compiler than the image's default
    [ -n "${BUILD_CC:-}" ] && CMAKE_ARGS_USED+=" -DCMAKE_C_COMPILER=$BUILD_CC"
    [ -n "${BUILD_CXX:-}" ] && CMAKE_ARGS_USED+=" -DCMAKE_CXX_COMPILER=$BUILD_CXX -DCMAKE_CUDA_HOST_COMPILER=$BUILD_CXX"
    echo "$CMAKE_ARGS_USED" > "$WORK/cmake_args.txt"
    log "build: CMAKE_ARGS=$CMAKE_ARGS_USED"
    ( export CMAKE_ARGS="$CMAKE_ARGS_USED" CMAKE_BUILD_PARALLEL_LEVEL=$JOBS
      t=$(date +%s)
      $PY -m pip wheel -v --no-deps --no-build-isolation --no-index -C build-dir="$WORK/skbuild" \
          -w "$WORK/wheel" "$TREE" > "$WORK/build.log" 2>&1 || { echo "pip wheel failed" >> "$WORK/build.log"; exit 1; }
      echo $(( $(date +%s) - t )) > "$WORK/build_s.txt"
      $PY -m pip install -q --no-deps --no-compile --target "$SITE" "$WORK"/wheel/llama_cpp_python-*.whl >> "$WORK/build.log" 2>&1 || exit 1
      touch "$SITE/.src-$SRC_SHA" ) &
    BUILD_PID=$!
  fi
fi
[ -f "$WORK/cmake_args.txt" ] && CMAKE_ARGS_USED=$(cat "$WORK/cmake_args.txt")

wait_build() {
  if [ -n "$BUILD_PID" ]; then
    log "waiting for the build"
    wait "$BUILD_PID"; local rc=$?
    BUILD_PID=""
    tail -c 60000 "$WORK/build.log" > "$OUT/build-tail.log"
    if [ $rc -ne 0 ]; then log "build FAILED (rc $rc): see build-tail.log"; return 1; fi
    log "build done in $(cat "$WORK/build_s.txt") s"
  fi
  if [ -f "$SITE/.src-$SRC_SHA" ]; then
    export PYTHONPATH="$SITE:$BASEPATH"; return 0
  fi
  return 1
}

# ---- test-backend-ops (ops): compiled against ggml's headers while the build runs -------------
TBO="$WORK/test-backend-ops"
TBO_PID=""
if want ops && [ ! -x "$TBO" ]; then
  T="$WORK/tbo-src"; rm -rf "$T"; mkdir -p "$T"
  V=llama_cpp_python-0.3.36/vendor/llama.cpp
  ( tar xzf "$SRC_TGZ" -C "$T" "$V/tests/test-backend-ops.cpp" "$V/ggml/include" \
      && patch -d "$T/$V" -p1 --forward --batch < bench/device/kernels-test-cases.patch \
      && ${BUILD_CXX:-g++} -O2 -std=c++17 -pthread -I"$T/$V/ggml/include" -c "$T/$V/tests/test-backend-ops.cpp" \
           -o "$T/tbo.o" ) > "$WORK/tbo.log" 2>&1 &
  TBO_PID=$!
fi

# ---- checkpoint + conversion (while the build runs) ------------------------------------------
CK="$WORK/ck-$GEN"
converted() { local q; for q in $QUANTS; do [ -f "$WORK/clover-$GEN-$q.gguf" ] || return 1; done; }
if want gen; then
  if [ -f "$CK/.done" ]; then log "gen: reusing $CK"
  elif converted; then log "gen: every quant of $GEN layers converted already"
  elif (( $(left) < 200 )); then note gen "too little time left ($(left) s)"
  else
    rm -rf "$CK"
    log "gen: $PRESET synthetic checkpoint, $GEN layers"
    $PY -m clover_local.testing.make_checkpoint "$CK" --preset "$PRESET" --layers "$GEN" 2>&1 | tail -3 | tee -a "$OUT/run.log" \
      && touch "$CK/.done"
  fi
fi
if want convert; then
  for q in $QUANTS; do
    G="$WORK/clover-$GEN-$q.gguf"
    if [ -f "$G" ]; then log "convert: reusing $G"; continue; fi
    if [ ! -f "$CK/.done" ]; then note "convert-$q" "no checkpoint"; continue; fi
    if (( $(left) < 150 )); then note "convert-$q" "too little time left ($(left) s)"; continue; fi
    # share the cores with the build while it runs
    th=$JOBS; [ -n "$BUILD_PID" ] && kill -0 "$BUILD_PID" 2>/dev/null && th=${CONVERT_THREADS:-6}
    log "convert: $q, $th threads"
    convert_cmd "$CK" -o "$G.tmp" --outtype "$q" --threads "$th" --force 2>&1 | tail -2 | tee -a "$OUT/run.log"
    if [ ! -f "$G.tmp" ] && [[ "$PYTHONPATH" == "$CARRY/ggml-base:"* ]]; then
      log "convert: the carried CPU libggml-base failed here; retrying with the built wheel's"
      wait_build && convert_cmd "$CK" -o "$G.tmp" --outtype "$q" --threads "$JOBS" --force 2>&1 | tail -2 | tee -a "$OUT/run.log"
    fi
    [ -f "$G.tmp" ] && mv "$G.tmp" "$G" || note "convert-$q" "converter failed"
  done
  if [ "$GEN" != "$LMAX" ] && ! want parity && converted; then
    rm -rf "$CK"; log "convert: checkpoint deleted (disk: $(df -h "$WORK" | awk 'NR==2 {print $4}') free)"
  fi
fi
variants() {  # $1 quant, $2 arch ('' keeps clover-moe): prints the files, one per layer count
  local q=$1 arch=$2 l f src="$WORK/clover-$GEN-$1.gguf"
  for l in $LAYERS; do
    if [ -n "$arch" ]; then f="$WORK/$arch-$l-$q.gguf"; else f="$WORK/clover-$l-$q.gguf"; fi
    if [ ! -f "$f" ] && [ -f "$src" ]; then
      ( $PY bench/device/gguf_variant.py "$src" "$f.tmp" --layers "$l" ${arch:+--arch $arch} >> "$OUT/run.log" 2>&1 \
        && mv "$f.tmp" "$f" ) &
    fi
  done
  wait
  for l in $LAYERS; do
    if [ -n "$arch" ]; then f="$WORK/$arch-$l-$q.gguf"; else f="$WORK/clover-$l-$q.gguf"; fi
    [ -f "$f" ] && echo "$f"
  done
}

# the timed files (first N layers; qwen35moe for the baseline), made in parallel while the build runs
NPATCH=$($PY -c "import json; print(len(json.load(open('$CARRY/meta.json'))['patches']))" 2>/dev/null || echo 0)
VPIDS=()
for q in $QUANTS; do
  if want baseline || want cpumoe || want loops; then variants "$q" qwen35moe > /dev/null & VPIDS+=($!); fi
  if { want clover || want loops || want spec; } && [ "$NPATCH" -gt 0 ]; then variants "$q" "" > /dev/null & VPIDS+=($!); fi
done
(( ${#VPIDS[@]} )) && { log "variants: ${#VPIDS[@]} jobs"; wait "${VPIDS[@]}"; log "variants done ($(df -h "$WORK" | awk 'NR==2 {print $4}') free)"; }

# ---- ggml-cpu extra buffer types (no CUDA wheel needed) --------------------------------------
if want extrabufts; then
  if [ -f "$OUT/extra_bufts.json" ]; then log "extrabufts: kept from an earlier call"
  elif (( $(left) < 150 )); then note extrabufts "too little time left ($(left) s)"
  else
    log "extrabufts: AMX / CPU_REPACK matmuls vs plain buffers, pinned kernel then patch 0201"
    OUT="$OUT" WORK="$WORK/xb" CARRY="$CARRY" JOBS=$JOBS bash bench/device/extra_bufts_check.sh 2>&1 | tail -16 \
      | tee -a "$OUT/run.log"
    [ -f "$OUT/extra_bufts.json" ] || note extrabufts "check failed (extra-bufts.log)"
  fi
fi

# ---- timings ---------------------------------------------------------------------------------
time_file() {  # $1 gguf, $2 tag, then extra timing.py arguments; a file timed by an earlier call is kept
  local f=$1 tag=$2 gb=$(( $(stat -c %s "$1") / 1000000000 )) need
  shift 2
  # what a run takes: a 21 GB file without the loop simulations 45-50 s (2026-12-05), with them about twice
  if [[ " $* " == *" --no-sim "* ]]; then need=$(( 30 + gb )); else need=$(( 40 + gb * 4 )); fi
  if [ -f "$WORK/timing-$tag.json" ]; then log "timing $tag: kept from an earlier call"; return; fi
  if (( $(left) < need )); then note "time-$tag" "too little time left ($(left) s, need ~$need)"; return; fi
  log "timing $tag ($f)"
  $PY -X faulthandler bench/device/timing.py "$f" --out "$WORK/timing-$tag.json" --reps "$REPS" --pp "$PP" --label "$tag" "$@" \
      2> "$WORK/timing-$tag.stderr" | tee -a "$OUT/run.log"
  [ -f "$WORK/timing-$tag.json" ] || { tail -20 "$WORK/timing-$tag.stderr" | tee -a "$OUT/run.log"; note "time-$tag" "timing failed"; }
}
clover_bench() {  # $1 gguf, $2 tag: the runtime's own `clover bench` on the same file
  [ -f "$WORK/clover-bench-$2.json" ] && return
  if (( $(left) < 90 )); then note "clover-bench-$2" "too little time left ($(left) s)"; return; fi
  log "clover bench $2"
  clover_cmd bench "$1" --json --n-gpu-layers -1 --repeats 5 --verbose --simulate --n-ctx 16384 \
      --prompt-tokens 512 --prompt-tokens 8192 > "$WORK/clover-bench-$2.json" 2>> "$WORK/timing-$2.stderr" \
    || { note "clover-bench-$2" "clover bench failed"; rm -f "$WORK/clover-bench-$2.json"; }
}
[ -n "${RETIME:-}" ] && rm -f "$WORK"/timing-*.json "$WORK"/clover-bench-*.json "$WORK/parity.json"
# an earlier call's results on this warm machine are kept only for the same carried source: another
# source's (an experiment's carry after the series', or back) go aside, so that result.json holds one build
if [ -f "$WORK/results.src" ] && [ "$(cat "$WORK/results.src")" != "$SRC_SHA" ]; then
  aside="$WORK/results-$(cat "$WORK/results.src")"; mkdir -p "$aside"
  mv "$WORK"/timing-* "$WORK"/clover-bench-*.json "$WORK"/loops-* "$WORK/parity.json" "$WORK/profile.json" "$aside"/ 2>/dev/null
  log "results of source $(cat "$WORK/results.src") set aside in $aside (this call's: $SRC_SHA)"
fi
echo "$SRC_SHA" > "$WORK/results.src"
if want baseline || want clover || want loops || want parity || want cbench || want nographs || want legacy || want sweep || want profile || want trace || want cpumoe || want ops || want spec || want slots; then
  wait_build || note timings "no CUDA wheel"
fi
# The image builds with /opt/gcc (its own GCC), whose libstdc++ need not be the one the dynamic
# loader finds first: the 2026-11-30 smoke run segfaulted inside libllama's print_info (std::function
# + stringstream) right after loading. Check one load, and retry with the build compiler's
# libstdc++ first on the library path (then preloaded) before timing anything.
runtime_check() {  # $1 a gguf
  local f=$1 cxx lib
  { echo "--- runtime: CC=${CC:-} CXX=${CXX:-} LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
    grep -E '^CMAKE_(C|CXX|CUDA)_COMPILER:|^CMAKE_CUDA_HOST_COMPILER' "$WORK/skbuild/CMakeCache.txt" 2>/dev/null
    ls -d /opt/gcc/bin/g++ /usr/bin/g++* 2>/dev/null; /opt/gcc/bin/g++ --version 2>/dev/null | head -1
    /usr/bin/g++ --version 2>/dev/null | head -1
    ldd "$SITE/llama_cpp/lib/libllama.so" 2>&1 | grep -E "stdc|gcc_s|gomp|not found"; } >> "$OUT/machine.txt"
  if $PY -X faulthandler bench/device/timing.py "$f" --check > "$WORK/check.log" 2>&1; then log "load check ok"; return 0; fi
  tail -25 "$WORK/check.log" | grep -v "^print_info\|^load\|^llama_model_loader" | tee -a "$OUT/run.log"
  cxx=$(grep -m1 '^CMAKE_CXX_COMPILER:' "$WORK/skbuild/CMakeCache.txt" | cut -d= -f2)
  lib=$(dirname "$("${cxx:-g++}" -print-file-name=libstdc++.so.6)")
  log "load check FAILED; retrying with LD_LIBRARY_PATH=$lib (libstdc++ of the build compiler $cxx)"
  export LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}"
  if $PY -X faulthandler bench/device/timing.py "$f" --check > "$WORK/check.log" 2>&1; then log "load check ok"; return 0; fi
  log "still failing; retrying with LD_PRELOAD=$lib/libstdc++.so.6"
  export LD_PRELOAD="$lib/libstdc++.so.6"
  if $PY -X faulthandler bench/device/timing.py "$f" --check > "$WORK/check.log" 2>&1; then log "load check ok"; return 0; fi
  unset LD_PRELOAD
  tail -25 "$WORK/check.log" | tee -a "$OUT/run.log"
  note runtime "the built library does not load a model here (see run.log)"; return 1
}

if [ -f "$SITE/.src-$SRC_SHA" ]; then
  FIRST=$(ls "$WORK"/qwen35moe-*.gguf "$WORK"/clover-*.gguf 2>/dev/null | head -1)
  [ -n "$FIRST" ] && runtime_check "$FIRST"
  PATCHED=$($PY -c 'from clover_local.llama import capi; print(int(capi.PATCHED))' 2>/dev/null || echo 0)
  log "llama_cpp $($PY -c 'import llama_cpp; print(llama_cpp.__version__)'), Clover C API: $PATCHED"
  # the changed ops against the CPU first: timings of a wrong kernel would mean nothing
  if want ops && [ ! -f "$OUT/ops/kernels.json" ]; then
    if [ -n "$TBO_PID" ]; then wait "$TBO_PID"; TBO_PID=""; fi
    [ -x "$TBO" ] || ${BUILD_CXX:-g++} -o "$TBO" "$WORK/tbo-src/tbo.o" -L"$SITE/llama_cpp/lib" -lggml -lggml-base \
        -pthread >> "$WORK/tbo.log" 2>&1
    if [ ! -x "$TBO" ]; then tail -20 "$WORK/tbo.log" | tee -a "$OUT/run.log"; note ops "test-backend-ops did not build"
    elif (( $(left) < 120 )); then note ops "too little time left ($(left) s)"
    else
      log "ops: test-backend-ops ${OPS_STAGES:-eval,perf}"
      PREBUILT=1 TBO="$TBO" LIBDIR="$SITE/llama_cpp/lib" STAGES="${OPS_STAGES:-eval,perf}" OUT="$OUT/ops" \
          WORK="$WORK/ops" BUDGET_S=$(( $(left) - 60 )) bash bench/device/kernels.sh 2>&1 | tail -25 | tee -a "$OUT/run.log"
    fi
  fi
  for q in $QUANTS; do
    if want baseline; then
      for f in $(variants "$q" qwen35moe); do time_file "$f" "$(basename "$f" .gguf)"; done
    fi
    if want clover; then
      if [ "$PATCHED" = 1 ]; then
        for f in $(variants "$q" ""); do
          # its qwen35moe twin: upstream's AR step interleaved with the ar mode's in one process
          twin="$WORK/qwen35moe-${f#"$WORK"/clover-}"
          time_file "$f" "$(basename "$f" .gguf)" $([ -f "$twin" ] && echo --baseline "$twin")
        done
      else note "clover-$q" "unpatched build: upstream cannot load clover-moe"; fi
    fi
  done
  FIRSTQ=${QUANTS%% *}
  LASTCLOVER="$WORK/clover-$LMAX-$FIRSTQ.gguf"
  if want cbench && [ "$PATCHED" = 1 ] && [ -f "$LASTCLOVER" ]; then clover_bench "$LASTCLOVER" "clover-$LMAX-$FIRSTQ"; fi
  if want legacy && [ "$PATCHED" = 1 ]; then
    for f in $(variants "$FIRSTQ" ""); do
      GGML_CUDA_CLOVER_LEGACY=1 time_file "$f" "$(basename "$f" .gguf)-legacy" --pp "${PP%%,*}" --no-sim
    done
  fi
  if want sweep && [ "$PATCHED" = 1 ]; then
    for setting in ${SWEEP:-}; do
      stag=${setting%%:*}; IFS=, read -ra svars <<< "${setting#*:}"
      for f in $(variants "$FIRSTQ" ""); do
        [[ " ${SWEEP_LAYERS:-$LAYERS} " == *" $(basename "$f" .gguf | cut -d- -f2) "* ]] || continue
        if [ -n "${SWEEP_FULL:-}" ]; then sargs=(--pp "$PP"); else sargs=(--pp "${PP%%,*}" --no-sim); fi
        ( export "${svars[@]}"; time_file "$f" "$(basename "$f" .gguf)-$stag" "${sargs[@]}" )
      done
    done
  fi
  if want nographs && [ "$PATCHED" = 1 ] && [ -f "$LASTCLOVER" ]; then
    GGML_CUDA_DISABLE_GRAPHS=1 time_file "$LASTCLOVER" "clover-$LMAX-$FIRSTQ-nographs" --pp "" --no-sim
  fi
  BASEMAX="$WORK/qwen35moe-$LMAX-$FIRSTQ.gguf"
  if want cpumoe && [ "$PATCHED" = 1 ] && [ -f "$LASTCLOVER" ]; then
    # the experts' matmuls run on the CPU: one thread per physical core, as llama.cpp's tools default to
    CORES=$(lscpu -p=CORE,SOCKET 2>/dev/null | grep -v '^#' | sort -u | wc -l); (( CORES > 0 )) || CORES=$(nproc)
    CPUMOE=(--cpu-moe --pp "" --reps "${CPUMOE_REPS:-10}" --warmup 2 --moe-chunks 0 --coreset-sizes 8,16,32
            --threads "${CPUMOE_THREADS:-$CORES}")
    [ -f "$BASEMAX" ] && time_file "$BASEMAX" "qwen35moe-$LMAX-$FIRSTQ-cpumoe" "${CPUMOE[@]}" --no-engine
    time_file "$LASTCLOVER" "clover-$LMAX-$FIRSTQ-cpumoe" "${CPUMOE[@]}" --sim-tokens "${CPUMOE_SIM_TOKENS:-64}"
    time_file "$LASTCLOVER" "clover-$LMAX-$FIRSTQ-cpumoenooffload" "${CPUMOE[@]}" --no-op-offload --no-sim
  fi
  SMALLCLOVER="$WORK/clover-$LMIN-$FIRSTQ.gguf"
  if want profile && [ "$PATCHED" = 1 ] && [ -f "$SMALLCLOVER" ] && [ ! -f "$WORK/profile.json" ]; then
    if ! command -v ncu > /dev/null; then note profile "no ncu on the PATH"
    else
      for k in ${PROFILE_PASSES:-raw-ar ar commit preview preview-c8 fused}; do
        if (( $(left) < 40 )); then note "profile-$k" "too little time left ($(left) s)"; continue; fi
        log "profile: $k on $SMALLCLOVER (ncu, one pass)"
        ncu --clock-control none --cache-control ${NCU_CACHE:-none} --profile-from-start off --csv --page raw \
            --metrics gpu__time_duration.sum \
            --log-file "$WORK/ncu-$k.csv" $PY bench/device/profile.py "$SMALLCLOVER" --pass "$k" \
            > /dev/null 2>> "$WORK/profile.stderr" || note "profile-$k" "ncu run failed"
      done
      $PY bench/device/profile.py --summarize "$WORK"/ncu-*.csv \
          --out "$WORK/profile.json" > /dev/null 2>> "$WORK/profile.stderr" || note profile "summary failed"
      tail -5 "$WORK/profile.stderr" >> "$OUT/run.log" 2>/dev/null
    fi
  fi
  if want trace && [ "$PATCHED" = 1 ] && [ -f "$SMALLCLOVER" ]; then
    for k in ${TRACE_PASSES:-preview fused}; do
      if (( $(left) < 40 )); then note "trace-$k" "too little time left ($(left) s)"; continue; fi
      log "trace: $k on $SMALLCLOVER (CUPTI through torch.profiler, ${TRACE_REPS:-5} passes)"
      $PY bench/device/profile.py "$SMALLCLOVER" --pass "$k" --trace "${TRACE_REPS:-5}" > "$OUT/trace-$k.json" \
          2>> "$WORK/trace.stderr" || { note "trace-$k" "trace failed"; tail -5 "$WORK/trace.stderr" >> "$OUT/run.log"; }
    done
  fi
  # ---- the loops and upstream's step round-robin in one process (issue 11's "same run") ---------
  if want loops && [ "$PATCHED" = 1 ]; then
    for l in $LAYERS; do
      f="$WORK/clover-$l-$FIRSTQ.gguf"; b="$WORK/qwen35moe-$l-$FIRSTQ.gguf"
      [ -f "$f" ] && [ -f "$b" ] || { note "loops-$l" "no clover file or qwen35moe twin"; continue; }
      [ -f "$WORK/loops-clover-$l-$FIRSTQ.json" ] && continue
      if (( $(left) < 30 + l * 2 )); then note "loops-$l" "too little time left ($(left) s)"; continue; fi
      log "loops: bench/step_in_loop.py on $(basename "$f") beside $(basename "$b")"
      timeout $(( $(left) - 10 )) $PY bench/step_in_loop.py "$f" --baseline "$b" --speculative --gpu-layers -1 \
          --prompt 512 --n-ctx 12800 --reps 3 --json "$WORK/loops-clover-$l-$FIRSTQ.json" \
          2> "$WORK/loops-$l.stderr" | tee -a "$OUT/run.log" || note "loops-$l" "step_in_loop failed"
    done
  fi
  # ---- speculative a = 0, iteration by iteration (CUDA graphs on and off) ---------------------
  if want spec && [ "$PATCHED" = 1 ]; then
    for f in $(variants "$FIRSTQ" ""); do
      for setting in ${SPEC:-slots:LLAMA_GRAPH_CACHE=4 one-graph:LLAMA_GRAPH_CACHE=0}; do
        stag=${setting%%:*}; IFS=, read -ra svars <<< "${setting#*:}"
        log "spec: bench/spec_iterations.py on $(basename "$f"), $stag (${setting#*:})"
        ( export "${svars[@]}"
          $PY bench/spec_iterations.py "$f" --gpu-layers -1 ${SPEC_ARGS:-} 2> "$WORK/spec-$(basename "$f" .gguf)-$stag.stderr" ) \
          | tee -a "$OUT/run.log" || note "spec-$stag" "spec_iterations failed on $f"
      done
    done
  fi
  if want slots && [ "$PATCHED" = 1 ]; then
    for f in $(variants "$FIRSTQ" ""); do
      [[ " ${SLOTS_LAYERS:-$LMIN} " == *" $(basename "$f" .gguf | cut -d- -f2) "* ]] || continue
      for proc in ${SLOTS_GRAPHS:-on off}; do
        g=${proc%%:*}; pvars=(); [ "$g" = "$proc" ] || IFS=, read -ra pvars <<< "${proc#*:}"
        (( $(left) > 100 )) || { note "slots-$g" "too little time left"; continue; }
        log "slots: bench/graph_slots.py on $(basename "$f"), CUDA graphs $g${pvars[*]:+ (${pvars[*]})}"
        ( [ $g = off ] && export GGML_CUDA_DISABLE_GRAPHS=1
          [ ${#pvars[@]} -eq 0 ] || export "${pvars[@]}"
          $PY bench/graph_slots.py "$f" --out "$OUT/slots-$(basename "$f" .gguf)-graphs-$g.json" \
            ${SLOTS_SETTINGS:+--settings "$SLOTS_SETTINGS"} ${SLOTS_REPS:+--reps "$SLOTS_REPS"} \
            2> "$WORK/slots-$(basename "$f" .gguf)-$g.stderr" ) | tee -a "$OUT/run.log" \
          || note "slots-$g" "graph_slots failed on $f"
      done
    done
  fi
  # ---- GPU parity (tiny models, all layers offloaded) ----------------------------------------
  if want parity; then
    if [ "$PATCHED" != 1 ]; then note parity "unpatched build"
    elif ! clover_cmd verify --help > /dev/null 2>&1; then note parity "no \`clover verify\` command"
    elif grep -q '"complete": true' "$WORK/parity.json" 2>/dev/null; then log "parity: kept from an earlier call"
    elif (( $(left) < 60 )); then note parity "too little time left"
    else
      log "parity: clover verify on the CPU (extra buffer types on and off) and the GPU (resumes a parity.json cut short)"
      # cut off before the budget ends; parity.json holds every file finished by then
      timeout $(( $(left) - 20 )) $PY bench/device/parity.py --out "$WORK/parity.json" \
          --presets "${PARITY_PRESETS:-tiny,small}" --quants "${PARITY_QUANTS:-f32,q8_0,q4_k_m}" \
          --extra-bufts "$OUT/extra_bufts.json" \
          $( [ "$GEN" = 4 ] && [ -f "$CK/.done" ] && echo "--checkpoint full-width=$CK" ) 2>&1 \
          | grep -E '^\[' | tail -40 | tee -a "$OUT/run.log" || note parity "parity run failed or cut short"
    fi
  fi
fi

# ---- result ------------------------------------------------------------------------------------
log "writing the result"
$PY bench/device/results.py merge "$WORK"/timing-*.json --clover-bench "$WORK"/clover-bench-*.json --parity "$WORK/parity.json" \
    --loops "$WORK"/loops-*.json \
    --meta "$CARRY/meta.json" --machine "$OUT/machine.txt" --cmake-args "$CMAKE_ARGS_USED" --profile "$WORK/profile.json" \
    --build-s "$(cat "$WORK/build_s.txt" 2>/dev/null || echo '')" --notes "$OUT/notes.jsonl" \
    --label "$LABEL" --out "$OUT/result.json" 2>&1 | tee -a "$OUT/run.log"
cp "$WORK"/timing-*.stderr "$OUT/" 2>/dev/null; ls "$OUT"/timing-*.stderr > /dev/null 2>&1 && \
  tar czf "$OUT/stderr.tgz" -C "$OUT" $(cd "$OUT" && ls timing-*.stderr) && rm -f "$OUT"/timing-*.stderr
log "done in $(( $(date +%s) - T0 )) s"
