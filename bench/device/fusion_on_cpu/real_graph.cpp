// Patches 0114's, 0116's, 0117's and 0118's matchers and kernels (and 0122's test of the expert matmuls' ids) on a
// real pass's graph, without a GPU: a shared library that check.sh's `real` check loads into a CPU engine
// (real_graph.py) as llama's eval callback. The callback keeps every node of the pass in order with a copy of its data
// as computed; afterwards rg_check builds the graph's node list and use counts, asks the matchers at each node as
// ggml_cuda_try_fuse does, and runs each matched construction's kernel on host threads (cuda_on_host.h) over the copies
// of its inputs, placed as the allocator placed them, against the copy of the node the construction ends in (which the
// CPU computed node by node).
#include "ggml-impl.h"

#include <cstring>
#include <unordered_map>

#include "coreset-match.inc"
#include "cuda_on_host.h"
#include "on_cpu_check.h"

#include "coreset-kernel.inc"
#include "coreset_on_host.h"
#include "preview_conv-struct.inc"
#include "preview_conv.inc"
#include "block_softmax.inc"
#include <climits>

#include "head.inc"
#include "head_on_host.h"

static std::vector<ggml_tensor *>                              g_nodes;
static std::unordered_map<const ggml_tensor *, std::vector<char>> g_data; // a node's bytes just after it was computed

// a tensor's data as the construction's first node saw it: its copy if it is a node of the pass, else (weights,
// caches) its memory
static const char * data_of(const ggml_tensor * t) {
    const auto it = g_data.find(t);
    return it != g_data.end() ? it->second.data() : (const char *) t->data;
}

// dst's memory and that of the inputs the allocator overlapped with it, in one arena laid out as the CPU's allocator
// placed them (the CUDA backend's follows the same plan), the inputs' data as the construction's first node saw it:
// a kernel that overwrites what it still reads fails here as it does on the GPU
struct placed_memory {
    const ggml_tensor * dst;
    const char *        lo;
    std::vector<char>   arena;

    placed_memory(const ggml_tensor * dst, std::initializer_list<const ggml_tensor *> inputs) :
        dst(dst), lo((const char *) dst->data) {
        const char * hi = lo + ggml_nbytes(dst);
        for (const ggml_tensor * t : inputs) {
            if (clover_fusion_overlap(t, dst)) {
                lo = std::min(lo, (const char *) t->data);
                hi = std::max(hi, (const char *) t->data + ggml_nbytes(t));
            }
        }
        arena.resize(hi - lo);
        for (const ggml_tensor * t : inputs) {
            if (clover_fusion_overlap(t, dst)) {
                memcpy(at(t), data_of(t), ggml_nbytes(t));
            }
        }
    }
    char *       at(const ggml_tensor * t) { return arena.data() + ((const char *) t->data - lo); }
    const char * input(const ggml_tensor * t) { return clover_fusion_overlap(t, dst) ? at(t) : data_of(t); }
    float *      output() { return (float *) at(dst); }
};

extern "C" void rg_reset() {
    g_nodes.clear();
    g_data.clear();
}

// llama's eval callback: every node asked for, then recorded in order with its data
extern "C" bool rg_eval(ggml_tensor * t, bool ask) {
    if (ask) {
        return true;
    }
    g_nodes.push_back(t);
    const char * p = (const char *) t->data;
    g_data[t].assign(p, p + ggml_nbytes(t));
    return true;
}

// patch 0114's conv at node i: whether its kernel's output matches the CPU's SILU
static bool check_conv(int i, const ggml_cuda_preview_conv_match & conv) {
    placed_memory      mem(conv.dst, { conv.qkv, conv.conv_state });
    preview_conv_args  a = preview_conv_make_args(conv);
    std::vector<float> staged(ggml_nelements(conv.dst));
    const bool         stage = preview_conv_staged(conv);
    a.qkv        = mem.input(conv.qkv);
    a.conv_state = mem.input(conv.conv_state);
    a.dst        = stage ? staged.data() : mem.output();
    cuda_on_host::launch({ (unsigned) ((a.channels + 255) / 256), (unsigned) a.n, 1 }, { 256, 1, 1 },
                         [&] { preview_conv_silu_f32(a); });
    const std::vector<float> out(a.dst, a.dst + staged.size());
    const double bad = mismatch(out.data(), (const float *) data_of(conv.dst), (int64_t) out.size(), 1e-5);
    printf("conv: %s, %d nodes from node %d (%d channels, %d rows%s): %.3g of the elements differ%s\n",
           conv.dst->name, conv.node_count, i, a.channels, a.n, stage ? ", output staged" : "", bad,
           bad > 0 ? "  FAIL" : "");
    return bad == 0;
}

