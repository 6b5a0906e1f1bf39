// Experiment 0119 (a GDN layer's conv with its right taps as one CUDA kernel) checked without a GPU. The kernel's and
// the matcher's source, cut out of the patched topk-moe.cu by on_cpu.sh, run on host threads (cuda_on_host.h) on the
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

#include "preview-conv-match.inc"
#include "preview-conv.inc"

int main() {
    struct conv_case {
        int64_t channels, n, k;
    };
    std::mt19937 rng(1);
    int          failed = 0, n_cases = 0;
    for (const conv_case & c : std::vector<conv_case>{ { 8192, 32, 4 }, { 8192, 2, 4 }, { 256, 17, 4 }, { 256, 32, 5 } }) {
        n_cases++;
        ggml_init_params  params = { 256 * 1024 * 1024, nullptr, false };
        ggml_context *    ctx    = ggml_init(params);
        test_preview_conv test(c.channels, c.n, c.k);
        ggml_tensor *     out = test.build_graph(ctx);
        std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
        for (ggml_tensor * t = ggml_get_first_tensor(ctx); t != nullptr; t = ggml_get_next_tensor(ctx, t)) {
            if (t->op != GGML_OP_NONE || t->data == nullptr) {
                continue;
            }
            for (int64_t i = 0; i < ggml_nelements(t); i++) {
                if (t->type == GGML_TYPE_I32) {
                    ((int32_t *) t->data)[i] = 2;
                } else {
                    ((float *) t->data)[i] = uniform(rng);
                }
            }
        }
        ggml_cgraph * gf = ggml_new_graph(ctx);
        ggml_build_forward_expand(gf, out);
        ggml_graph_compute_with_ctx(ctx, gf, 2);

        ggml_cuda_preview_conv_match match;
        int                          found = -1;
        for (int i = 0; i < ggml_graph_n_nodes(gf) && found < 0; i++) {
            if (ggml_cuda_match_preview_conv(gf, i, match)) {
                found = i;
            }
        }
        if (found < 0 || match.dst != out) {
            printf("%s: the matcher did not find the construction\n", test.vars().c_str());
            failed++;
            ggml_free(ctx);
            continue;
        }
        std::vector<float> want((const float *) out->data, (const float *) out->data + ggml_nelements(out));
        std::fill((float *) out->data, (float *) out->data + ggml_nelements(out), 0.0f);
        const preview_conv_args a = preview_conv_make_args(match);
        cuda_on_host::launch({ (unsigned) ((c.channels + 255) / 256), (unsigned) c.n, 1 }, { 256, 1, 1 },
                             [&] { preview_conv_silu_f32(a); });
        double err = 0.0, norm = 0.0;
        for (size_t i = 0; i < want.size(); i++) {
            const double d = (double) ((float *) out->data)[i] - want[i];
            err += d * d;
            norm += (double) want[i] * want[i];
        }
        const double nmse = err / norm;
        failed += !(nmse < 1e-12);
        printf("%s: the construction's %d nodes from node %d, NMSE against the CPU graph %.2g%s\n", test.vars().c_str(),
               match.node_count, found, nmse, nmse < 1e-12 ? "" : "  FAIL");
        ggml_free(ctx);
    }
    printf("%d cases, %d failed\n", n_cases, failed);
    return failed != 0;
}
