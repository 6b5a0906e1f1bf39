#!/usr/bin/env bash
# Experiment 0118 (F32 MUL_MAT of 17-64 columns in one kernel) checked on a machine without a GPU: the series and the
# experiment applied to a scratch tree, the kernel cut out of mmf-narrow.cu and run on host threads against a
# double-precision product (mmf_narrow_on_cpu.cpp). Exit 1: a case failed.
#
#   bash bench/device/experiments/mmf_narrow_on_cpu.sh
source "$(dirname "$0")/../series_tree.sh"
E=bench/device/experiments
V=$(series_tree "$E"/0118-*.patch)
C=$V/ggml/src/ggml-cuda/mmf-narrow.cu
sed -n -e '/^#define MMFN_ROWS/,/^#define MMFN_MAX_ROWS/p' -e '/^static __global__ void __launch_bounds__/,/^}/p' "$C" \
    > "$T/mmf-narrow-kernel.inc"
grep -q 'mul_mat_f_narrow(' "$T/mmf-narrow-kernel.inc" || { echo "could not cut the kernel out of $C" >&2; exit 2; }
g++ -std=c++20 -O1 -w -I"$T" -Ibench/device/fusion_on_cpu "$E/mmf_narrow_on_cpu.cpp" -pthread -o "$T/check"
"$T/check"
