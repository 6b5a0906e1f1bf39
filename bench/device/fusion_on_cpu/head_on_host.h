// Patch 0118's head kernels (head.inc, cut out by check.sh) launched on host threads as ggml_cuda_op_clover_head
// launches them on the GPU: the chunks' kernel, then the rows' kernel over its partials.
#pragma once

#include <cstdint>
#include <vector>

static void clover_head_on_host(const float * logits, int64_t n_vocab, int n_rows, int chunk, int32_t * tok, float * prob) {
    const int          n_chunk = (int) (n_vocab / chunk);
    const int          n       = n_chunk * n_rows;
    std::vector<float> max_c(n), sum_c(n);
    std::vector<int>   tok_c(n);
    cuda_on_host::launch({ (unsigned) n, 1, 1 }, { CLOVER_HEAD_CHUNK_THREADS, 1, 1 },
                         [&] { clover_head_chunks_f32(logits, chunk, n_chunk, max_c.data(), tok_c.data(), sum_c.data()); });
    cuda_on_host::launch({ (unsigned) ((n_rows + CLOVER_HEAD_ROW_WARPS - 1) / CLOVER_HEAD_ROW_WARPS), 1, 1 },
                         { CLOVER_HEAD_ROW_WARPS * WARP_SIZE, 1, 1 },
                         [&] { clover_head_rows_f32(max_c.data(), tok_c.data(), sum_c.data(), n_chunk, n_rows, tok, prob); });
}

// how many rows' tokens differ from the graph's, and the probabilities' largest relative error
struct head_compare {
    int    tokens_differ = 0;
    double prob_rel      = 0.0;
};

static head_compare compare_head(const int32_t * tok, const float * prob, const int32_t * want_tok, const float * want_prob,
                                 int n_rows) {
    head_compare c;
    for (int r = 0; r < n_rows; r++) {
        c.tokens_differ += tok[r] != want_tok[r];
        c.prob_rel = std::max(c.prob_rel, std::fabs((double) prob[r] - want_prob[r]) / std::fabs((double) want_prob[r]));
    }
    return c;
}
