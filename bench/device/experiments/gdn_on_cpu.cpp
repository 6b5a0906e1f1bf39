// Experiment 0115 (gated delta net of several tokens, each chunk of tokens staged in shared memory) checked without a
// GPU. The patched gated_delta_net.cu's two kernels, token by token and staged, cut out by on_cpu.sh, run on host
// threads (cuda_on_host.h) on the same inputs: their outputs (the attention, then the final state or the rollback
// snapshots) must be equal bit for bit, and close to ggml's CPU gated delta net.
#include "ggml-cpu.h"
#include "ggml.h"

#include "cuda_on_host.h"

#include <cstdio>
#include <cstring>
#include <random>

#include "gdn-kernels.inc"

struct gdn_case {
    int64_t h_k, v_repeat, s_v, n_tokens, n_seqs;
    int     K; // snapshot slots (1: the final state only)
};

struct gdn_inputs {
    std::vector<float> q, k, v, g, beta, state;
};

// the launchers' arguments for contiguous inputs, and the kernel of either kind on a grid like theirs
template <int S_v>
static std::vector<float> run(const gdn_case & c, const gdn_inputs & in, bool staged) {
    const int64_t H = c.h_k * c.v_repeat, T = c.n_tokens, N = c.n_seqs;
    const int64_t attn = S_v * H * T * N, slot = S_v * S_v * H * N;
    std::vector<float> dst(attn + slot * c.K, 0.0f);
    const uint3 neqk1 = init_fastdiv_values(c.h_k), rq3 = init_fastdiv_values(1);
    const float scale = 1.0f / sqrtf((float) S_v);
    const unsigned lanes = S_v < 32 ? S_v : 32;
    auto args = [&](auto kernel) {
        kernel(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), in.state.data(), dst.data(),
               dst.data() + attn, H, T, N, S_v, S_v * c.h_k, S_v * c.h_k * T, S_v, S_v * H, S_v * H * T, 1, H, H * T,
               neqk1, rq3, scale, slot, c.K);
    };
    if (staged) {
        cuda_on_host::launch({ (unsigned) H, (unsigned) N, S_v / GDN_STAGE_COLS }, { lanes, GDN_STAGE_COLS, 1 }, [&] {
            c.K > 1 ? args(gated_delta_net_staged_cuda<S_v, true>) : args(gated_delta_net_staged_cuda<S_v, false>);
        });
    } else {
        cuda_on_host::launch({ (unsigned) H, (unsigned) N, (S_v + 3) / 4 }, { lanes, 4, 1 }, [&] {
            c.K > 1 ? args(gated_delta_net_cuda<S_v, false, true>) : args(gated_delta_net_cuda<S_v, false, false>);
        });
    }
    return dst;
}

static std::vector<float> run_any(const gdn_case & c, const gdn_inputs & in, bool staged) {
    switch (c.s_v) {
        case 16: return run<16>(c, in, staged);
        case 32: return run<32>(c, in, staged);
        case 64: return run<64>(c, in, staged);
        default: return run<128>(c, in, staged);
    }
}

static std::vector<float> run_cpu(const gdn_case & c, const gdn_inputs & in) {
    const int64_t H = c.h_k * c.v_repeat;
    ggml_init_params params = { 512 * 1024 * 1024, nullptr, false };
    ggml_context *   ctx    = ggml_init(params);
    auto tensor = [&](const std::vector<float> & data, int64_t a, int64_t b, int64_t d, int64_t e) {
        ggml_tensor * t = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, a, b, d, e);
        memcpy(t->data, data.data(), data.size() * sizeof(float));
        return t;
    };
    ggml_tensor * out = ggml_gated_delta_net(ctx, tensor(in.q, c.s_v, c.h_k, c.n_tokens, c.n_seqs),
                                             tensor(in.k, c.s_v, c.h_k, c.n_tokens, c.n_seqs),
                                             tensor(in.v, c.s_v, H, c.n_tokens, c.n_seqs),
                                             tensor(in.g, 1, H, c.n_tokens, c.n_seqs),
                                             tensor(in.beta, 1, H, c.n_tokens, c.n_seqs),
                                             tensor(in.state, c.s_v, c.s_v, H, c.n_seqs), c.K);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    ggml_graph_compute_with_ctx(ctx, gf, 2);
    std::vector<float> r((const float *) out->data, (const float *) out->data + ggml_nelements(out));
    ggml_free(ctx);
    return r;
}

