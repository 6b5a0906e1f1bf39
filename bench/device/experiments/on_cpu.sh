#!/usr/bin/env bash
# The CUDA experiments of this folder checked on a machine without a GPU: each kernel's own source, cut out of the
# series + the experiment, runs on host threads (cuda_on_host.h) against ggml's CPU backend (the venv's llama_cpp
# libraries, the patched tree's headers).
#   coreset (0117): coreset_on_cpu.cpp, the coreset kernel and its matcher on test-backend-ops' MOE_CORESET graphs;
#   gdn (0115):     gdn_on_cpu.cpp, the staged gated delta net against the token-by-token kernel and the CPU;
#   bsh (0118):     block_softmax_on_cpu.cpp, the block softmax kernel and its matcher on BLOCK_SOFTMAX_HISTORY graphs;
#   conv (0119):    preview_conv_on_cpu.cpp, the conv kernel and its matcher on PREVIEW_CONV graphs.
#
#   bash bench/device/experiments/on_cpu.sh [coreset|gdn|bsh|conv|all]  (default all: about 7 min on 2 cores; exit 1: a case failed)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$ROOT"
PY=${PY:-.venv/bin/python}
WHICH=${1:-all}
E=bench/device/experiments
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
V=$("$PY" - "$T" <<'PYEOF'
import sys
from pathlib import Path
from clover_patches import build
exps = [p.resolve() for n in ("0115", "0117", "0118", "0119") for p in sorted(Path("bench/device/experiments").glob(f"{n}-*.patch"))]
print(build.prepare_tree(Path(sys.argv[1]) / "tree", build.series() + exps) / build.VENDOR)
PYEOF
)
patch -d "$V" -p1 --forward --batch --quiet < bench/device/kernels-test-cases.patch
C=$V/ggml/src/ggml-cuda
LIB=$("$PY" -c 'import llama_cpp, pathlib; print(pathlib.Path(llama_cpp.__file__).parent / "lib")')
compile_and_run() { # $1: the program's source
  g++ -std=c++20 -O1 -w -I"$T" -I"$E" -I"$V/ggml/include" -I"$V/ggml/src" -I"$V/tests" "$1" \
      -L"$LIB" -lggml-base -lggml -lggml-cpu -Wl,-rpath,"$LIB" -pthread -o "$T/check"
  "$T/check"
}
cut_failed() { echo "could not cut $1 out of $C" >&2; exit 2; }
# what the three fusions' matchers share
sed -n "/^\/\/ ---- what clover-moe's fusions share/,/^\/\/ ---- a block's expert coreset/p" "$C/topk-moe.cu" \
    > "$T/fusion-common.inc"
grep -q 'clover_fusion_confined' "$T/fusion-common.inc" || cut_failed "the fusions' shared helpers"
# a fusion's matcher and kernel into $T/$1-match.inc and $T/$1.inc: $2 its match struct (topk-moe.cuh), $3 the first
# line of its code in topk-moe.cu, $4 the launcher there, before which that code ends
cut_fusion() {
  { sed -n "/^struct $2 {/,/^};/p" "$C/topk-moe.cuh"; cat "$T/fusion-common.inc"; } > "$T/$1-match.inc"
  sed -n "/^$3/,/^void $4(/{/^void $4(/!p}" "$C/topk-moe.cu" > "$T/$1.inc"
  grep -q "$2" "$T/$1-match.inc" && grep -q "$1" "$T/$1.inc" || cut_failed "the $1 fusion's matcher or kernel"
}
rc=0
if [ "$WHICH" = all ] || [ "$WHICH" = coreset ]; then
  { sed -n '/^struct ggml_cuda_moe_coreset_match {/,/^};/p' "$C/topk-moe.cuh"; cat "$T/fusion-common.inc"
    sed -n -e '/^#define MOE_CORESET_WARPS/,/^#define MOE_CORESET_SMEM_MAX/p' -e '/^static int moe_coreset_pow2/,/^}/p' \
        -e '/^static size_t moe_coreset_smem/,/^}/p' -e '/^bool ggml_cuda_match_moe_coreset(/,/^}/p' "$C/topk-moe.cu"
  } > "$T/coreset-match.inc"
  # the kernel as a host function, its dynamic shared memory a buffer
  sed -n '/^static __global__ void __launch_bounds__(MOE_CORESET_WARPS \* WARP_SIZE, 1)/,/^}/p' "$C/topk-moe.cu" |
      sed -e '1s/^static __global__ void __launch_bounds__(MOE_CORESET_WARPS \* WARP_SIZE, 1)/static void/' \
          -e 's/^    extern __shared__ float smem\[\];/    float * smem = g_smem.data();/' > "$T/coreset-kernel.inc"
  grep -q 'ggml_cuda_match_moe_coreset' "$T/coreset-match.inc" && grep -q 'g_smem.data()' "$T/coreset-kernel.inc" ||
      cut_failed "the coreset's matcher or kernel"
  compile_and_run "$E/coreset_on_cpu.cpp" || rc=1
fi
if [ "$WHICH" = all ] || [ "$WHICH" = gdn ]; then
  sed -n -e '/^template <int S_v, bool KDA, bool keep_rs_t>/,/^template <bool KDA, bool keep_rs_t>/{/^template <bool KDA, bool keep_rs_t>/!p}' \
      -e '/^#define GDN_STAGE_TOKENS/,/^template <bool keep_rs_t>/{/^template <bool keep_rs_t>/!p}' \
      "$C/gated_delta_net.cu" > "$T/gdn-kernels.inc"
  grep -q 'gated_delta_net_staged_cuda' "$T/gdn-kernels.inc" || cut_failed "the gated delta net kernels"
  compile_and_run "$E/gdn_on_cpu.cpp" || rc=1
fi
if [ "$WHICH" = all ] || [ "$WHICH" = bsh ]; then
  cut_fusion block_softmax ggml_cuda_block_softmax_match '#define BLOCK_SOFTMAX_N_MAX' ggml_cuda_op_block_softmax
  compile_and_run "$E/block_softmax_on_cpu.cpp" || rc=1
fi
if [ "$WHICH" = all ] || [ "$WHICH" = conv ]; then
  cut_fusion preview_conv ggml_cuda_preview_conv_match 'struct preview_conv_args {' ggml_cuda_op_preview_conv
  compile_and_run "$E/preview_conv_on_cpu.cpp" || rc=1
fi
exit $rc
