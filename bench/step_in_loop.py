"""Why a decoding loop's step can cost more than the same step timed alone: one engine, four kinds
of 256-step runs from the same prompt, round-robin, each step's time inside `llama_clover_pass`.

    python bench/step_in_loop.py MODEL.gguf [--baseline QWEN35MOE.gguf] [--gpu-layers -1]
        [--prompt 512] [--n-ctx 12800] [--reps 3]

- random tokens, no adjustment: how `bench/device/timing.py` times the engine's AR step;
- random tokens, the loop's adjustment (the mask token, stops, ramps, counted per step);
- each step's pick fed back, no adjustment;
- the `ar` loop itself (`loops.ar_loop`).

With `--baseline`, upstream's step on its `qwen35moe` twin (random tokens, its own context) joins
the round-robin, timed around `llama_decode` and the logits read. Prints medians in ms per step.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.device.timing import Raw  # noqa: E402
from clover_local import loops  # noqa: E402
from clover_local.backend import LogitAdjustment  # noqa: E402
from clover_local.llama import capi, engine  # noqa: E402
from clover_local.policy import DecodingSettings, RunningAdjustment  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--baseline", help="upstream's qwen35moe twin of MODEL")
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--prompt", type=int, default=512, help="prompt length (random token ids)")
    ap.add_argument("--n-ctx", type=int, default=12800)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    inside: list[float] = []
    raw_pass = capi.llama_clover_pass

    def timed_pass(ctx, params):  # noqa: ANN001, ANN202
        t0 = time.perf_counter()
        rc = raw_pass(ctx, params)
        inside.append(time.perf_counter() - t0)
        return rc

    engine.capi.llama_clover_pass = timed_pass
    eng = engine.LlamaEngine(args.model, n_ctx=args.n_ctx, n_gpu_layers=args.gpu_layers)
    base = None
    if args.baseline:
        base = Raw(args.baseline, args.gpu_layers, True, args.n_ctx, 512, 512, None)
    vocab = min(eng.vocab_size, 248000)
    prompt = [int(t) for t in rng.integers(0, vocab, size=args.prompt)]
    s = DecodingSettings(
        mask_token_id=eng.mask_token_id,
        max_new_tokens=args.tokens,
        context_limit=args.n_ctx,
        stop_token_ids=(0,),
        coreset_enabled=False,
        coreset_top_p=eng.default_routing.top_p,
    )
    identity = LogitAdjustment.identity(eng.vocab_size)

    def steps(kind: str) -> list[float]:
        """One run of `kind` from the prompt; the time of each step's pass."""
        eng.reset()
        running = RunningAdjustment(s, eng.vocab_size, prompt)
        token, _ = eng.prefill(prompt, identity)
        inside.clear()
        if kind == "ar loop":
            loops.last_result(loops.ar_loop(eng, prompt, s))
            return inside[1:]  # inside[0]: the loop's own prefill
        for _ in range(args.tokens):
            fed = token if kind.startswith("picks") else int(rng.integers(0, vocab))
            running.append(fed)
            token, _ = eng.commit([fed], running.adjustment() if "adjustment" in kind else identity)
        return list(inside)

    def upstream() -> list[float]:
        assert base is not None
        base.clear()
        base.decode([int(t) for t in rng.integers(0, vocab, size=args.prompt)], "last")
        out = []
        for _ in range(args.tokens):
            t0 = time.perf_counter()
            base.decode([int(rng.integers(0, vocab))], "last")
            out.append(time.perf_counter() - t0)
        return out

    kinds: dict[str, Callable[[], list[float]]] = {
        k: (lambda k=k: steps(k))
        for k in (
            "random tokens, no adjustment",
            "random tokens, loop adjustment",
            "picks, no adjustment",
            "ar loop",
        )
    }
    if base is not None:
        kinds["upstream's step (random tokens)"] = upstream
    done: dict[str, list[float]] = {k: [] for k in kinds}
    for rep in range(args.reps + 1):  # the first round warms up
        for name, fn in kinds.items():
            ms = 1e3 * statistics.median(fn())
            if rep:
                done[name].append(ms)
    engine.capi.llama_clover_pass = raw_pass
    print(f"{Path(args.model).name}: prompt {args.prompt}, n_ctx {args.n_ctx}, {args.tokens} steps a run")
    for name, ms in done.items():
        runs = ", ".join(f"{m:.3f}" for m in ms)
        print(f"  {name}: median step {statistics.median(ms):.3f} ms (runs: {runs})")
    eng.close()
    if base is not None:
        base.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