int main() {
    std::mt19937 rng(1);
    int          failed = 0, n = 0;
    for (const gdn_case & c : std::vector<gdn_case>{ { 2, 2, 32, 40, 1, 1 }, { 2, 2, 64, 33, 1, 1 }, { 1, 2, 128, 33, 1, 1 },
                                                      { 2, 2, 32, 40, 1, 32 }, { 2, 2, 32, 8, 1, 8 }, { 2, 1, 32, 35, 2, 1 },
                                                      { 2, 2, 16, 35, 1, 1 }, { 2, 2, 32, 2, 1, 1 } }) {
        const int64_t H = c.h_k * c.v_repeat;
        gdn_inputs    in;
        std::normal_distribution<float>       normal(0.0f, 1.0f);
        std::uniform_real_distribution<float> unit(0.0f, 1.0f);
        auto unit_rows = [&](int64_t rows) { // q and k are L2-normalized where the models call the op
            std::vector<float> x(rows * c.s_v);
            for (int64_t r = 0; r < rows; r++) {
                float ss = 0.0f;
                for (int64_t i = 0; i < c.s_v; i++) {
                    x[r * c.s_v + i] = normal(rng);
                    ss += x[r * c.s_v + i] * x[r * c.s_v + i];
                }
                for (int64_t i = 0; i < c.s_v; i++) {
                    x[r * c.s_v + i] /= sqrtf(ss);
                }
            }
            return x;
        };
        in.q = unit_rows(c.h_k * c.n_tokens * c.n_seqs);
        in.k = unit_rows(c.h_k * c.n_tokens * c.n_seqs);
        for (int64_t i = 0; i < c.s_v * H * c.n_tokens * c.n_seqs; i++) in.v.push_back(normal(rng));
        for (int64_t i = 0; i < H * c.n_tokens * c.n_seqs; i++) in.g.push_back(-2.0f * unit(rng));
        for (int64_t i = 0; i < H * c.n_tokens * c.n_seqs; i++) in.beta.push_back(unit(rng));
        for (int64_t i = 0; i < c.s_v * c.s_v * H * c.n_seqs; i++) in.state.push_back(0.1f * normal(rng));

        const std::vector<float> old_k = run_any(c, in, false), new_k = run_any(c, in, true), cpu = run_cpu(c, in);
        size_t differ = 0;
        double err = 0.0, norm = 0.0;
        for (size_t i = 0; i < old_k.size(); i++) {
            differ += old_k[i] != new_k[i];
            err += (new_k[i] - cpu[i]) * (double) (new_k[i] - cpu[i]);
            norm += cpu[i] * (double) cpu[i];
        }
        const double nmse = err / norm;
        const bool   ok   = differ == 0 && cpu.size() == new_k.size() && nmse < 1e-10;
        failed += !ok;
        n++;
        printf("h_k=%lld v_repeat=%lld S_v=%lld tokens=%lld seqs=%lld K=%d: %zu of %zu differ from the token-by-token "
               "kernel, NMSE against the CPU %.2g%s\n",
               (long long) c.h_k, (long long) c.v_repeat, (long long) c.s_v, (long long) c.n_tokens,
               (long long) c.n_seqs, c.K, differ, new_k.size(), nmse, ok ? "" : "  FAIL");
    }
    printf("%d cases, %d failed\n", n, failed);
    return failed != 0;
}
