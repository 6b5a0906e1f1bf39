// Patch 0117's coreset kernels (coreset-kernel.inc, cut out by check.sh) launched on host threads as
// ggml_cuda_op_moe_coreset launches them on the GPU: the rows' kernel, then the keep kernel over its candidates.
#pragma once

#include <cstdint>
#include <vector>

static void moe_coreset_on_host(const float * logits, int64_t s1, float * dst, int n_expert, int n_rows, int k, float top_p,
                                int size) {
    std::vector<float> cand((size_t) n_rows * n_expert);
    cuda_on_host::launch({ (unsigned) ((n_rows + MOE_CORESET_ROW_WARPS - 1) / MOE_CORESET_ROW_WARPS), 1, 1 },
                         { MOE_CORESET_ROW_WARPS * WARP_SIZE, 1, 1 },
                         [&] { moe_coreset_rows_kernel(n_expert)(logits, s1, cand.data(), n_expert, n_rows, k); });
    cuda_on_host::launch({ 1, 1, 1 }, { MOE_CORESET_KEEP_THREADS, 1, 1 },
                         [&] { moe_coreset_keep_f32(logits, s1, cand.data(), dst, n_expert, n_rows, top_p, size); });
}