// the coreset at node i (0114's matcher, 0117's kernels): whether its output is the CPU's, bit for bit
static bool check_coreset(int i, const ggml_cuda_moe_coreset_match & cs) {
    const int n_expert = (int) cs.logits->ne[0], n_rows = (int) cs.logits->ne[1];
    placed_memory mem(cs.dst, { cs.logits });
    float *       out = mem.output();
    moe_coreset_on_host((const float *) mem.input(cs.logits), cs.logits->nb[1] / sizeof(float), out, n_expert, n_rows, cs.k,
                        cs.top_p, cs.size);
    const double bad = mismatch(out, (const float *) data_of(cs.dst), ggml_nelements(cs.dst), 0.0);
    printf("coreset: %s, %d nodes from node %d (%d experts, %d rows, k %d, top_p %.2f, size %d%s): %.3g of the "
           "elements differ%s\n",
           cs.dst->name, cs.node_count, i, n_expert, n_rows, cs.k, cs.top_p, cs.size,
           cs.dst->data == cs.logits->data ? ", in place" : "", bad, bad > 0 ? "  FAIL" : "");
    return bad == 0;
}

// patch 0116's block softmax at node i, when its matcher finds it there: whether its kernel's output matches the CPU's
// ADD (relative to its largest magnitude; the sums run in another order)
static bool check_block_softmax(int i, const ggml_cuda_block_softmax_match & m) {
    auto base = [](const ggml_tensor * t) { return t->view_src != nullptr ? t->view_src : t; };
    placed_memory      mem(m.dst, { base(m.q), base(m.k), base(m.v), m.state });
    block_softmax_args a = block_softmax_make_args(m);
    const bool         stage = block_softmax_staged(m);
    std::vector<float> staged(ggml_nelements(m.dst));
    a.q         = mem.input(m.q);
    a.k         = mem.input(m.k);
    a.v         = mem.input(m.v);
    a.state     = mem.input(m.state);
    a.state_ids = m.state_ids != nullptr ? (const int32_t *) data_of(m.state_ids) : nullptr;
    a.dst       = stage ? staged.data() : mem.output();
    const dim3 grid = block_softmax_grid(m);
    cuda_on_host::launch({ grid.x, grid.y, 1 }, { BLOCK_SOFTMAX_WARPS * 32, 1, 1 }, [&] { block_softmax_history_f32(a); });
    const std::vector<float> out(a.dst, a.dst + staged.size());
    const double bad = mismatch(out.data(), (const float *) data_of(m.dst), (int64_t) out.size(), 1e-5);
    printf("block softmax: %s, %d nodes from node %d (d_k %d, %d rows, %d key / %d value heads, d_v %d%s%s): %.3g of the "
           "elements differ%s\n",
           m.dst->name, m.node_count, i, a.d_k, a.n, a.h_k, (int) m.dst->ne[2], a.d_v,
           m.state_ids != nullptr ? ", state gathered" : "", stage ? ", output staged" : "", bad, bad > 0 ? "  FAIL" : "");
    return bad == 0;
}

// patch 0118's head at node i: whether its kernels' tokens are the CPU's, and their probabilities within 1e-5
static bool check_head(int i, const ggml_cuda_clover_head_match & m) {
    const int            n_rows  = (int) ggml_nelements(m.prob);
    const int64_t        n_vocab = ggml_nelements(m.logits) / n_rows;
    std::vector<int32_t> tok(n_rows);
    std::vector<float>   prob(n_rows);
    clover_head_on_host((const float *) data_of(m.logits), n_vocab, n_rows, m.chunk, tok.data(), prob.data());
    const head_compare c  = compare_head(tok.data(), prob.data(), (const int32_t *) data_of(m.tok),
                                         (const float *) data_of(m.prob), n_rows);
    const bool         ok = c.tokens_differ == 0 && c.prob_rel < 1e-5;
    printf("head: %s, %d nodes from node %d (%lld tokens, %d rows, chunks of %d): %d tokens differ, probabilities within "
           "%.2g%s\n",
           m.prob->name, m.node_count, i, (long long) n_vocab, n_rows, m.chunk, c.tokens_differ, c.prob_rel, ok ? "" : "  FAIL");
    return ok;
}

