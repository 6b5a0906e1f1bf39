#!/usr/bin/env bash
# Patch 0105's narrow MMQ kernel checked on a machine without a GPU: mmq-narrow.cu (its launch, the activations'
# conversion, the kernel) and mmid.cu's ids helper, cut out of the patched tree, run on host threads
# (../fusion_on_cpu/cuda_on_host.h and narrow_on_host.h: mma.sync, halves, cp.async emulated) against ggml's CPU backend
# on MUL_MAT_SMALL and MUL_MAT_ID_SMALL graphs and the experts' gate, up and SwiGLU in one launch (narrow_on_cpu.cpp). Each settings line below is one run: the defaults (halves to 32 columns, int8 at 17-32 columns
# from 65536 rows; MUL_MAT_ID in tiles of 16 with the next step in registers and tiles as units, with its weights
# through shared memory from K 1024, Q6_K's from K 512, patches 0123 and 0124), every case on the
# halves, every case in int8, int8 with q8_1's scales per 32 values and the column tiles' count at run time, and the
# ids as a block coreset's (NARROW_IDS_CROWDED=1: MUL_MAT_ID in tiles of 32, one step, patch 0122). TREE=<a patched llama.cpp tree>: cut the kernel from it instead of the series' (an
# experiment on the narrow kernel). NARROW_SETTINGS=<lines of VAR=V ...>: run those settings instead (an experiment's switches;
# NARROW_NSM=N, the emulated GPU's SM count, 132 by default, makes a launch's CTAs take several units of work each).
#
#   bash bench/device/narrow_on_cpu/check.sh   (about 8 min on 2 cores; exit 1: a case failed)
#   TREE=build/llama-dev/src/vendor/llama.cpp NARROW_SETTINGS=$'GGML_CUDA_MMQ_NARROW_ID_DBUF=1\nGGML_CUDA_MMQ_NARROW_ID_TILE=8' \
#     bash bench/device/narrow_on_cpu/check.sh
source "$(dirname "$0")/../series_tree.sh"
E=bench/device/narrow_on_cpu
if [ -n "${TREE:-}" ]; then
  V=$T/tree && mkdir -p "$V" && cp -r "$TREE/ggml" "$TREE/tests" "$V/"
else
  V=$(series_tree)
fi
git -C "$V" apply "$ROOT/bench/device/kernels-test-cases.patch"
C=$V/ggml/src/ggml-cuda
cut_switches "$C"
# the file without its includes, its inline-assembly helpers (narrow_on_host.h has host forms of the three mma and the
# prefetch) and with its dynamic shared memory where the host launch puts it
"$PY" - "$C/mmq-narrow.cu" "$T/narrow.inc" <<'PYEOF'
import re, sys
src = open(sys.argv[1]).read()
src = re.sub(r'^#include .*\n', '', src, flags=re.M)
cuts = ["mmqn_mma_k32", "mmqn_mma_k16", "mmqn_mma_f16", "mmqn_prefetch"]
cuts += [name for name in ("mmqn_cp_commit", "mmqn_cp_wait") if name + "()" in src]
for name in cuts:
    m = re.search(r'^(template <int \w+>\n)?static __device__ __forceinline__ void ' + name + r'\(.*?^}\n', src, flags=re.M | re.S)
    if not m:
        sys.exit(f"could not cut {name} out of {sys.argv[1]}")
    src = src[:m.start()] + src[m.end():]
shared = "    extern __shared__ char mmqn_smem[];\n"
if shared not in src:
    sys.exit("no dynamic shared memory declaration in " + sys.argv[1])
src = src.replace(shared, "    char * mmqn_smem = narrow_on_host::dynamic_smem.data();\n")
open(sys.argv[2], "w").write(src)
PYEOF
# mmid.cu's ids helper (MUL_MAT_ID's columns sorted by expert), its dynamic shared memory and launch the host's
"$PY" - "$C/mmid.cu" "$T/mmid.inc" <<'PYEOF'
import re, sys
src = open(sys.argv[1]).read()
src = re.sub(r'^#include .*\n', '', src, flags=re.M)
shared = "    extern __shared__ char data_mm_ids_helper[];\n"
launch = re.compile(r'(mm_ids_helper<n_expert_used_template>)<<<(.*?)>>>\s*\((.*?)\);', re.S)
if shared not in src or not launch.search(src):
    sys.exit("could not adapt " + sys.argv[1])
src = src.replace(shared, "    char * data_mm_ids_helper = narrow_on_host::dynamic_smem.data();\n")
src = launch.sub(r'ggml_cuda_kernel_launch(\1, ggml_cuda_kernel_launch_params(\2), \3);', src)
open(sys.argv[2], "w").write(src)
PYEOF
LIB=$("$PY" -c 'import llama_cpp, pathlib; print(pathlib.Path(llama_cpp.__file__).parent / "lib")')
g++ -std=c++20 -O1 -w -I"$T" -I"$E" -I"$ROOT/bench/device/fusion_on_cpu" -I"$V/ggml/include" -I"$V/ggml/src" \
    -I"$V/tests" "$E/narrow_on_cpu.cpp" -L"$LIB" -lggml-base -lggml -lggml-cpu -Wl,-rpath,"$LIB" -pthread -o "$T/check"
DEFAULT_SETTINGS=$(cat <<'SETTINGS'

GGML_CUDA_MMQ_NARROW_DENSE_MAX=64 GGML_CUDA_MMQ_NARROW_DENSE_MIN_ROWS=16 GGML_CUDA_MMQ_NARROW_F16=2
GGML_CUDA_MMQ_NARROW_DENSE_MAX=8 GGML_CUDA_MMQ_NARROW_DENSE_I8_MAX=64 GGML_CUDA_MMQ_NARROW_DENSE_I8_MIN_ROWS=16
GGML_CUDA_MMQ_NARROW_DENSE_MAX=8 GGML_CUDA_MMQ_NARROW_DENSE_I8_MAX=64 GGML_CUDA_MMQ_NARROW_DENSE_I8_MIN_ROWS=16 GGML_CUDA_MMQ_NARROW_Q8K=0 GGML_CUDA_MMQ_NARROW_FULL_TILES=0
NARROW_IDS_CROWDED=1
SETTINGS
)
rc=0
while read -r settings; do
  echo "-- ${settings:-defaults}"
  env $settings "$T/check" || rc=1
done <<< "${NARROW_SETTINGS-$DEFAULT_SETTINGS}"
exit $rc
