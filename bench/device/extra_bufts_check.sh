#!/usr/bin/env bash
# ggml-cpu's extra buffer types (AMX on Sapphire Rapids, CPU_REPACK) against plain CPU buffers, before
# and after patch 0201: builds the carried tree's ggml alone for this CPU (GGML_NATIVE, no CUDA) with
# the pinned tree's AMX kernel, runs extra_bufts_check.c, applies the patch, rebuilds, runs it again.
#
#   bash bench/device/extra_bufts_check.sh      (repo root; carry [".devcarry"]; ~1-2 min on 16 cores)
#
# Writes $OUT/extra-bufts-{pinned,patched}.txt (one line per buffer type, weight type and shape) and
# $OUT/extra_bufts.json ({"cpu", "amx", "pinned_wrong", "patched_wrong", ...}).
# Environment: OUT (/tmp/clover-out), WORK (/tmp/clover-xb), CARRY (.devcarry), JOBS (all cores),
# BUILD_CC / BUILD_CXX (host compilers), GGML_CMAKE (extra CMake arguments).
set -u -o pipefail
T0=$(date +%s)
REPO=$(pwd)
OUT=${OUT:-/tmp/clover-out}; mkdir -p "$OUT"
WORK=${WORK:-/tmp/clover-xb}; mkdir -p "$WORK"
CARRY=${CARRY:-$REPO/.devcarry}
JOBS=${JOBS:-$(nproc)}
PATCH=$(ls "$REPO"/patches/0201-*.patch 2>/dev/null | head -1)
log() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/extra-bufts.log"; }
[ -f "$CARRY/llama-src.tar.gz" ] || { log "no $CARRY/llama-src.tar.gz (bench/device/prepare.py)"; exit 2; }
[ -n "$PATCH" ] || { log "no patches/0201-*.patch"; exit 2; }

SRC="$WORK/src"
if [ ! -d "$SRC/ggml" ]; then
  rm -rf "$SRC" "$WORK/x"; mkdir -p "$SRC" "$WORK/x"
  tar xzf "$CARRY/llama-src.tar.gz" -C "$WORK/x" --wildcards '*/vendor/llama.cpp/ggml/*'
  mv "$WORK"/x/*/vendor/llama.cpp/ggml "$SRC/ggml"
fi
# the carried tree may have the series (0201 included) applied or not: start from the pinned kernel
if (cd "$SRC" && git apply --check -R "$PATCH" 2> /dev/null); then (cd "$SRC" && git apply -R "$PATCH"); fi
cat > "$WORK/CMakeLists.txt" << EOF
cmake_minimum_required(VERSION 3.14)
project(extra_bufts_check C CXX)
add_subdirectory($SRC/ggml ggml)
add_executable(extra_bufts_check $REPO/bench/device/extra_bufts_check.c)
target_link_libraries(extra_bufts_check PRIVATE ggml ggml-cpu ggml-base)
EOF
GEN=(); command -v ninja > /dev/null && GEN=(-G Ninja)
log "configure: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), AMX flags: $(grep -o 'amx[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' ')"
cmake -S "$WORK" -B "$WORK/build" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF \
  ${BUILD_CC:+-DCMAKE_C_COMPILER=$BUILD_CC} ${BUILD_CXX:+-DCMAKE_CXX_COMPILER=$BUILD_CXX} ${GGML_CMAKE:-} \
  > "$WORK/configure.log" 2>&1 || { tail -30 "$WORK/configure.log" | tee -a "$OUT/extra-bufts.log"; exit 1; }
check() {  # $1 label: build, run, keep the table
  cmake --build "$WORK/build" -j "$JOBS" > "$WORK/build-$1.log" 2>&1 \
    || { tail -30 "$WORK/build-$1.log" | tee -a "$OUT/extra-bufts.log"; return 1; }
  log "built ($1)"
  "$WORK/build/extra_bufts_check" "$(( JOBS < 8 ? JOBS : 8 ))" > "$OUT/extra-bufts-$1.txt" 2> "$WORK/run-$1.stderr"
  log "$1: $(tail -1 "$OUT/extra-bufts-$1.txt")"
  grep -E "WRONG" "$OUT/extra-bufts-$1.txt" | head -12 | tee -a "$OUT/extra-bufts.log"
}
check pinned
(cd "$SRC" && git apply "$PATCH") || { log "$(basename "$PATCH") does not apply"; exit 1; }
check patched
python3 - "$OUT" << 'EOF'
import json, re, sys
from pathlib import Path
out = Path(sys.argv[1])
res = {"cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "")}
res["amx_int8_cpu"] = "amx_int8" in Path("/proc/cpuinfo").read_text()
for label in ("pinned", "patched"):
    f = out / f"extra-bufts-{label}.txt"
    lines = f.read_text().splitlines() if f.exists() else []
    rows = [l.split() for l in lines[1:] if len(l.split()) == 7]
    res[f"{label}_buffer_types"] = sorted({r[0] for r in rows})
    res[f"{label}_checked"] = sum(r[6] in ("ok", "WRONG") for r in rows)
    res[f"{label}_wrong"] = [" ".join(r[:5]) for r in rows if r[6] == "WRONG"]
res["amx"] = "AMX" in res.get("pinned_buffer_types", [])
(out / "extra_bufts.json").write_text(json.dumps(res, indent=1) + "\n")
print(json.dumps({k: (v if not isinstance(v, list) or len(v) < 8 else v[:8] + ["..."]) for k, v in res.items()}))
EOF
log "done in $(( $(date +%s) - T0 )) s"