// patch 0122's test of an expert matmul's ids, which picks the narrow kernel's column tile: every MUL_MAT_ID of these
// passes (a preview and a fused pass, both with the coreset) takes its ids from a coreset, and no coreset's own top-k of
// the unrestricted router probabilities (its first ARGSORT) reads as one; false when either fails or there is none
static bool check_ids_from_coreset(const ggml_cgraph * gf, const std::vector<int> & coreset_starts) {
    int n_mmid = 0, n_from = 0, n_topk = 0, n_topk_from = 0;
    for (int i = 0; i < gf->n_nodes; i++) {
        if (gf->nodes[i]->op == GGML_OP_MUL_MAT_ID) {
            n_mmid++;
            n_from += ggml_cuda_moe_ids_from_coreset(gf->nodes[i]->src[2]);
        }
    }
    for (const int i0 : coreset_starts) {
        for (int i = i0; i < gf->n_nodes; i++) {
            if (gf->nodes[i]->op == GGML_OP_ARGSORT) {
                n_topk++;
                n_topk_from += ggml_cuda_moe_ids_from_coreset(gf->nodes[i]);
                break;
            }
        }
    }
    const bool ok = n_mmid > 0 && n_from == n_mmid && n_topk == (int) coreset_starts.size() && n_topk_from == 0;
    printf("expert matmuls: %d of %d with ids from a coreset; coresets' own top-k: %d of %d read as from one%s\n", n_from,
           n_mmid, n_topk_from, n_topk, ok ? "" : "  FAIL");
    return ok;
}

// the matchers over the recorded pass as ggml_cuda_try_fuse asks them; prints each construction found and how its
// kernel's output compares. Returns the number of failures, or -1 when the matchers did not find as many constructions
// as expected (n_conv: convs and block softmaxes, one of each a GDN layer; n_coreset: coresets; n_head: heads)
extern "C" int rg_check(int n_conv, int n_coreset, int n_head) {
    const int      n      = (int) g_nodes.size();
    ggml_init_params params = { ggml_graph_overhead_custom(2 * n + 16, false), nullptr, true };
    ggml_context * ctx    = ggml_init(params);
    ggml_cgraph *  gf     = ggml_new_graph_custom(ctx, 2 * n + 16, false);
    for (ggml_tensor * t : g_nodes) {
        ggml_hash_insert(&gf->visited_hash_set, t);
        gf->nodes[gf->n_nodes++] = t;
    }
    memset(gf->use_counts, 0, gf->visited_hash_set.size * sizeof(int32_t));
    for (ggml_tensor * t : g_nodes) { // uses by nodes of the pass, as ggml counts them
        for (int s = 0; s < GGML_MAX_SRC; s++) {
            if (t->src[s] != nullptr && ggml_hash_contains(&gf->visited_hash_set, t->src[s])) {
                gf->use_counts[ggml_hash_find(&gf->visited_hash_set, t->src[s])]++;
            }
        }
    }
    // at each node the evaluation computes (it skips views) the matchers in ggml_cuda_try_fuse's order; the first
    // construction found stands for its nodes
    int failed = 0, found_conv = 0, found_coreset = 0, found_block_softmax = 0, found_head = 0;
    std::vector<int> coreset_starts;
    for (int i = 0; i < n; i++) {
        if (ggml_op_is_empty(gf->nodes[i]->op)) {
            continue;
        }
        ggml_cuda_preview_conv_match  conv;
        ggml_cuda_moe_coreset_match   cs;
        ggml_cuda_block_softmax_match bs;
        ggml_cuda_clover_head_match   hd;
        if (ggml_cuda_match_preview_conv(gf, i, conv)) {
            found_conv++;
            failed += !check_conv(i, conv);
            i += conv.node_count - 1;
        } else if (ggml_cuda_match_moe_coreset(gf, i, cs)) {
            found_coreset++;
            failed += !check_coreset(i, cs);
            coreset_starts.push_back(i);
            i += cs.node_count - 1;
        } else if (ggml_cuda_match_block_softmax(gf, i, bs)) {
            found_block_softmax++;
            failed += !check_block_softmax(i, bs);
            i += bs.node_count - 1;
        } else if (ggml_cuda_match_clover_head(gf, i, hd)) {
            found_head++;
            failed += !check_head(i, hd);
            i += hd.node_count - 1;
        }
    }
    failed += !check_ids_from_coreset(gf, coreset_starts);
    ggml_free(ctx);
    printf("%d heads (%d expected)\n", found_head, n_head);
    printf("%d nodes: %d conv constructions and %d block softmaxes (%d expected of each), %d coresets (%d expected), %d "
           "failed\n",
           n, found_conv, found_block_softmax, n_conv, found_coreset, n_coreset, failed);
    return found_conv != n_conv || found_block_softmax != n_conv || found_coreset != n_coreset || found_head != n_head
               ? -1 : failed;
}
