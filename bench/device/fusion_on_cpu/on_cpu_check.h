// What the check.sh checks of a CUDA fusion share: the test case's graph computed by ggml's CPU backend with its inputs
// filled, the first node where the fusion's matcher finds its construction, and the error of the kernel's output (run
// on host threads, cuda_on_host.h) against the graph's.
#pragma once

#include "ggml-cpu.h"
#include "ggml-impl.h"
#include "ggml.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <vector>

// fills every input of ctx (I32 tensors with `row`, the others element by element with value(t)), computes out
static ggml_cgraph * compute_on_cpu(ggml_context * ctx, ggml_tensor * out, int32_t row,
                                    const std::function<float(const ggml_tensor *)> & value) {
    for (ggml_tensor * t = ggml_get_first_tensor(ctx); t != nullptr; t = ggml_get_next_tensor(ctx, t)) {
        if (t->op != GGML_OP_NONE || t->data == nullptr) {
            continue;
        }
        for (int64_t i = 0; i < ggml_nelements(t); i++) {
            if (t->type == GGML_TYPE_I32) {
                ((int32_t *) t->data)[i] = row;
            } else {
                ((float *) t->data)[i] = value(t);
            }
        }
    }
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    ggml_graph_compute_with_ctx(ctx, gf, 2);
    return gf;
}

// the first node where matcher(gf, i, match) finds the construction, or -1; asked, as ggml-cuda's evaluation asks,
// only at nodes that compute (views are skipped)
template <typename Match>
static int find_construction(ggml_cgraph * gf, bool (*matcher)(const ggml_cgraph *, int, Match &), Match & match) {
    for (int i = 0; i < ggml_graph_n_nodes(gf); i++) {
        if (!ggml_op_is_empty(ggml_graph_node(gf, i)->op) && matcher(gf, i, match)) {
            return i;
        }
    }
    return -1;
}

// kernel() run over out's memory (zeroed first); its NMSE against the values the graph computed there
static double kernel_nmse(ggml_tensor * out, const std::function<void()> & kernel) {
    float *                  data = (float *) out->data;
    const std::vector<float> want(data, data + ggml_nelements(out));
    std::fill(data, data + ggml_nelements(out), 0.0f);
    kernel();
    double err = 0.0, norm = 0.0;
    for (size_t i = 0; i < want.size(); i++) {
        err += ((double) data[i] - want[i]) * ((double) data[i] - want[i]);
        norm += (double) want[i] * want[i];
    }
    return err / norm;
}

// one case's line; returns whether it passed
static bool report(const std::string & vars, int found, int node_count, double nmse, double limit) {
    if (found < 0) {
        printf("%s: the matcher did not find the construction\n", vars.c_str());
        return false;
    }
    const bool ok = nmse < limit;
    printf("%s: the construction's %d nodes from node %d, NMSE against the CPU graph %.2g%s\n", vars.c_str(), node_count,
           found, nmse, ok ? "" : "  FAIL");
    return ok;
}

// the fraction of elements of got that differ from want beyond tol (relative to want's largest finite magnitude;
// -inf must meet -inf)
static double mismatch(const float * got, const float * want, int64_t n, double tol) {
    double scale = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (std::isfinite(want[i])) {
            scale = std::max(scale, (double) std::fabs(want[i]));
        }
    }
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        const bool both_neg_inf = std::isinf(want[i]) && std::isinf(got[i]) && want[i] < 0 && got[i] < 0;
        bad += !both_neg_inf && !(std::fabs((double) got[i] - want[i]) <= tol * std::max(scale, 1e-30));
    }
    return (double) bad / (double) n;
}
