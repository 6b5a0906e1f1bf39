// ggml-cpu's extra buffer types (AMX, CPU_REPACK) against plain CPU buffers, one matmul at a time.
//
// For each extra buffer type of the CPU device, weight type and shape: the weight W [K, N] in that
// buffer type (set_tensor repacks it) and in a plain CPU buffer, X [K, M] random, Y = mul_mat(W, X)
// computed on the CPU backend from output memory pre-filled with a non-zero pattern (a graph
// allocator hands ops reused memory). Prints one line per case and exits 1 when any supported case
// differs from the plain buffer beyond float rounding. Built by extra_bufts_check.sh.

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float frand(unsigned * s) {
    *s = *s * 1664525u + 1013904223u;
    return (float) ((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

// Y = W x X with W in `buft`; returns 0 and fills `y` [N*M], or -1 when the CPU device does not
// support the op with W in that buffer type
static int run(ggml_backend_t cpu, ggml_backend_dev_t dev, ggml_backend_buffer_type_t buft, enum ggml_type type,
               int K, int N, int M, const void * wq, const float * x, float * y) {
    struct ggml_init_params ip = { 4 * ggml_tensor_overhead() + ggml_graph_overhead(), NULL, true };
    struct ggml_context * cw = ggml_init(ip);
    struct ggml_context * cx = ggml_init(ip);
    struct ggml_tensor * w = ggml_new_tensor_2d(cw, type, K, N);
    struct ggml_tensor * xt = ggml_new_tensor_2d(cx, GGML_TYPE_F32, K, M);
    struct ggml_tensor * yt = ggml_mul_mat(cx, w, xt);
    // as llama.cpp places a weight: ask with W in an empty buffer of the type first
    ggml_backend_buffer_t probe = ggml_backend_buft_alloc_buffer(buft, 0);
    w->buffer = probe;
    const bool supported = ggml_backend_dev_supports_op(dev, yt);
    w->buffer = NULL;
    ggml_backend_buffer_free(probe);
    int rc = -1;
    ggml_backend_buffer_t bw = NULL;
    if (supported) {
        bw = ggml_backend_alloc_ctx_tensors_from_buft(cw, buft);
        ggml_backend_buffer_set_usage(bw, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
        ggml_backend_tensor_set(w, wq, 0, ggml_nbytes(w));
        ggml_backend_buffer_t bx = ggml_backend_alloc_ctx_tensors(cx, cpu);
        ggml_backend_tensor_set(xt, x, 0, ggml_nbytes(xt));
        float * stale = malloc(ggml_nbytes(yt));
        for (int i = 0; i < N * M; i++) {
            stale[i] = 100.0f + (float) (i % 7);
        }
        ggml_backend_tensor_set(yt, stale, 0, ggml_nbytes(yt));
        free(stale);
        struct ggml_cgraph * g = ggml_new_graph(cx);
        ggml_build_forward_expand(g, yt);
        if (ggml_backend_graph_compute(cpu, g) == GGML_STATUS_SUCCESS) {
            ggml_backend_tensor_get(yt, y, 0, ggml_nbytes(yt));
            rc = 0;
        }
        ggml_backend_buffer_free(bx);
        ggml_backend_buffer_free(bw);
    }
    ggml_free(cw);
    ggml_free(cx);
    return rc;
}

int main(int argc, char ** argv) {
    const int n_threads = argc > 1 ? atoi(argv[1]) : 4;
    ggml_backend_reg_t reg = ggml_backend_cpu_reg();
    ggml_backend_dev_t dev = ggml_backend_reg_dev_get(reg, 0);
    ggml_backend_t cpu = ggml_backend_dev_init(dev, NULL);
    ggml_backend_cpu_set_n_threads(cpu, n_threads);
    ggml_backend_dev_get_extra_bufts_t get_extra =
        (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    ggml_backend_buffer_type_t * extra = get_extra ? get_extra(dev) : NULL;

    const enum ggml_type types[] = { GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K };
    const int Ks[] = { 32, 64, 256, 512 };
    const int Ms[] = { 1, 2, 16, 31, 32, 33, 48, 64, 96 };
    const int N = 64;
    int bad = 0, checked = 0;
    printf("buffer type  weight  K    N    M   max|diff|/max|y|  verdict\n");
    for (int e = 0; extra && extra[e]; e++) {
        for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
            for (size_t k = 0; k < sizeof(Ks) / sizeof(Ks[0]); k++) {
                const int K = Ks[k];
                if (K % ggml_blck_size(types[t])) {
                    continue;
                }
                unsigned seed = 1234u + (unsigned) (K * 31 + t);
                float * wf = malloc(sizeof(float) * K * N);
                for (int i = 0; i < K * N; i++) {
                    wf[i] = frand(&seed);
                }
                void * wq = malloc(ggml_row_size(types[t], K) * N);
                ggml_quantize_chunk(types[t], wf, wq, 0, N, K, NULL);
                for (size_t m = 0; m < sizeof(Ms) / sizeof(Ms[0]); m++) {
                    const int M = Ms[m];
                    float * x = malloc(sizeof(float) * K * M);
                    for (int i = 0; i < K * M; i++) {
                        x[i] = frand(&seed);
                    }
                    float * y_ref = malloc(sizeof(float) * N * M);
                    float * y = malloc(sizeof(float) * N * M);
                    int rc_ref = run(cpu, dev, ggml_backend_cpu_buffer_type(), types[t], K, N, M, wq, x, y_ref);
                    int rc = run(cpu, dev, extra[e], types[t], K, N, M, wq, x, y);
                    const char * verdict = "unsupported";
                    float worst = 0.0f, scale = 1e-30f;
                    if (rc == 0 && rc_ref == 0) {
                        for (int i = 0; i < N * M; i++) {
                            worst = fmaxf(worst, fabsf(y[i] - y_ref[i]));
                            scale = fmaxf(scale, fabsf(y_ref[i]));
                        }
                        const int ok = worst <= 1e-3f * scale;
                        verdict = ok ? "ok" : "WRONG";
                        bad += !ok;
                        checked++;
                    }
                    printf("%-11s  %-6s %4d %4d %4d   %-16.3g  %s\n", ggml_backend_buft_name(extra[e]),
                           ggml_type_name(types[t]), K, N, M, (double) (worst / scale), verdict);
                    free(x);
                    free(y_ref);
                    free(y);
                }
                free(wf);
                free(wq);
            }
        }
    }
    printf("extra buffer types: %s; %d cases checked, %d wrong\n", extra && extra[0] ? "yes" : "none", checked, bad);
    ggml_backend_free(cpu);
    return bad ? 1 : 0;
}
