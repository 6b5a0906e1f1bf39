// Experiment 0118's kernel (F32 MUL_MAT of 17-64 columns in one launch) checked without a GPU: its source, cut out of
// the patched mmf-narrow.cu by mmf_narrow_on_cpu.sh, runs on host threads (fusion_on_cpu/cuda_on_host.h) against a
// double-precision product, at the router's shape and at the edges of its range (17 and 64 columns, padded column
// groups, strided rows, one K step of the warp). The bound: the FP32 sums' rounding, |error| <= 1e-5 * sum_k |x_k y_k|.
#include "cuda_on_host.h"

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "mmf-narrow-kernel.inc"

int main() {
    struct mm_case {
        int M, K, N, pad_x, pad_y, pad_d;
    };
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    int failed = 0, n = 0;
    for (const mm_case & c : std::vector<mm_case>{ { 256, 2048, 32, 0, 0, 0 }, { 256, 2048, 17, 0, 0, 0 },
                                                   { 256, 2048, 64, 0, 0, 0 }, { 256, 2048, 33, 4, 8, 3 },
                                                   { 8, 128, 21, 0, 4, 0 },     { 1024, 128, 64, 4, 0, 1 } }) {
        const int64_t sx = c.K + c.pad_x, sy = c.K + c.pad_y, sd = c.M + c.pad_d;
        std::vector<float> x(c.M * sx), y(c.N * sy), dst(c.N * sd, -7.0f);
        for (float & v : x) v = normal(rng);
        for (float & v : y) v = normal(rng);
        const int threads = MMFN_KSPLIT * ((c.N + MMFN_COLS - 1) / MMFN_COLS);
        cuda_on_host::launch({ (unsigned) (c.M / MMFN_ROWS), 1, 1 }, { (unsigned) threads, 1, 1 },
                             [&] { mul_mat_f_narrow(x.data(), y.data(), dst.data(), c.K, c.N, sx, sy, sd); });
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
