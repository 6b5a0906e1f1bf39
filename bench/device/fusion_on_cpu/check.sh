#!/usr/bin/env bash
# Patches 0114's, 0116's, 0117's and 0118's CUDA fusions (clover-fusion.cu), checked on a machine
# without a GPU: each kernel's own source, cut out of the patched tree, runs on host threads (cuda_on_host.h) against
# ggml's CPU backend (the venv's llama_cpp libraries, the patched tree's headers), on the graphs of test-backend-ops'
# cases for them (kernels-test-cases.patch); the matchers, cut out the same way, must find each construction there,
# asked only at nodes that compute, as ggml-cuda's evaluation asks.
#   coreset: coreset_on_cpu.cpp, the block expert coreset (0117's two kernels) on MOE_CORESET graphs (outputs bit for
#            bit), compiled twice: the candidates picked with Ampere's warp reductions (the GPUs' path from sm_80) and
#            with shuffles (before);
#   conv:    preview_conv_on_cpu.cpp, the GDN conv with its right taps on PREVIEW_CONV graphs (NMSE below 1e-12);
#   softmax: block_softmax_on_cpu.cpp, patch 0116's GDN block softmax with its history slot (0120's 16 warps a CTA and 8) on
#            BLOCK_SOFTMAX_HISTORY graphs (NMSE below 1e-10);
#   head:    head_on_cpu.cpp, patch 0118's head (each row's argmax token and its probability) on CLOVER_HEAD graphs
#            (tokens equal, probabilities within 1e-5);
#   real:    real_graph.cpp / .py, all of them on the tiny preset's real preview and fused pass, recorded node by node
#            by the venv's CPU engine, with the inputs and outputs where its allocator put them (REAL_LIB: another CPU
#            build's library folder, default the venv's).
# TREE=<a patched llama.cpp tree>: cut the kernels from it instead of the series' (e.g. build/llama-dev/src/vendor/llama.cpp
# while editing clover-fusion.cu there).
#
#   bash bench/device/fusion_on_cpu/check.sh [coreset|conv|softmax|head|real|all]  (default all: about 4 min on 2 cores; exit 1: a case failed)
source "$(dirname "$0")/../series_tree.sh"
WHICH=${1:-all}
E=bench/device/fusion_on_cpu
if [ -n "${TREE:-}" ]; then # a patched tree being edited (its ggml/ and tests/, copied)
  V=$T/tree && mkdir -p "$V" && cp -r "$TREE/ggml" "$TREE/tests" "$V/"
else
  V=$(series_tree)
fi
git -C "$V" apply "$ROOT/bench/device/kernels-test-cases.patch"
C=$V/ggml/src/ggml-cuda
LIB=$("$PY" -c 'import llama_cpp, pathlib; print(pathlib.Path(llama_cpp.__file__).parent / "lib")')
compile_and_run() { # $1: the program's source, then compiler flags
  g++ -std=c++20 -O1 -w -I"$T" -I"$E" -I"$V/ggml/include" -I"$V/ggml/src" -I"$V/tests" "${@:2}" "$1" \
      -L"$LIB" -lggml-base -lggml -lggml-cpu -Wl,-rpath,"$LIB" -pthread -o "$T/check"
  "$T/check"
}
cut_failed() { echo "could not cut $1 out of $C/clover-fusion.cu(h)" >&2; exit 2; }
# what the fusions' matchers share, with the fusions on (ggml_cuda_clover_legacy off; their switches read as ggml-cuda does)
cut_switches "$C"
{ cat "$T/switches.inc"
  sed -n "/^\/\/ ---- what the fusions share/,/^\/\/ ---- a fusion's launch/p" "$C/clover-fusion.cu"; } > "$T/fusion-common.inc"
grep -q 'clover_fusion_confined' "$T/fusion-common.inc" || cut_failed "the fusions' shared helpers"
{ sed -n '/^struct ggml_cuda_moe_coreset_match {/,/^};/p' "$C/clover-fusion.cuh"; cat "$T/fusion-common.inc"
  sed -n -e '/^#define MOE_CORESET_K_MAX/,/^#define MOE_CORESET_E_MAX/p' -e '/^static bool moe_coreset_is_end(/,/^}/p' \
      -e '/^bool ggml_cuda_match_moe_coreset(/,/^}/p' -e '/^bool ggml_cuda_moe_ids_from_coreset(/,/^}/p' "$C/clover-fusion.cu"
} > "$T/coreset-match.inc"
# the two kernels (cuda_on_host.h makes their qualifiers and static shared memory host C++), the choice of the rows'
# kernel's instance
sed -n -e '/^#define MOE_CORESET_ROW_WARPS/,/^#define MOE_CORESET_KEEP_THREADS/p' -e '/^template <int per_lane>$/,/^}/p' \
    -e '/^typedef void (\*moe_coreset_rows_t)/p' -e '/^static moe_coreset_rows_t moe_coreset_rows_kernel(/,/^}/p' \
    -e '/^static __global__ void __launch_bounds__(MOE_CORESET_KEEP_THREADS, 1)$/,/^}/p' "$C/clover-fusion.cu" \
    > "$T/coreset-kernel.inc"
