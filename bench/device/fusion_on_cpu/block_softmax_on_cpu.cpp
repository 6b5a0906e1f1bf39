// Patch 0116's GDN block softmax with its history slot (one CUDA kernel) checked without a GPU. The kernel's and the
// matcher's source, cut out of the patched clover-fusion.cu by check.sh, run on host threads (cuda_on_host.h) on the
// graphs of test-backend-ops' BLOCK_SOFTMAX_HISTORY cases (kernels-test-cases.patch: the construction as clover-moe
// builds it), computed by ggml's CPU backend: the matcher must find the whole construction, and the kernel's output
// must match the graph's (NMSE below 1e-10: the sums run in another order), in 0120's 16 warps a CTA and in the 8 of
// its measurement switch.
#define main test_backend_ops_main
#include "test-backend-ops.cpp"
#undef main

#include "ggml-cpu.h"
#include "ggml-impl.h"

#include <random>

#include "cuda_on_host.h"
#include "on_cpu_check.h"

#include "fusion-common.inc"
#include "block_softmax.inc"

int main() {
    struct bs_case {
        int64_t d_k, d_v, n, h_k, h_v;
        bool    gathered;
    };
    std::mt19937 rng(1);
    int          failed = 0, n_cases = 0;
    for (const bs_case & c : std::vector<bs_case>{ { 128, 128, 32, 16, 32, true }, { 128, 128, 32, 16, 32, false },
                                                   { 128, 128, 1, 16, 32, true }, { 64, 32, 17, 2, 4, true },
                                                   { 128, 64, 32, 4, 12, false }, { 16, 16, 32, 2, 4, true },
                                                   { 128, 128, 2, 16, 32, false }, { 128, 128, 5, 16, 32, true } }) {
        n_cases++;
        ggml_init_params           params = { 256 * 1024 * 1024, nullptr, false };
        ggml_context *             ctx    = ggml_init(params);
        test_block_softmax_history test(c.d_k, c.d_v, c.n, c.h_k, c.h_v, c.gathered);
        ggml_tensor *              out = test.build_graph(ctx);
        std::uniform_real_distribution<float> uniform(-1.0f, 1.0f), positive(1.0f, 8.0f);
        ggml_cgraph * gf = compute_on_cpu(ctx, out, 1, [&](const ggml_tensor * t) {
            return strcmp(t->name, "lambda") == 0 ? positive(rng) : uniform(rng);
        });
        ggml_cuda_block_softmax_match match;
        int found = find_construction(gf, ggml_cuda_match_block_softmax, match);
        for (int i = 0; found >= 0 && i < found; i++) { // only views before it: the whole graph
            found = ggml_op_is_empty(ggml_graph_node(gf, i)->op) ? found : -1;
        }
        if (found >= 0 && (match.dst != out || found + match.node_count != ggml_graph_n_nodes(gf))) {
            found = -1;
        }
        // 0120's 16 warps a CTA, then 0116's 8 (GGML_CUDA_CLOVER_BLOCK_SOFTMAX_WARPS=8), each against the CPU graph's
        // output (kernel_nmse leaves the kernel's in out)
        const std::vector<float> cpu((float *) out->data, (float *) out->data + ggml_nelements(out));
        for (const bool w8 : { false, true }) {
            n_cases += w8;
            double nmse = 0.0;
            std::copy(cpu.begin(), cpu.end(), (float *) out->data);
            if (found >= 0) {
                const block_softmax_args a    = block_softmax_make_args(match);
                const dim3               grid = block_softmax_grid(match);
                nmse = kernel_nmse(out, [&] {
                    cuda_on_host::launch({ grid.x, grid.y, 1 }, { (w8 ? 8u : BLOCK_SOFTMAX_WARPS) * 32, 1, 1 }, [&] {
                        if (w8) {
                            block_softmax_history_f32_w8(a);
                        } else {
                            block_softmax_history_f32(a);
                        }
                    });
                });
            }
            failed += !report(test.vars() + (w8 ? ",warps=8" : ""), found, match.node_count, nmse, 1e-10);
        }
        ggml_free(ctx);
    }
    printf("%d cases, %d failed\n", n_cases, failed);
    return failed != 0;
}
