// Experiment 0118 (a GDN layer's block softmax with its history slot as one CUDA kernel) checked without a GPU. The
// kernel's and the matcher's source, cut out of the patched topk-moe.cu by on_cpu.sh, run on host threads
// (cuda_on_host.h) on the graph of test-backend-ops' BLOCK_SOFTMAX_HISTORY case (kernels-test-cases.patch: the
// construction as clover-moe builds it), computed by ggml's CPU backend: the matcher must find the construction, and
// the kernel's output must match the graph's (NMSE below 1e-10: the sums run in another order).
#define main test_backend_ops_main
#include "test-backend-ops.cpp"
#undef main

#include "ggml-cpu.h"
#include "ggml-impl.h"

#include <random>

#include "cuda_on_host.h"

#include "block-softmax-match.inc"
#include "block-softmax.inc"

int main() {
    struct bsh_case {
        int64_t d_k, d_v, n, h_k, h_v;
        bool    gathered;
    };
    std::mt19937 rng(1);
    int          failed = 0, n_cases = 0;
    for (const bsh_case & c : std::vector<bsh_case>{ { 128, 128, 32, 4, 8, true }, { 128, 128, 32, 4, 8, false },
                                                     { 128, 128, 1, 2, 4, true },  { 64, 32, 17, 2, 4, true },
                                                     { 128, 64, 32, 4, 12, false }, { 128, 128, 32, 16, 32, true } }) {
        n_cases++;
        ggml_init_params           params = { 512 * 1024 * 1024, nullptr, false };
        ggml_context *             ctx    = ggml_init(params);
        test_block_softmax_history test(c.d_k, c.d_v, c.n, c.h_k, c.h_v, c.gathered);
        ggml_tensor *              out = test.build_graph(ctx);
        std::uniform_real_distribution<float> uniform(-1.0f, 1.0f), positive(1.0f, 8.0f);
        for (ggml_tensor * t = ggml_get_first_tensor(ctx); t != nullptr; t = ggml_get_next_tensor(ctx, t)) {
            if (t->op != GGML_OP_NONE || t->data == nullptr) {
                continue;
            }
            if (t->type == GGML_TYPE_I32) {
                ((int32_t *) t->data)[0] = 1;
                continue;
            }
            const bool scale = strcmp(t->name, "lambda") == 0;
            for (int64_t i = 0; i < ggml_nelements(t); i++) {
                ((float *) t->data)[i] = scale ? positive(rng) : uniform(rng);
            }
        }
        ggml_cgraph * gf = ggml_new_graph(ctx);
        ggml_build_forward_expand(gf, out);
        ggml_graph_compute_with_ctx(ctx, gf, 2);

        ggml_cuda_block_softmax_match match;
        int                           found = -1;
        for (int i = 0; i < ggml_graph_n_nodes(gf) && found < 0; i++) {
            if (ggml_cuda_match_block_softmax(gf, i, match)) {
                found = i;
            }
        }
        if (found < 0 || match.dst != out || (match.state_ids != nullptr) != c.gathered) {
            printf("%s: the matcher did not find the construction\n", test.vars().c_str());
            failed++;
            ggml_free(ctx);
            continue;
        }
        std::vector<float> want((const float *) out->data, (const float *) out->data + ggml_nelements(out));
        std::fill((float *) out->data, (float *) out->data + ggml_nelements(out), 0.0f);
        const block_softmax_args a = block_softmax_make_args(match);
        cuda_on_host::launch({ (unsigned) c.h_v, (unsigned) (c.d_v / BLOCK_SOFTMAX_COLS), 1 },
                             { BLOCK_SOFTMAX_WARPS * 32, 1, 1 }, [&] { block_softmax_history_f32(a); });
        double err = 0.0, norm = 0.0;
        for (size_t i = 0; i < want.size(); i++) {
            const double d = (double) ((float *) out->data)[i] - want[i];
            err += d * d;
            norm += (double) want[i] * want[i];
        }
        const double nmse = err / norm;
        failed += !(nmse < 1e-10);
        printf("%s: the construction's %d nodes from node %d, NMSE against the CPU graph %.2g%s\n", test.vars().c_str(),
               match.node_count, found, nmse, nmse < 1e-10 ? "" : "  FAIL");
        ggml_free(ctx);
    }
    printf("%d cases, %d failed\n", n_cases, failed);
    return failed != 0;
}
