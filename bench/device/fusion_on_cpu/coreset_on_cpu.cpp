// The block expert coreset (patch 0114's matcher, 0117's two kernels) checked without a GPU. The kernels' source, cut
// out of the patched clover-fusion.cu by check.sh, runs on host threads (cuda_on_host.h, coreset_on_host.h), on the
// graph of test-backend-ops' MOE_CORESET case (kernels-test-cases.patch: the construction as clover-moe builds it),
// computed by ggml's CPU backend; the matcher, cut out the same way, must find the construction in that graph. Every
// element of the kernels' output must equal the graph's logits + log(keep).
#define main test_backend_ops_main
#include "test-backend-ops.cpp"
#undef main

#include "ggml-cpu.h"
#include "ggml-impl.h"

#include <random>

#include "coreset-match.inc"

#include "cuda_on_host.h"
#include "on_cpu_check.h"

#include "coreset-kernel.inc"
#include "coreset_on_host.h"

// ---- the cases ------------------------------------------------------------------------------------------------------
int main() {
    struct coreset_case {
        int64_t n_expert, n_rows;
        int     k;
        float   top_p;
        int     size;
    };
    std::mt19937 rng(1);
    int          failed = 0, n = 0;
    for (const coreset_case & c : std::vector<coreset_case>{ { 256, 32, 8, 0.9f, 0 },  { 256, 1, 8, 0.5f, 0 },
                                                             { 256, 64, 8, 0.9f, 0 },  { 256, 32, 8, 0.9f, 32 },
                                                             { 256, 8, 8, 0.5f, 8 },   { 128, 32, 8, 0.8f, 0 },
                                                             { 512, 32, 10, 0.9f, 0 }, { 200, 16, 4, 0.7f, 0 },
                                                             { 8, 32, 2, 0.9f, 0 },    { 8, 32, 2, 0.9f, 4 } }) {
        for (int rep = 0; rep < 3; rep++, n++) {
            ggml_init_params params = { 256 * 1024 * 1024, nullptr, false };
            ggml_context *   ctx    = ggml_init(params);
            test_moe_coreset test(c.n_expert, c.n_rows, c.k, c.top_p, c.size);
            ggml_tensor *    out    = test.build_graph(ctx);
            ggml_tensor *    logits = ggml_get_tensor(ctx, "logits");
            ggml_tensor *    add    = out->src[0]; // logits + log(keep), before the routing's softmax
            std::uniform_real_distribution<float> uniform(-4.0f, 4.0f);
            ggml_cgraph * gf = compute_on_cpu(ctx, out, 0, [&](const ggml_tensor *) { return uniform(rng); });

            ggml_cuda_moe_coreset_match match;
            const int                   found = find_construction(gf, ggml_cuda_match_moe_coreset, match);
            if (found < 0 || match.dst != add || match.logits != logits || match.k != c.k ||
                (c.size > 0 ? match.size != c.size : match.top_p != c.top_p)) {
                printf("%s: the matcher did not find the construction\n", test.vars().c_str());
                failed++;
                ggml_free(ctx);
                continue;
            }

            std::vector<float> dst(ggml_nelements(add));
            moe_coreset_on_host((const float *) logits->data, logits->nb[1] / sizeof(float), dst.data(), (int) c.n_expert,
                                (int) c.n_rows, match.k, match.top_p, match.size);
            const int differ = (int) std::lround(
                mismatch(dst.data(), (const float *) add->data, (int64_t) dst.size(), 0.0) * (double) dst.size());
            int kept = 0;
            for (int64_t e = 0; e < c.n_expert; e++) {
                kept += !std::isinf(dst[e]);
            }
            failed += differ != 0;
            printf("%s: %d experts kept, %d of %zu elements differ\n", test.vars().c_str(), kept, differ, dst.size());
            ggml_free(ctx);
        }
    }
    printf("%d cases, %d failed\n", n, failed);
    return failed != 0;
}
