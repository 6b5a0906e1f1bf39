// Patch 0114's GDN conv with its right taps (one CUDA kernel) checked without a GPU. The kernel's and
// the matcher's source, cut out of the patched clover-fusion.cu by check.sh, run on host threads (cuda_on_host.h) on the
// graph of test-backend-ops' PREVIEW_CONV case (kernels-test-cases.patch: the construction as clover-moe builds it),
// computed by ggml's CPU backend: the matcher must find the construction, and the kernel's output must match the
// graph's (NMSE below 1e-12).
#define main test_backend_ops_main
#include "test-backend-ops.cpp"
#undef main

#include "ggml-cpu.h"
#include "ggml-impl.h"

#include <random>

#include "cuda_on_host.h"
#include "on_cpu_check.h"

#include "preview_conv-match.inc"
#include "preview_conv.inc"

int main() {
    struct conv_case {
        int64_t channels, n, k;
    };
    std::mt19937 rng(1);
    int          failed = 0, n_cases = 0;
    for (const conv_case & c : std::vector<conv_case>{ { 8192, 32, 4 }, { 8192, 2, 4 }, { 256, 17, 4 }, { 256, 32, 5 }, { 128, 32, 4 } }) {
        n_cases++;
        ggml_init_params  params = { 256 * 1024 * 1024, nullptr, false };
        ggml_context *    ctx    = ggml_init(params);
        test_preview_conv test(c.channels, c.n, c.k);
        ggml_tensor *     out = test.build_graph(ctx);
        std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
        ggml_cgraph * gf = compute_on_cpu(ctx, out, 2, [&](const ggml_tensor *) { return uniform(rng); });
        ggml_cuda_preview_conv_match match;
        int found = find_construction(gf, ggml_cuda_match_preview_conv, match);
        if (found >= 0 && match.dst != out) {
            found = -1;
        }
        double nmse = 0.0;
        if (found >= 0) {
            const preview_conv_args a = preview_conv_make_args(match);
            nmse = kernel_nmse(out, [&] {
                cuda_on_host::launch({ (unsigned) ((c.channels + 255) / 256), (unsigned) c.n, 1 }, { 256, 1, 1 },
                                     [&] { preview_conv_silu_f32(a); });
            });
        }
        failed += !report(test.vars(), found, match.node_count, nmse, 1e-12);
        ggml_free(ctx);
    }
    printf("%d cases, %d failed\n", n_cases, failed);
    return failed != 0;
}
