// Patch 0118's head (its matcher and two kernels) checked without a GPU. The source, cut out of the patched
// clover-fusion.cu by check.sh, runs on host threads (cuda_on_host.h) on the graphs of test-backend-ops' CLOVER_HEAD
// cases (kernels-test-cases.patch: the construction as clover-moe builds it at temperature 0), computed by ggml's CPU
// backend: the matcher must find the whole construction with the graph's two outputs, every token must equal the
// graph's and every probability must lie within 1e-5 of it (the sums run in another order).
#define main test_backend_ops_main
#include "test-backend-ops.cpp"
#undef main

#include "ggml-cpu.h"
#include "ggml-impl.h"

#include <climits>
#include <random>

#include "cuda_on_host.h"
#include "on_cpu_check.h"

#include "fusion-common.inc"
#include "head.inc"
#include "head_on_host.h"

int main() {
    struct head_case {
        int64_t n_vocab;
        int     n_rows, chunk;
    };
    std::mt19937 rng(1);
    int          failed = 0, n_cases = 0;
    for (const head_case & c : std::vector<head_case>{ { 248320, 1, 1940 }, { 248320, 8, 1940 }, { 151936, 3, 1187 },
                                                       { 997, 5, 997 }, { 1024, 130, 512 }, { 4096, 33, 2048 } }) {
        n_cases++;
        ggml_init_params params = { 1024ull * 1024 * 1024, nullptr, false };
        ggml_context *   ctx    = ggml_init(params);
        test_clover_head test(c.n_vocab, c.n_rows, c.chunk);
        ggml_tensor *    out = test.build_graph(ctx);
        // each row: n_vocab distinct values in [-10, 10), shuffled (a tie's token is each backend's choice)
        std::vector<float> values((size_t) c.n_vocab * c.n_rows);
        for (int r = 0; r < c.n_rows; r++) {
            float * row = values.data() + (size_t) r * c.n_vocab;
            for (int64_t v = 0; v < c.n_vocab; v++) {
                row[v] = -10.0f + 20.0f * (float) v / (float) c.n_vocab;
            }
            std::shuffle(row, row + c.n_vocab, rng);
        }
        size_t        next = 0;
        ggml_cgraph * gf   = compute_on_cpu(ctx, out, 0, [&](const ggml_tensor * t) {
            return strcmp(t->name, "logits") == 0 ? values[next++] : 0.0f;
        });
        // the graph's outputs: out = concat(the probability, the token's F32 cast)
        ggml_tensor * prob   = out->src[0]->src[0];
        ggml_tensor * tok    = out->src[1]->src[0]->src[0];
        ggml_tensor * logits = ggml_get_tensor(ctx, "logits");

        ggml_cuda_clover_head_match match;
        int found = find_construction(gf, ggml_cuda_match_clover_head, match);
        if (found >= 0 && (match.tok != tok || match.prob != prob || match.logits != logits || match.chunk != c.chunk)) {
            found = -1;
        }
        if (found < 0) {
            printf("%s: the matcher did not find the construction  FAIL\n", test.vars().c_str());
            failed++;
            ggml_free(ctx);
            continue;
        }
        std::vector<int32_t> got_tok(c.n_rows);
        std::vector<float>   got_prob(c.n_rows);
        clover_head_on_host((const float *) logits->data, c.n_vocab, c.n_rows, match.chunk, got_tok.data(), got_prob.data());
        const head_compare cmp = compare_head(got_tok.data(), got_prob.data(), (const int32_t *) tok->data,
                                              (const float *) prob->data, c.n_rows);
        const bool ok = cmp.tokens_differ == 0 && cmp.prob_rel < 1e-5;
        failed += !ok;
        printf("%s: the construction's %d nodes from node %d; %d of %d tokens differ, probabilities within %.2g%s\n",
               test.vars().c_str(), match.node_count, found, cmp.tokens_differ, c.n_rows, cmp.prob_rel, ok ? "" : "  FAIL");
        ggml_free(ctx);
    }
    printf("%d cases, %d failed\n", n_cases, failed);
    return failed != 0;
}
