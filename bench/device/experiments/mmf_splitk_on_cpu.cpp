// Experiment 0125's kernel (F32 MUL_MAT of 17-64 columns, K split over a cluster of CTAs) checked without a GPU: its
// source, cut out of the patched mmf-splitk.cu by mmf_splitk_on_cpu.sh, runs on host threads (fusion_on_cpu/
// cuda_on_host.h) against a double-precision product. A cluster's CTAs run at once, as one host block of all their
// threads: the kernel's threadIdx.y, blockIdx.x, shared tile and staged activations are the CTA's own, a barrier
// (__syncthreads, cluster.sync) waits for the whole cluster, and map_shared_rank() reads another CTA's tile. Cases: the
// router's shape at 17-64 columns, strided rows, the other test-backend-ops shape (64 x 512) and a short K. The bound:
// the FP32 sums' rounding, |error| <= 1e-5 * sum_k |x_k y_k|.
#include "cuda_on_host.h"

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#define __CUDA_ARCH__       900
#define GGML_CUDA_CC_HOPPER 900
#define MMFS_AVAILABLE
#define ggml_cuda_pdl_lc()

namespace cluster_on_host {
inline int    n_warps = 0; // a CTA's warps (the kernel's blockDim.y)
inline int    size    = 0; // CTAs a cluster
inline size_t stride  = 0; // the bytes of the kernel's one shared variable (rank_shared's copies lie this far apart)

inline int rank() { return (int) cuda_on_host::thread_idx.y / n_warps; }

// the CTA's copy of a __shared__ variable: one per rank, side by side
template <typename T> T & rank_shared() {
    static T all[16];
    return all[rank()];
}

// the CTA's dynamic shared memory (sized by the launch)
inline std::vector<std::vector<float>> dynamic;
inline float * rank_dynamic() { return dynamic[rank()].data(); }

struct thread_idx_t {
    unsigned x, y, z;
};
inline thread_idx_t thread_idx() { return { cuda_on_host::thread_idx.x, cuda_on_host::thread_idx.y % n_warps, 0 }; }
inline thread_idx_t block_idx() { return { cuda_on_host::block_idx.x * size + rank(), 0, 0 }; }
} // namespace cluster_on_host

namespace cooperative_groups {
struct cluster_group {
    unsigned block_rank() const { return (unsigned) cluster_on_host::rank(); }
    void     sync() const { __syncthreads(); } // the host block is the whole cluster
    // p lies in this CTA's copy of the rank_shared variable
    template <typename T> T * map_shared_rank(T * p, unsigned q) const {
        return p + (std::ptrdiff_t) ((int) q - cluster_on_host::rank()) * (std::ptrdiff_t) cluster_on_host::stride /
                       (std::ptrdiff_t) sizeof(T);
    }
};
inline cluster_group this_cluster() { return {}; }
} // namespace cooperative_groups

#undef threadIdx
#undef blockIdx
#define threadIdx (cluster_on_host::thread_idx())
#define blockIdx  (cluster_on_host::block_idx())

#include "mmf-splitk-kernel.inc"

int main() {
    struct mm_case {
        int M, K, N, pad_x, pad_y, pad_d;
    };
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    int failed = 0, n = 0;
    cluster_on_host::n_warps = MMFS_NWARPS;
    cluster_on_host::size    = MMFS_CLUSTER;
    cluster_on_host::stride  = sizeof(float[MMFS_ROWS][MMFS_MAX_COLS]);
    for (const mm_case & c : std::vector<mm_case>{ { 256, 2048, 32, 0, 0, 0 }, { 256, 2048, 17, 0, 0, 0 },
                                                   { 256, 2048, 64, 0, 0, 0 }, { 256, 2048, 33, 4, 8, 3 },
                                                   { 64, 512, 40, 0, 4, 0 },    { 16, 256, 63, 4, 0, 1 } }) {
        const int64_t sx = c.K + c.pad_x, sy = c.K + c.pad_y, sd = c.M + c.pad_d;
        std::vector<float> x(c.M * sx), y(c.N * sy), dst(c.N * sd, -7.0f);
        for (float & v : x) v = normal(rng);
        for (float & v : y) v = normal(rng);
        cluster_on_host::dynamic.assign(MMFS_CLUSTER, std::vector<float>((size_t) c.N * (c.K / MMFS_CLUSTER + 4)));
        cuda_on_host::launch({ (unsigned) (c.M / MMFS_ROWS), 1, 1 }, { WARP_SIZE, MMFS_NWARPS * MMFS_CLUSTER, 1 },
                             [&] { mul_mat_f_splitk(x.data(), y.data(), dst.data(), c.K, c.N, sx, sy, sd); });
        int bad = 0;
        double worst = 0.0;
        for (int col = 0; col < c.N; col++) {
            for (int r = 0; r < c.M; r++) {
                double ref = 0.0, mag = 0.0;
                for (int k = 0; k < c.K; k++) {
                    ref += (double) x[r * sx + k] * y[col * sy + k];
                    mag += std::fabs((double) x[r * sx + k] * y[col * sy + k]);
                }
                const double err = std::fabs(dst[col * sd + r] - ref) / mag;
                worst = std::max(worst, err);
                bad += !(err <= 1e-5);
            }
            for (int64_t r = c.M; r < sd; r++) {
                bad += dst[col * sd + r] != -7.0f; // padding untouched
            }
        }
        n++;
        failed += bad != 0;
        printf("M=%d K=%d N=%d strides +%d/+%d/+%d: %d bad, worst relative error %.2g\n", c.M, c.K, c.N, c.pad_x,
               c.pad_y, c.pad_d, bad, worst);
    }
    printf("%d cases, %d failed\n", n, failed);
    return failed != 0;
}
