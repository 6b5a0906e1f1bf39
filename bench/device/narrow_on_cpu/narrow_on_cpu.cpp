// Patch 0105's narrow MMQ kernel (mmq-narrow.cu: its launch, the activations' conversion and the kernel; for MUL_MAT_ID
// mmid.cu's ids helper too; cut out of the patched tree by check.sh) on host threads (cuda_on_host.h, narrow_on_host.h),
// on MUL_MAT_SMALL and MUL_MAT_ID_SMALL graphs of test-backend-ops' cases (kernels-test-cases.patch) and on the routed
// experts' gate and up with their SwiGLU in one launch, computed by ggml's CPU backend: for each case the launch must
// take the narrow kernel (ggml_cuda_should_use_mmq_narrow, in this process's GGML_CUDA_MMQ_NARROW_* settings) and its
// output must match the CPU's within test-backend-ops' tolerance for quantized MUL_MAT (NMSE 5e-4).
#define main test_backend_ops_main
#include "test-backend-ops.cpp"
#undef main

#include "ggml-cpu.h"
#include "ggml-impl.h"
#define GGML_COMMON_DECL_CPP
#include "ggml-common.h"

#include <random>

#include "cuda_on_host.h"
#include "narrow_on_host.h"
#include "on_cpu_check.h"

#include "mmid.inc"
#include "narrow.inc"

static std::mt19937 rng(1);

// the first n_mats matrices of t quantized from normal values (the others' bytes zero: weights of 0), or t normal
static void fill(ggml_tensor * t, int64_t n_mats = 1) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    if (t->type == GGML_TYPE_F32) {
        for (int64_t i = 0; i < ggml_nelements(t); i++) {
            ((float *) t->data)[i] = normal(rng);
        }
        return;
    }
    std::vector<float> w(t->ne[0] * t->ne[1] * n_mats);
    for (float & v : w) {
        v = normal(rng);
    }
    memset(t->data, 0, ggml_nbytes(t));
    ggml_quantize_chunk(t->type, w.data(), t->data, 0, t->ne[1] * n_mats, t->ne[0], nullptr);
}

// each token's n_used experts: distinct, among the first n_active
static void fill_ids(ggml_tensor * ids, int n_used, int n_active) {
    std::vector<int32_t> active(n_active);
    for (int64_t r = 0; r < ids->ne[1]; r++) {
        for (int i = 0; i < n_active; i++) {
            active[i] = i;
        }
        std::shuffle(active.begin(), active.end(), rng);
        memcpy((char *) ids->data + r * ids->nb[1], active.data(), n_used * sizeof(int32_t));
    }
}

static int n_run = 0, failed = 0;
// NARROW_IDS_CROWDED=1: MUL_MAT_ID's ids as a block's coreset's (0122: its own tile and path)
static const bool ids_crowded = getenv("NARROW_IDS_CROWDED") != nullptr && atoi(getenv("NARROW_IDS_CROWDED")) != 0;

// the CPU's out against the narrow launch over out's memory; a case off the narrow kernel is only reported
static void check(ggml_context * ctx, ggml_tensor * out, const std::string & name, const ggml_tensor * src0, const ggml_tensor * src1,
                  const ggml_tensor * ids, const ggml_tensor * gate = nullptr) {
    if (!ggml_cuda_should_use_mmq_narrow(src0, src1, ids, 900)) {
        printf("%s: not on the narrow kernel in these settings\n", name.c_str());
        return;
    }
    n_run++;
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    ggml_graph_compute_with_ctx(ctx, gf, 2);
    ggml_backend_cuda_context cuda;
    const double              nmse = kernel_nmse(out, [&] {
        ggml_cuda_mul_mat_q_narrow(cuda, src0, src1, ids, out, gate, GGML_GLU_OP_SWIGLU, ids_crowded);
    });
    const bool ok = nmse < 5e-4;
    failed += !ok;
    printf("%s: NMSE against the CPU %.2g%s\n", name.c_str(), nmse, ok ? "" : "  FAIL");
}

