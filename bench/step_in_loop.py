"""A decoding loop's tokens per second against the same step timed alone and against upstream's
step, all in one process and round-robin (drift and clocks hit them alike): 256-token runs from
the same prompt length, each step's time inside `llama_clover_pass` and each run's wall time.

    python bench/step_in_loop.py MODEL.gguf [--baseline QWEN35MOE.gguf] [--speculative]
        [--gpu-layers -1] [--prompt 512] [--n-ctx 12800] [--reps 3]

- random tokens, no adjustment: how `bench/device/timing.py` times the engine's AR step;
- random tokens, the loop's adjustment (the mask token, stops, ramps, counted per step);
- each step's pick fed back, no adjustment;
- the `ar` loop itself (`loops.ar_loop`);
- `--speculative`: the speculative loop at a = 0 (`simulation.FixedAccept`) on a second engine
  built for it, loaded beside the first;
- `--baseline`: upstream's step on its `qwen35moe` twin (random tokens, its own context), timed
  around `llama_decode` and the logits read.

Prints per kind the median step (ms) and tokens per second over the run's wall time, with the
ratio to upstream's.
"""

from __future__ import annotations

import argparse
import json
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
from bench.loop_host import timing_pass  # noqa: E402
from clover_local import loops, simulation, speculative  # noqa: E402
from clover_local.backend import LogitAdjustment  # noqa: E402
from clover_local.llama import capi, engine  # noqa: E402
from clover_local.policy import DecodingSettings, RunningAdjustment  # noqa: E402

UPSTREAM = "upstream's step (random tokens)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--baseline", help="upstream's qwen35moe twin of MODEL")
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--prompt", type=int, default=512, help="prompt length (random token ids)")
    ap.add_argument("--n-ctx", type=int, default=12800)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, help="CPU threads of each context (default: llama.cpp's)")
    ap.add_argument("--speculative", action="store_true", help="also the speculative loop at a = 0")
    ap.add_argument("--json", type=Path, help="also write the figures there")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    inside: list[float] = []
    raw_pass = capi.llama_clover_pass
    engine.capi.llama_clover_pass = timing_pass(inside)
    kw = dict(n_ctx=args.n_ctx, n_gpu_layers=args.gpu_layers, n_threads=args.threads)
    eng = engine.LlamaEngine(args.model, **kw)
    spec = None
    if args.speculative:
        spec = engine.LlamaEngine(args.model, **kw, speculative=True)
    base = None
    if args.baseline:
        base = Raw(args.baseline, args.gpu_layers, True, args.n_ctx, 512, 512, args.threads)
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

    def steps(kind: str) -> tuple[list[float], float]:
        """One run of `kind` from the prompt: the time of each step's pass, and the run's seconds."""
        e = spec if kind == "a = 0 loop" else eng
        assert e is not None
        e.reset()
        running = RunningAdjustment(s, e.vocab_size, prompt)
        token, _ = e.prefill(prompt, identity)
        inside.clear()
        if kind == "ar loop":
            r = loops.last_result(loops.ar_loop(e, prompt, s))
            return inside[1:], r.seconds - r.prefill_seconds  # inside[0]: the loop's own prefill
        if kind == "a = 0 loop":
            r = loops.last_result(speculative.speculative_loop(simulation.FixedAccept(e, 0), prompt, s))
            return inside[2:], r.seconds - r.prefill_seconds  # its prefill and the prompt's pass
        t0 = time.perf_counter()
        for _ in range(args.tokens):
            fed = token if kind.startswith("picks") else int(rng.integers(0, vocab))
            running.append(fed)
            token, _ = e.commit([fed], running.adjustment() if "adjustment" in kind else identity)
        return list(inside), time.perf_counter() - t0

    def upstream() -> tuple[list[float], float]:
        assert base is not None
        base.clear()
        base.decode([int(t) for t in rng.integers(0, vocab, size=args.prompt)], "last")
        out = []
        for _ in range(args.tokens):
            t0 = time.perf_counter()
            base.decode([int(rng.integers(0, vocab))], "last")
            out.append(time.perf_counter() - t0)
        return out, sum(out)

    names = [
        "random tokens, no adjustment",
        "random tokens, loop adjustment",
        "picks, no adjustment",
        "ar loop",
    ]
    kinds: dict[str, Callable[[], tuple[list[float], float]]] = {k: (lambda k=k: steps(k)) for k in names}
    if spec is not None:
        kinds["a = 0 loop"] = lambda: steps("a = 0 loop")
    if base is not None:
        kinds[UPSTREAM] = upstream
    done: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
    for rep in range(args.reps + 1):  # the first round warms up
        for name, fn in kinds.items():
            step_s, run_s = fn()
            if rep:
                done[name].append((1e3 * statistics.median(step_s), args.tokens / run_s))
    engine.capi.llama_clover_pass = raw_pass
    print(f"{Path(args.model).name}: prompt {args.prompt}, n_ctx {args.n_ctx}, {args.tokens} tokens a run")
    up = statistics.median(t for _, t in done[UPSTREAM]) if UPSTREAM in done else None
    out: dict = {"file": Path(args.model).name, "prompt": args.prompt, "n_ctx": args.n_ctx, "kinds": {}}
    for name, runs in done.items():
        step, tok_s = statistics.median(m for m, _ in runs), statistics.median(t for _, t in runs)
        vs = f", {tok_s / up:.3f}x upstream's" if up else ""
        each = ", ".join(f"{t:.1f}" for _, t in runs)
        print(f"  {name}: median step {step:.3f} ms, {tok_s:.1f} tok/s{vs} (runs: {each})")
        out["kinds"][name] = {
            "step_ms": step,
            "tok_s": tok_s,
            "tok_s_runs": [t for _, t in runs],
            "vs_upstream": tok_s / up if up else None,
        }
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    eng.close()
    if spec is not None:
        spec.close()
    if base is not None:
        base.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
