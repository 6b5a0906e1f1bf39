#!/usr/bin/env bash
# Experiment 0117 (a block's expert coreset as one CUDA kernel) checked on a machine without a GPU:
# coreset_on_cpu.cpp runs the kernel's own source on host threads and the matcher's own source on the
# graph of test-backend-ops' MOE_CORESET case, against ggml's CPU backend (the venv's llama_cpp libraries).
#
#   bash bench/device/experiments/coreset_on_cpu.sh      (about a minute; exits 1 when a case fails)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$ROOT"
PY=${PY:-.venv/bin/python}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
# the series + 0117, and test-backend-ops with the project's cases
V=$("$PY" - "$T" <<'PYEOF'
import sys
from pathlib import Path
from clover_patches import build
exp = [p.resolve() for p in sorted(Path("bench/device/experiments").glob("0117-*.patch"))]
tree = build.prepare_tree(Path(sys.argv[1]) / "tree", build.series() + exp)
print(tree / build.VENDOR)
PYEOF
)
patch -d "$V" -p1 --forward --batch --quiet < bench/device/kernels-test-cases.patch
C=$V/ggml/src/ggml-cuda
sed -n '/^struct ggml_cuda_moe_coreset_match {/,/^};/p' "$C/topk-moe.cuh" > "$T/coreset-match.inc"
sed -n -e '/^#define MOE_CORESET_WARPS/,/^#define MOE_CORESET_SMEM_MAX/p' -e '/^static int moe_coreset_pow2/,/^}/p' \
    -e '/^static size_t moe_coreset_smem/,/^}/p' -e '/^static bool moe_coreset_is_view/,/^}/p' \
    -e '/^bool ggml_cuda_match_moe_coreset(/,/^}/p' "$C/topk-moe.cu" >> "$T/coreset-match.inc"
# the kernel as a host function, its shared memory a buffer
sed -n '/^static __global__ void __launch_bounds__(MOE_CORESET_WARPS \* WARP_SIZE, 1)/,/^}/p' "$C/topk-moe.cu" |
    sed -e '1,2s/^static __global__ void __launch_bounds__(MOE_CORESET_WARPS \* WARP_SIZE, 1)/static void/' \
        -e 's/^    extern __shared__ float smem\[\];/    float * smem = g_smem.data();/' > "$T/coreset-kernel.inc"
grep -q 'ggml_cuda_match_moe_coreset' "$T/coreset-match.inc" && grep -q 'g_smem.data()' "$T/coreset-kernel.inc" ||
    { echo "could not cut the matcher or the kernel out of $C/topk-moe.cu" >&2; exit 2; }
LIB=$("$PY" -c 'import llama_cpp, pathlib; print(pathlib.Path(llama_cpp.__file__).parent / "lib")')
g++ -std=c++20 -O1 -w -DWARP_SIZE=32 -I"$T" -I"$V/ggml/include" -I"$V/ggml/src" -I"$V/tests" \
    bench/device/experiments/coreset_on_cpu.cpp -L"$LIB" -lggml-base -lggml -lggml-cpu -Wl,-rpath,"$LIB" -pthread \
    -o "$T/check"
"$T/check"