int main() {
    // rows x columns x K: by default halves at 9-32 columns (int8 at 17-32 only from 65536 rows, more than any case here:
    // check.sh's int8 settings put these cases there), the ranges' edges, a short K, every type; a few hundred CTAs at
    // most (each CUDA thread is a host thread)
    struct dense_case {
        ggml_type type;
        int64_t   m, n, k;
    };
    for (const dense_case & c : std::vector<dense_case>{
             { GGML_TYPE_Q6_K, 1024, 16, 2048 }, { GGML_TYPE_Q4_K, 1024, 9, 2048 }, { GGML_TYPE_Q5_K, 1024, 12, 1024 },
             { GGML_TYPE_Q8_0, 1024, 16, 1024 }, { GGML_TYPE_Q6_K, 4096, 32, 2048 }, { GGML_TYPE_Q4_K, 4096, 17, 2048 },
             { GGML_TYPE_Q6_K, 2048, 32, 4096 }, { GGML_TYPE_Q4_K, 256, 64, 512 },   { GGML_TYPE_Q8_0, 512, 24, 512 } }) {
        ggml_init_params   params = { 512ull * 1024 * 1024, nullptr, false };
        ggml_context *     ctx    = ggml_init(params);
        test_mul_mat_small test(c.type, c.m, c.n, c.k);
        ggml_tensor *      out = test.build_graph(ctx);
        fill(out->src[0]);
        fill(out->src[1]);
        check(ctx, out, test.vars(), out->src[0], out->src[1], nullptr);
        ggml_free(ctx);
    }

    // the experts: n_used of n_mats a token, among n_active of them (a coreset: few), the activations one row a token (b:
    // the gate and up) or one a token and slot (the down projection); 9-64 tokens
    struct id_case {
        ggml_type type;
        int       n_mats, n_used, n_active;
        bool      b;
        int64_t   m, n, k;
    };
    // (the 35B-A3B's shapes on a coreset of 8 of 256 experts, smaller ones over many experts)
    for (const id_case & c : std::vector<id_case>{ { GGML_TYPE_Q4_K, 256, 8, 8, true, 512, 32, 2048 },
                                                   { GGML_TYPE_Q6_K, 256, 8, 8, false, 2048, 32, 512 },
                                                   { GGML_TYPE_Q4_K, 32, 8, 32, true, 256, 32, 1024 },
                                                   { GGML_TYPE_Q6_K, 32, 8, 32, false, 512, 32, 512 },
                                                   { GGML_TYPE_Q4_K, 64, 8, 64, true, 256, 64, 512 },
                                                   { GGML_TYPE_Q5_K, 64, 8, 64, true, 256, 12, 1024 },
                                                   { GGML_TYPE_Q8_0, 64, 4, 16, true, 256, 16, 512 } }) {
        ggml_init_params      params = { 512ull * 1024 * 1024, nullptr, false };
        ggml_context *        ctx    = ggml_init(params);
        test_mul_mat_id_small test(c.type, c.n_mats, c.n_used, c.n_active, c.b, c.m, c.n, c.k);
        ggml_tensor *         out = test.build_graph(ctx);
        ggml_tensor *         ids = out->src[2];
        fill(out->src[0], c.n_active);
        fill(out->src[1]);
        fill_ids(ids->view_src ? ids->view_src : ids, c.n_used, c.n_active);
        check(ctx, out, test.vars(), out->src[0], out->src[1], ids);
        ggml_free(ctx);
    }

    // the gate, up and SwiGLU in one launch (ggml-cuda fuses the GLU after two MUL_MAT_IDs so): Q4_K, 32 tokens over a
    // coreset of 8 experts at the 35B-A3B's shape, over 32 experts at a smaller one
    for (const int n_active : { 8, 32 }) {
        ggml_init_params params = { 512ull * 1024 * 1024, nullptr, false };
        ggml_context *   ctx    = ggml_init(params);
        const int        n_mats = 64, n_used = 8;
        const int64_t    m = n_active == 8 ? 512 : 256, n = 32, k = n_active == 8 ? 2048 : 1024;
        ggml_tensor *    gate = ggml_new_tensor_3d(ctx, GGML_TYPE_Q4_K, k, m, n_mats);
        ggml_tensor *    up   = ggml_new_tensor_3d(ctx, GGML_TYPE_Q4_K, k, m, n_mats);
        ggml_tensor *    b    = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, k, 1, n);
        ggml_tensor *    ids  = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, n_used, n);
        fill(gate, n_active);
        fill(up, n_active);
        fill(b);
        fill_ids(ids, n_used, n_active);
        ggml_tensor * out = ggml_swiglu_split(ctx, ggml_mul_mat_id(ctx, gate, b, ids), ggml_mul_mat_id(ctx, up, b, ids));
        check(ctx, out,
              "gate, up and SwiGLU, Q4_K " + std::to_string(m) + " x " + std::to_string(k) + ", 32 tokens over " +
                  std::to_string(n_active) + " experts",
              up, b, ids, gate);
        ggml_free(ctx);
    }
    printf("%d cases, %d failed\n", n_run, failed);
    return failed != 0 || n_run == 0;
}