grep -q 'ggml_cuda_match_moe_coreset' "$T/coreset-match.inc" && grep -q 'ggml_cuda_moe_ids_from_coreset' "$T/coreset-match.inc" && grep -q 'moe_coreset_rows_kernel(' "$T/coreset-kernel.inc" &&
    grep -q 'moe_coreset_keep_f32(' "$T/coreset-kernel.inc" || cut_failed "the coreset's matcher, its ids test or kernels"
sed -n "/^struct ggml_cuda_preview_conv_match {/,/^};/p" "$C/clover-fusion.cuh" > "$T/preview_conv-struct.inc"
cat "$T/preview_conv-struct.inc" "$T/fusion-common.inc" > "$T/preview_conv-match.inc"
sed -n "/^struct preview_conv_args {/,/^void ggml_cuda_op_preview_conv(/{/^void ggml_cuda_op_preview_conv(/!p}" \
    "$C/clover-fusion.cu" > "$T/preview_conv.inc"
grep -q ggml_cuda_preview_conv_match "$T/preview_conv-struct.inc" && grep -q preview_conv "$T/preview_conv.inc" ||
    cut_failed "the conv's matcher or kernel"
{ sed -n "/^struct ggml_cuda_block_softmax_match {/,/^};/p" "$C/clover-fusion.cuh"
  sed -n "/^\/\/ ---- a GDN layer's block softmax/,/^void ggml_cuda_op_block_softmax(/{/^void ggml_cuda_op_block_softmax(/!p}" \
      "$C/clover-fusion.cu"; } > "$T/block_softmax.inc"
grep -q ggml_cuda_match_block_softmax "$T/block_softmax.inc" && grep -q block_softmax_history_f32 "$T/block_softmax.inc" ||
    cut_failed "the block softmax's matcher or kernel"
# patch 0118's head (matcher and kernels)
{ sed -n "/^struct ggml_cuda_clover_head_match {/,/^};/p" "$C/clover-fusion.cuh"
  sed -n "/^\/\/ ---- a pass's head/,/^void ggml_cuda_op_clover_head(/{/^void ggml_cuda_op_clover_head(/!p}" \
      "$C/clover-fusion.cu"; } > "$T/head.inc"
grep -q ggml_cuda_match_clover_head "$T/head.inc" && grep -q clover_head_rows_f32 "$T/head.inc" ||
    cut_failed "the head's matcher or kernels"
rc=0
if [ "$WHICH" = all ] || [ "$WHICH" = coreset ]; then
  # Ampere's path (warp reductions) and the one before it (shuffles)
  compile_and_run "$E/coreset_on_cpu.cpp" -DMOE_CORESET_REDUX || rc=1
  compile_and_run "$E/coreset_on_cpu.cpp" || rc=1
fi
if [ "$WHICH" = all ] || [ "$WHICH" = conv ]; then
  compile_and_run "$E/preview_conv_on_cpu.cpp" || rc=1
fi
if [ "$WHICH" = all ] || [ "$WHICH" = softmax ]; then
  compile_and_run "$E/block_softmax_on_cpu.cpp" || rc=1
fi
if [ "$WHICH" = all ] || [ "$WHICH" = head ]; then
  compile_and_run "$E/head_on_cpu.cpp" || rc=1
fi
if [ "$WHICH" = all ] || [ "$WHICH" = real ]; then
  # the matchers and kernels on the tiny preset's real passes, in a CPU engine whose ggml the check shares
  REAL_LIB=${REAL_LIB:-$LIB}
  g++ -std=c++20 -O1 -w -shared -fPIC -DMOE_CORESET_REDUX -I"$T" -I"$E" -I"$V/ggml/include" -I"$V/ggml/src" "$E/real_graph.cpp" \
      -L"$REAL_LIB" -lggml-base -Wl,-rpath,"$REAL_LIB" -pthread -o "$T/real_graph.so"
  LLAMA_CPP_LIB_PATH=$REAL_LIB "$PY" "$E/real_graph.py" "$T/real_graph.so" || rc=1
fi
exit $rc
