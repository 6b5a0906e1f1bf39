// Experiment 0117 (a block's expert coreset as one CUDA kernel) checked without a GPU. The kernel's source, cut out
// of the patched topk-moe.cu by coreset_on_cpu.sh, runs with one host thread per CUDA thread (barriers for
// __syncthreads and __syncwarp, a per-warp exchange buffer for the shuffles), on the graph of test-backend-ops'
// MOE_CORESET case (kernels-test-cases.patch: the construction as clover-moe builds it), computed by ggml's CPU
// backend; the matcher, cut out the same way, must find the construction in that graph. Every element of the
// kernel's output must equal the graph's logits + log(keep).
#define main test_backend_ops_main
#include "test-backend-ops.cpp"
#undef main

#include "ggml-cpu.h"
#include "ggml-impl.h"

#include <barrier>
#include <memory>
#include <random>
#include <thread>

#include "coreset-match.inc"

// ---- the CUDA names the kernel uses, on host threads --------------------------------------------------------------
static thread_local int                            tl_thread;
static int                                         g_threads;
static std::unique_ptr<std::barrier<>>             g_block_barrier;
static std::vector<std::unique_ptr<std::barrier<>>> g_warp_barriers;
static std::vector<float>                          g_exchange_f;
static std::vector<int>                            g_exchange_i;
static std::vector<float>                          g_smem;

struct thread_dim {
    int x;
};
#define threadIdx (thread_dim{ tl_thread })
#define blockDim  (thread_dim{ g_threads })
#define __syncthreads() g_block_barrier->arrive_and_wait()
#define __syncwarp()    g_warp_barriers[tl_thread / 32]->arrive_and_wait()
#define ggml_cuda_pdl_sync()
static int min(int a, int b) { return a < b ? a : b; }

template <typename T> static T exchange(std::vector<T> & buf, T v, int src_lane) {
    const int warp = tl_thread / 32;
    buf[tl_thread] = v;
    g_warp_barriers[warp]->arrive_and_wait();
    const T r = buf[warp * 32 + src_lane];
    g_warp_barriers[warp]->arrive_and_wait();
    return r;
}
static float __shfl_xor_sync(unsigned, float v, int offset) { return exchange(g_exchange_f, v, (tl_thread % 32) ^ offset); }
static int   __shfl_xor_sync(unsigned, int v, int offset) { return exchange(g_exchange_i, v, (tl_thread % 32) ^ offset); }
static float __shfl_sync(unsigned, float v, int src_lane) { return exchange(g_exchange_f, v, src_lane); }
static float __shfl_up_sync(unsigned, float v, int offset) {
    const int lane = tl_thread % 32;
    return exchange(g_exchange_f, v, lane >= offset ? lane - offset : lane);
}
static float warp_reduce_max(float x) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, offset));
    }
    return x;
}
static float warp_reduce_sum(float x) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        x += __shfl_xor_sync(0xffffffff, x, offset);
    }
    return x;
}

#include "coreset-kernel.inc"

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
                                                             { 512, 32, 10, 0.9f, 0 }, { 200, 16, 4, 0.7f, 0 } }) {
        for (int rep = 0; rep < 3; rep++, n++) {
            ggml_init_params params = { 256 * 1024 * 1024, nullptr, false };
            ggml_context *   ctx    = ggml_init(params);
            test_moe_coreset test(c.n_expert, c.n_rows, c.k, c.top_p, c.size);
            ggml_tensor *    out    = test.build_graph(ctx);
            ggml_tensor *    logits = ggml_get_tensor(ctx, "logits");
            ggml_tensor *    add    = out->src[0]; // logits + log(keep), before the routing's softmax
            std::uniform_real_distribution<float> uniform(-4.0f, 4.0f);
            for (int64_t i = 0; i < ggml_nelements(logits); i++) {
                ((float *) logits->data)[i] = uniform(rng);
            }
            ggml_cgraph * gf = ggml_new_graph(ctx);
            ggml_build_forward_expand(gf, out);
            ggml_graph_compute_with_ctx(ctx, gf, 2);

            ggml_cuda_moe_coreset_match match;
            int                         found = -1;
            for (int i = 0; i < ggml_graph_n_nodes(gf) && found < 0; i++) {
                if (ggml_cuda_match_moe_coreset(gf, i, match)) {
                    found = i;
                }
            }
            if (found < 0 || match.dst != add || match.logits != logits || match.k != c.k ||
                (c.size > 0 ? match.size != c.size : match.top_p != c.top_p)) {
                printf("%s: the matcher did not find the construction\n", test.vars().c_str());
                failed++;
                ggml_free(ctx);
                continue;
            }

            g_threads = MOE_CORESET_WARPS * 32;
            g_smem.assign(moe_coreset_smem((int) c.n_expert, (int) c.n_rows, match.k) / sizeof(float) + 1, 0.0f);
            g_block_barrier = std::make_unique<std::barrier<>>(g_threads);
            g_warp_barriers.clear();
            for (int w = 0; w < MOE_CORESET_WARPS; w++) {
                g_warp_barriers.push_back(std::make_unique<std::barrier<>>(32));
            }
            g_exchange_f.assign(g_threads, 0.0f);
            g_exchange_i.assign(g_threads, 0);
            std::vector<float>       dst(ggml_nelements(add));
            std::vector<std::thread> threads;
            for (int t = 0; t < g_threads; t++) {
                threads.emplace_back([&, t] {
                    tl_thread = t;
                    moe_coreset_f32((const float *) logits->data, logits->nb[1] / sizeof(float), dst.data(),
                                    (int) c.n_expert, (int) c.n_rows, match.k, match.top_p, match.size,
                                    moe_coreset_pow2((int) c.n_expert));
                });
            }
            for (std::thread & t : threads) {
                t.join();
            }
            int differ = 0, kept = 0;
            for (size_t i = 0; i < dst.size(); i++) {
                const float want = ((const float *) add->data)[i];
                differ += !(want == dst[i] || (std::isinf(want) && std::isinf(dst[i]) && want < 0 && dst[i] < 0));
                kept += i < (size_t) c.n_expert && !std::isinf(dst[i]);
            }
            failed += differ != 0;
            printf("%s: %d experts kept, %d of %zu elements differ\n", test.vars().c_str(), kept, differ, dst.size());
            ggml_free(ctx);
        }
    }
    printf("%d cases, %d failed\n", n, failed);
    return failed != 0;
}
