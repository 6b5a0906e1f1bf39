// Patch 0115's stream plan (ggml_cuda_clover_plan_streams, cut out of the patched ggml-cuda.cu by check.sh) on a
// real pass's graph, without a GPU: a shared library loaded into a CPU engine as llama's eval callback (check.py). The
// callback keeps every node of the pass in order; sp_check then plans the graph as the CUDA backend would and checks
// what the plan promises: every node between a fork and its join has a stream, no node reads or writes memory that a
// node of another stream of the region writes (views resolved to what they view), every tensor a region node reads or
// writes is kept allocated until the join. (That no fusion takes the join in is the evaluation's part: it hands the
// matchers the graph cut at the join.)
#include "ggml-backend-impl.h"
#include "ggml-impl.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

// what the cut code needs of ggml-cuda, with no CUDA: events are never created here
#define GGML_CUDA_MAX_STREAMS 8
#define CUDA_CHECK(x) (void) (x)
#define cudaEventDisableTiming 0
typedef void * cudaEvent_t;
static int cudaEventCreateWithFlags(cudaEvent_t * e, int) { *e = nullptr; return 0; }
static int cudaEventDestroy(cudaEvent_t) { return 0; }
#include "switches.inc"          // ggml_cuda_env_int, ggml_cuda_clover_legacy (off), cut by check.sh

#include "concurrent-event.inc"  // ggml_cuda_concurrent_event, ggml_cuda_stream_context (common.cuh)

struct ggml_backend_cuda_context {
    ggml_cuda_stream_context sc;
    ggml_cuda_stream_context & stream_context() { return sc; }
};

#include "plan.inc"  // ggml_cuda_is_view_or_noop, ggml_cuda_clover_streams, ggml_cuda_clover_plan_streams

static std::vector<ggml_tensor *> g_nodes;

extern "C" bool sp_eval(ggml_tensor * t, bool ask) {
    if (ask) {
        g_nodes.push_back(t);
    }
    return false; // no data wanted: the node list is all
}

extern "C" void sp_reset() { g_nodes.clear(); }

using deps_t = std::unordered_map<const ggml_tensor *, std::unordered_set<const ggml_tensor *>>; // until -> kept

static const ggml_tensor * base_of(const ggml_tensor * t) { return t->view_src ? t->view_src : t; }

// the failures of one region's plan, printed
static int check_region(const ggml_tensor * fork, const ggml_cuda_concurrent_event & ev, const deps_t & deps) {
    int failed = 0;
    const auto fail = [&](const std::string & what) { printf("  FAIL %s -> %s: %s\n", fork->name, ev.join_node->name, what.c_str()); failed++; };
    const auto pos = [&](const ggml_tensor * t) { return (int) (std::find(g_nodes.begin(), g_nodes.end(), t) - g_nodes.begin()); };
    const int f = pos(fork), j = pos(ev.join_node);
    if (j <= f || j >= (int) g_nodes.size()) {
        fail("the join is not after the fork");
        return failed;
    }
    if (ev.n_streams < 2) {
        fail("fewer than two streams");
    }
    // per tensor written in the region (views resolved): the streams of its writers
    std::unordered_map<const ggml_tensor *, std::unordered_set<int>> written;
    for (int i = f + 1; i < j; ++i) {
        const auto it = ev.stream_mapping.find(g_nodes[i]);
        if (it == ev.stream_mapping.end()) {
            fail(std::string("no stream for ") + g_nodes[i]->name);
        } else if (!ggml_cuda_is_view_or_noop(g_nodes[i])) {
            written[base_of(g_nodes[i])].insert(it->second);
        }
    }
    const auto kept = deps.find(ev.join_node);
    for (int i = f + 1; i < j; ++i) {
        const ggml_tensor * node = g_nodes[i];
        if (ggml_cuda_is_view_or_noop(node) || !ev.stream_mapping.count(node)) {
            continue;
        }
        const int stream = ev.stream_mapping.at(node);
        std::vector<const ggml_tensor *> touched = { base_of(node) };
        for (int s = 0; s < GGML_MAX_SRC; ++s) {
            if (node->src[s]) {
                touched.push_back(base_of(node->src[s]));
                if (kept == deps.end() || !kept->second.count(node->src[s])) {
                    fail(std::string(node->src[s]->name) + " (read by " + node->name + ") is not kept until the join");
                }
            }
        }
        if (kept == deps.end() || !kept->second.count(node)) {
            fail(std::string(node->name) + " is not kept until the join");
        }
        for (const ggml_tensor * t : touched) {
            const auto w = written.find(t);
            if (w != written.end() && (w->second.size() > 1 || !w->second.count(stream))) {
                fail(std::string(node->name) + " touches " + t->name + ", which another stream writes");
            }
        }
    }
    return failed;
}

// plans the recorded pass; prints one line per region; returns the number of regions (negative: -1 - failures)
extern "C" int sp_check() {
    ggml_cgraph graph = {};
    graph.n_nodes = (int) g_nodes.size();
    graph.nodes   = g_nodes.data();
    deps_t deps;
    ggml_backend_graph_optimize_params params = {
        /* .add_alloc_dep = */ [](void * user_data, ggml_tensor * tensor, ggml_tensor * until) {
            (*(deps_t *) user_data)[until].insert(tensor);
        },
        /* .user_data     = */ &deps,
    };
    ggml_backend_cuda_context ctx;
    ggml_cuda_clover_plan_streams(&ctx, &graph, &params);

    int failed = 0;
    std::vector<std::pair<int, const ggml_tensor *>> forks;
    for (const auto & [fork, ev] : ctx.sc.concurrent_events) {
        forks.emplace_back((int) (std::find(g_nodes.begin(), g_nodes.end(), fork) - g_nodes.begin()), fork);
    }
    std::sort(forks.begin(), forks.end());
    for (const auto & [i, fork] : forks) {
        const ggml_cuda_concurrent_event & ev = ctx.sc.concurrent_events.at(fork);
        std::unordered_map<int, int> per_stream;
        for (const auto & [node, stream] : ev.stream_mapping) {
            per_stream[stream] += ggml_cuda_is_view_or_noop(node) ? 0 : 1;
        }
        std::string counts;
        for (int s = 1; s <= ev.n_streams; ++s) {
            counts += (s > 1 ? " + " : "") + std::to_string(per_stream[s]);
        }
        printf("  %s -> %s (%s): %d streams, %s nodes\n", fork->name, ev.join_node->name, ggml_op_desc(ev.join_node),
               ev.n_streams, counts.c_str());
        if (getenv("SP_VERBOSE")) { // every node of the region with its stream
            for (const ggml_tensor * node : ev.original_order) {
                printf("    %d %s %s%s\n", ev.stream_mapping.at(node), ggml_op_desc(node), node->name,
                       ggml_cuda_is_view_or_noop(node) ? " (no-op)" : "");
            }
        }
        failed += check_region(fork, ev, deps);
    }
    return failed ? -1 - failed : (int) forks.size();
}
