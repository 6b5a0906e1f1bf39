"""Why the speculative loop's common pass costs more inside the loop than timed alone: one engine,
the same 2 + 2 verification (2 causal rows + a 2-row preview) timed three ways, round-robin.

    python bench/pass_in_loop.py MODEL.gguf [--gpu-layers -1] [--prompt 512] [--reps 3] [--calls 30]
        [--json out.json]

- `alone`: rolled back before each call, as `bench/device/timing.py` times `verify_2_2_ms`;
- `advancing`: the rows kept, call after call (the loop's steady state when every draft is kept);
- `loop`: inside the speculative loop at a = 1 (`simulation.FixedAccept`), its 2 + 2 calls only.

Each call is timed around `verify_and_draft` (the loop's by `graph_slots.ShapeTimer`). ggml-cuda's
debug log is counted per way: CUDA graphs replayed ("reused"), captured ("warmup complete") and
dropped for changed nodes ("warmup reset"), so a way that runs eagerly shows. Prints the median ms
per way and the counts.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import llama_cpp as ll  # noqa: E402

from bench.graph_slots import ShapeTimer, simulation_settings  # noqa: E402
from clover_local import simulation  # noqa: E402
from clover_local.backend import LogitAdjustment, RowAdjustments  # noqa: E402
from clover_local.llama.engine import LlamaEngine  # noqa: E402

EVENTS = {"reused": "CUDA Graph id", "captured": "warmup complete", "reset": "warmup reset"}
counts: Counter = Counter()


@ll.llama_log_callback
def _count(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    line = text.decode("utf-8", "replace")
    for name, marker in EVENTS.items():
        if marker in line:
            counts[name] += 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--gpu-layers", type=int, default=-1)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--reps", type=int, default=3, help="rounds of the three ways")
    ap.add_argument("--calls", type=int, default=30, help="timed calls per way and round")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    eng = LlamaEngine(args.model, n_ctx=4096, n_gpu_layers=args.gpu_layers, speculative=True)
    ll.llama_log_set(_count, ctypes.c_void_p(0))
    V, mask = eng.vocab_size, eng.mask_token_id
    toks = lambda n: [int(t) for t in rng.integers(0, min(V, 248000), size=n)]  # noqa: E731
    prompt = toks(args.prompt)
    adj = LogitAdjustment.identity(V)
    rows = RowAdjustments.constant(adj, 2)
    # the first draft and the doubling attempts, then 2 + 2 calls
    s = simulation_settings(eng, 2 * args.calls + 64)

    def fresh() -> int:
        eng.prefill(prompt, adj)
        return eng.n_past

    def calls(rolled_back: bool) -> list[float]:
        """args.calls timed 2 + 2 verifications after 3 untimed ones, from the prompt."""
        p0, out = fresh(), []
        for _ in range(args.calls + 3):
            if rolled_back and eng.n_past > p0:
                eng.rollback(p0)
            t = time.perf_counter()
            eng.verify_and_draft(toks(2), rows, [mask, mask])
            out.append(1e3 * (time.perf_counter() - t))
        return out[3:]

    def loop() -> list[float]:
        timer = ShapeTimer(eng)
        simulation.self_speculative(timer, prompt, s, 1)
        return timer.ms[(2, 2)][3:]

    ways = {"alone": lambda: calls(True), "advancing": lambda: calls(False), "loop": loop}
    ms: dict[str, list[float]] = {w: [] for w in ways}
    events: dict[str, Counter] = {w: Counter() for w in ways}
    for rep in range(args.reps + 1):  # round 0 warms up (graphs, kernels) and is dropped
        for name, way in ways.items():
            before = counts.copy()
            got = way()
            if rep:
                ms[name] += got
                events[name] += counts - before
    eng.close()
    result = {
        w: {"median_ms": statistics.median(v), "calls": len(v), "events": dict(events[w])}
        for w, v in ms.items()
    }
    print(f"{Path(args.model).name}: 2 + 2 verifications, median ms over {args.reps} rounds")
    for w, r in result.items():
        print(f"  {w:10s} {r['median_ms']:7.3f} ms  ({r['calls']} calls; ggml-cuda: {r['events']})")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
