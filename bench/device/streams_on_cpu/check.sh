#!/usr/bin/env bash
# Patch 0115's stream plan checked without a GPU: ggml_cuda_clover_plan_streams and what it uses, cut out of the
# patched tree's ggml-cuda.cu and common.cuh, planned over the tiny preset's real preview and fused pass as a CPU engine
# records them (streams_plan.cpp, check.py). CI runs it (tests/test_cuda_streams_on_host.py).
# TREE=<a patched llama.cpp tree>: cut from it (default: the series, prepared in a scratch folder).
#
#   [SP_VERBOSE=1] bash bench/device/streams_on_cpu/check.sh   (every node of a region with its stream; exit 1: a check failed)
source "$(dirname "$0")/../series_tree.sh"
E=bench/device/streams_on_cpu
if [ -n "${TREE:-}" ]; then
  V=$TREE
else
  V=$(series_tree)
fi
C=$V/ggml/src/ggml-cuda
cut_switches "$C"
sed -n '/^struct ggml_cuda_concurrent_event {/,/^struct ggml_backend_cuda_context {/{/^struct ggml_backend_cuda_context {/!p}' \
    "$C/common.cuh" > "$T/concurrent-event.inc"
{ sed -n '/^static bool ggml_cuda_is_view_or_noop(/,/^}/p' "$C/ggml-cuda.cu"
  sed -n '/^static int ggml_cuda_clover_streams() {/,/^static void ggml_backend_cuda_graph_optimize(/{/^static void ggml_backend_cuda_graph_optimize(/!p}' \
      "$C/ggml-cuda.cu"; } > "$T/plan.inc"
grep -q 'struct ggml_cuda_stream_context' "$T/concurrent-event.inc" && grep -q 'ggml_cuda_clover_plan_streams' "$T/plan.inc" ||
    { echo "could not cut the stream plan out of $C" >&2; exit 2; }
LIB=$("$PY" -c 'import llama_cpp, pathlib; print(pathlib.Path(llama_cpp.__file__).parent / "lib")')
g++ -std=c++20 -O1 -w -shared -fPIC -I"$T" -I"$V/ggml/include" -I"$V/ggml/src" "$E/streams_plan.cpp" \
    -L"$LIB" -lggml-base -Wl,-rpath,"$LIB" -o "$T/streams_plan.so"
"$PY" "$E/check.py" "$T/streams_plan.so"
