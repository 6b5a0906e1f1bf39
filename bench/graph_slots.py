"""What patch 0401's graph slots change in the real loops: the labelled simulations on engines that
differ only in `LLAMA_GRAPH_CACHE`, interleaved in one process, with the time of each pass shape.

    python bench/graph_slots.py MODEL.gguf [--gpu-layers -1] [--settings "one-graph:0 slots:4 ..."]
                                [--reps 3] [--tokens 256] [--out graph_slots.json]

One speculative engine per setting (`LLAMA_GRAPH_CACHE` and `LLAMA_GRAPH_CACHE_TOKENS` are read when
a context is created; the default compares no slots, the ratios' base, with 4 slots and with one slot
for one-row steps only), loaded side by side; each repetition runs every simulation (block diffusion
at k tokens per pass, speculative at a accepted) and the `ar` loop on every engine in turn, so a
drift of the machine hits all settings alike. Prints the median tok/s per setting and the ratio to
the first; for the speculative runs also the backend calls grouped by pass shape (causal rows +
preview rows): calls, milliseconds, and llama.cpp's graph reuses. Run it once more with
GGML_CUDA_DISABLE_GRAPHS=1 (read once per process) to see the CUDA graphs' part.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import llama_cpp as ll  # noqa: E402

from clover_local import loops, simulation  # noqa: E402
from clover_local.llama.engine import LlamaEngine  # noqa: E402
from clover_local.llama.placement import devices  # noqa: E402
from clover_local.policy import DecodingSettings  # noqa: E402

KS = (2, 4, 8)
ACCEPTS = (0, 1, 2, 4, 8)


class ShapeTimer:
    """The engine with each pass timed and grouped by (causal rows, preview rows)."""

    def __init__(self, eng: LlamaEngine):
        self.eng, self.ms = eng, defaultdict(list)
        self.vocab_size, self.capabilities = eng.vocab_size, eng.capabilities
        self.default_routing = eng.default_routing

    def _timed(self, shape: tuple[int, int], f, *a, **kw):
        t = time.perf_counter()
        out = f(*a, **kw)
        self.ms[shape].append(1e3 * (time.perf_counter() - t))
        return out

    def prefill(self, tokens, adj, draw=None):
        return self.eng.prefill(tokens, adj, draw)

    def commit(self, tokens, adj, draw=None):
        return self._timed((len(tokens), 0), self.eng.commit, tokens, adj, draw)

    def preview(self, block, adj, routing=None, draw=None):
        return self._timed((0, len(block)), self.eng.preview, block, adj, routing, draw)

    def commit_and_preview(self, tokens, adj, block, routing=None, draw=None):
        return self._timed(
            (len(tokens), len(block)), self.eng.commit_and_preview, tokens, adj, block, routing, draw
        )

    def verify_and_draft(self, tokens, adjs, preview, *a, **kw):
        return self._timed(
            (len(tokens), len(preview)), self.eng.verify_and_draft, tokens, adjs, preview, *a, **kw
        )

    def rollback(self, n_keep):
        return self._timed(("rollback", 0), self.eng.rollback, n_keep)


def gpu_free() -> int:
    """Free bytes on the offload devices, as ggml reports them."""
    return sum(d.free or 0 for d in devices() if d.offload)


def simulation_settings(eng: LlamaEngine, tokens: int) -> DecodingSettings:
    """The labelled simulations' settings: `tokens` new tokens, the coreset off, a 4096-token context."""
    return DecodingSettings(
        mask_token_id=eng.mask_token_id,
        max_new_tokens=tokens,
        context_limit=4096,
        coreset_enabled=False,
        coreset_top_p=eng.default_routing.top_p,
    )


