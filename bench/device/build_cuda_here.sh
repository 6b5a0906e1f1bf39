#!/usr/bin/env bash
# Build the patched llama.cpp's CUDA libraries (sm_90) on this machine, which has nvcc but no GPU,
# cuBLAS or libcuda, so that a device run carries them instead of building there
# (`prepare.py --prebuilt build/cuda-local`). Takes about 40 minutes on 2 cores.
#
#   bash bench/device/build_cuda_here.sh [BUILD_DIR]     (default build/cuda-local)
#
# The source is patches/build.py's persistent patched tree (`python patches/build.py --dev` first).
# cuBLAS headers and libraries come from PyPI's nvidia-cublas wheel (CUDA 13, as on the device);
# libcuda is a stub with the real soname: the driver's own libcuda.so.1 is loaded on the device.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/build/cuda-local}
SRC=$ROOT/build/llama-dev/src/vendor/llama.cpp
DEPS=$ROOT/build/cuda-deps
[ -d "$SRC" ] || { echo "no $SRC: run python patches/build.py --dev first" >&2; exit 1; }
mkdir -p "$DEPS"
if [ ! -f "$DEPS/cublas/nvidia/cu13/lib/libcublas.so" ]; then
  python3 -m pip download --no-deps -q -d "$DEPS" 'nvidia-cublas>=13,<14'
  mkdir -p "$DEPS/cublas" && unzip -q -o "$DEPS"/nvidia_cublas-*.whl -d "$DEPS/cublas"
  (cd "$DEPS/cublas/nvidia/cu13/lib" && ln -sf libcublas.so.13 libcublas.so && ln -sf libcublasLt.so.13 libcublasLt.so)
fi
C=$DEPS/cublas/nvidia/cu13
if [ ! -f "$DEPS/stub/libcuda.so" ]; then
  mkdir -p "$DEPS/stub" && echo 'void clover_cuda_stub(void) {}' > "$DEPS/stub/s.c"
  gcc -shared -fPIC -o "$DEPS/stub/libcuda.so" -Wl,-soname,libcuda.so.1 "$DEPS/stub/s.c"
fi
cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
  -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_GRAPHS=ON -DGGML_RPC=ON \
  -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF \
  -DLLAMA_BUILD_COMMON=OFF -DLLAMA_CURL=OFF \
  -DCUDA_cublas_LIBRARY="$C/lib/libcublas.so" -DCUDA_cublasLt_LIBRARY="$C/lib/libcublasLt.so" \
  -DCUDA_cuda_driver_LIBRARY="$DEPS/stub/libcuda.so" -DCMAKE_SHARED_LINKER_FLAGS=-Wl,--no-as-needed \
  -DCMAKE_BUILD_RPATH='$ORIGIN' -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON \
  -DCMAKE_CUDA_FLAGS="-I$C/include" -DCMAKE_CXX_FLAGS="-I$C/include"
ninja -C "$BUILD" llama
