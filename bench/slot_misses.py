"""How many graph slots one decoding loop needs: each loop run again and again on one speculative
engine (a user's turns in one mode), and the last run's backend calls that found no built graph to
reuse (patch 0401's slots; `LLAMA_GRAPH_CACHE`), per slot count.

    python bench/slot_misses.py MODEL.gguf [--gpu-layers 0] [--slots 4 8 12 16] [--loops a1 a2 k4]
        [--runs 3] [--tokens 256] [--prefix 512] [--json out.json]

A loop is `aN` (self-speculative, N accepted per pass) or `kN` (block diffusion, N tokens a pass).
Each slot count gets an engine of its own (the variable is read when a context is created).
Prints, per slot count and loop, misses / calls of the last run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.graph_slots import reused, simulation_settings  # noqa: E402
from clover_local import simulation  # noqa: E402
from clover_local.llama.engine import LlamaEngine  # noqa: E402

PASSES = ("prefill", "commit", "preview", "verify_and_draft", "commit_and_preview")


class MissCounter:
    """The engine with each pass counted, and counted as a miss when llama.cpp built its graph."""

    def __init__(self, eng: LlamaEngine):
        self.eng, self.calls, self.misses = eng, 0, 0

    def __getattr__(self, name: str):  # noqa: ANN204
        f = getattr(self.eng, name)
        if name not in PASSES:
            return f

        def counted(*a, **kw):  # noqa: ANN002, ANN003, ANN202
            n0 = reused(self.eng)
            out = f(*a, **kw)
            self.calls += 1
            self.misses += reused(self.eng) == n0
            return out

        return counted


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--slots", type=int, nargs="+", default=[4, 8, 12, 16])
    ap.add_argument("--loops", nargs="+", default=["a1", "a2", "a4", "a8", "k2", "k4", "k8"])
    ap.add_argument("--runs", type=int, default=3, help="runs of each loop; the last one is counted")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--prefix", type=int, default=512)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    result: dict[str, dict[str, dict[str, int]]] = {}
    for n in args.slots:
        os.environ["LLAMA_GRAPH_CACHE"] = str(n)
        eng = LlamaEngine(args.model, n_ctx=4096, n_gpu_layers=args.gpu_layers, speculative=True, log=False)
        prompt = [int(t) for t in np.random.default_rng(0).integers(0, eng.vocab_size, size=args.prefix)]
        s = simulation_settings(eng, args.tokens)
        result[str(n)] = {}
        for loop in args.loops:
            kind, k = loop[0], int(loop[1:])
            for _ in range(args.runs):
                counter = MissCounter(eng)
                if kind == "a":
                    simulation.self_speculative(counter, prompt, s, k)
                else:
                    simulation.diffusion(counter, prompt, s, k)
            result[str(n)][loop] = {"misses": counter.misses, "calls": counter.calls}
        eng.close()
        row = "  ".join(f"{lp} {r['misses']}/{r['calls']}" for lp, r in result[str(n)].items())
        print(f"{n:3d} slots: {row}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