def reused(eng: LlamaEngine) -> int:
    return int(ll.llama_perf_context(eng.ctx).n_reused)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--gpu-layers", type=int, default=-1)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument(
        "--settings",
        default="one-graph:0 slots:4 steps:LLAMA_GRAPH_CACHE=1,LLAMA_GRAPH_CACHE_TOKENS=1",
        help="tag:N (LLAMA_GRAPH_CACHE) or tag:VAR=V,VAR=V per engine, space-separated",
    )
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--prefix", type=int, default=512)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    settings = dict(s.split(":", 1) for s in args.settings.split())
    engines: dict[str, LlamaEngine] = {}
    for tag, value in settings.items():
        for var in ("LLAMA_GRAPH_CACHE", "LLAMA_GRAPH_CACHE_TOKENS", "LLAMA_GRAPH_CACHE_MIB"):
            os.environ.pop(var, None)
        pairs = (
            [kv.split("=", 1) for kv in value.split(",")] if "=" in value else [["LLAMA_GRAPH_CACHE", value]]
        )
        os.environ.update(dict(pairs))
        engines[tag] = LlamaEngine(
            args.model,
            n_ctx=4096,
            n_gpu_layers=args.gpu_layers,
            n_threads=args.threads,
            speculative=True,
            log=True,
        )
    taken = dict.fromkeys(engines, 0)  # GPU bytes each engine's runs took (its slots grow as it runs)
    first = next(iter(engines.values()))
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(0, min(first.vocab_size, 248000), size=args.prefix)]
    s = simulation_settings(first, args.tokens)
    runs = {
        **{f"k={k}": (lambda b, k=k: simulation.diffusion(b, prompt, s, k)) for k in KS},
        **{f"a={a}": (lambda b, a=a: simulation.self_speculative(b, prompt, s, a)) for a in ACCEPTS},
        "ar loop": lambda b: loops.last_result(loops.ar_loop(b, prompt, s)),
    }
    tok_s: dict[str, dict[str, list[float]]] = {tag: defaultdict(list) for tag in engines}
    shapes: dict[str, dict[str, dict]] = {tag: {} for tag in engines}
    for rep in range(args.reps + 1):  # repetition 0 warms up (graphs, lazy kernel loading) and is dropped
        for name, run in runs.items():
            for tag, eng in engines.items():
                timer = ShapeTimer(eng)
                n0, free0 = reused(eng), gpu_free()
                out = run(timer)
                taken[tag] += free0 - gpu_free()
                if rep == 0:
                    continue
                if isinstance(out, dict):
                    tok_s[tag][name].append(out["tokens_per_s"])
                else:
                    tok_s[tag][name].append(out.tokens_per_second)
                if name.startswith("a=") and rep == args.reps:
                    shapes[tag][name] = {
                        "reused": reused(eng) - n0,
                        "calls": sum(len(v) for v in timer.ms.values()),
                        "by_shape": {
                            f"{c}+{p}": {"calls": len(v), "ms": sum(v), "median_ms": statistics.median(v)}
                            for (c, p), v in sorted(timer.ms.items(), key=lambda kv: -sum(kv[1]))
                        },
                    }
    base = next(iter(engines))
    med = {tag: {name: statistics.median(v) for name, v in d.items()} for tag, d in tok_s.items()}
    print(f"{Path(args.model).name}: median tok/s over {args.reps} interleaved repetitions")
    others = [t for t in engines if t != base]
    print(
        "run".ljust(10)
        + "".join(f"{tag:>14}" for tag in engines)
        + "".join(f"{t + '/' + base:>22}" for t in others)
    )
    for name in runs:
        ratios = "".join(f"{med[t][name] / med[base][name]:22.3f}" for t in others)
        print(name.ljust(10) + "".join(f"{med[t][name]:14.1f}" for t in engines) + ratios)
    for tag in engines:
        for name, d in shapes[tag].items():
            top = ", ".join(
                f"{k}: {v['calls']}x {v['median_ms']:.2f} ms" for k, v in list(d["by_shape"].items())[:6]
            )
            print(f"  {tag} {name}: {d['calls']} calls, {d['reused']} graph reuses; {top}")
    mib = ", ".join(f"{tag} {v / 2**20:.0f}" for tag, v in taken.items())
    print(f"GPU memory the runs took (graph slots, allocated on first use), MiB: {mib}")
    for eng in engines.values():
        eng.close()
    if args.out:
        out = {
            "tok_s": tok_s,
            "median": med,
            "shapes": shapes,
            "gpu_bytes_taken_by_runs": sum(taken.values()),
            "gpu_bytes_taken_by_engine": taken,
        }
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
