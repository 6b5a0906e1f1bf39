#!/usr/bin/env bash
# Experiment 0125 (F32 MUL_MAT of 17-64 columns split over K in a thread-block cluster) checked on a machine without a
# GPU: the series and the experiment applied to a scratch tree, the kernel cut out of mmf-splitk.cu and run on host
# threads, each cluster's CTAs at once, against a double-precision product (mmf_splitk_on_cpu.cpp). Exit 1: a case
# failed.
#
#   bash bench/device/experiments/mmf_splitk_on_cpu.sh   (about 10 s)
source "$(dirname "$0")/../series_tree.sh"
E=bench/device/experiments
V=$(series_tree "$E"/0125-*.patch)
C=$V/ggml/src/ggml-cuda/mmf-splitk.cu
# the constants and the kernel; its shared tile and staged activations become the host CTA's own (cluster_on_host's
# per-rank storage)
sed -n -e '/^#define MMFS_CLUSTER/,/^#define MMFS_MAX_COLS/p' -e '/^static __global__ void __launch_bounds__/,/^}/p' "$C" |
  sed -e 's/^\( *\)__shared__ float part\[MMFS_ROWS\]\[MMFS_MAX_COLS\];/\1auto \& part = cluster_on_host::rank_shared<float[MMFS_ROWS][MMFS_MAX_COLS]>();/' \
      -e 's/^\( *\)extern __shared__ float ys\[\];/\1float * ys = cluster_on_host::rank_dynamic();/' \
  > "$T/mmf-splitk-kernel.inc"
grep -q 'mul_mat_f_splitk(' "$T/mmf-splitk-kernel.inc" && grep -q 'rank_shared' "$T/mmf-splitk-kernel.inc" &&
  grep -q 'rank_dynamic' "$T/mmf-splitk-kernel.inc" ||
  { echo "could not cut the kernel out of $C" >&2; exit 2; }
g++ -std=c++20 -O1 -w -I"$T" -Ibench/device/fusion_on_cpu "$E/mmf_splitk_on_cpu.cpp" -pthread -o "$T/check"
"$T/check"
