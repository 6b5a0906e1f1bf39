"""Host time of the `ar` loop per token, apart from the pass itself.

    python bench/loop_host.py MODEL.gguf [--tokens 128] [--threads 2] [--profile]

Runs `loops.ar_loop` on the llama.cpp engine and splits each step's wall time into the time
spent inside `llama_clover_pass` (graph, compute, one synchronization) and the rest: the loop's
and the engine's Python per token (the adjustment, the ctypes call, the events); then the same
loop with the C call stubbed out, its Python alone on warm caches. `--profile`
prints cProfile's top functions of the loop. Prints medians in microseconds.
`bench/device/timing.py` runs the same split on the GPU (`host_split`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from clover_local import loops  # noqa: E402
from clover_local.llama import capi, engine  # noqa: E402
from clover_local.policy import DecodingSettings  # noqa: E402


def timing_pass(inside: list[float]):  # noqa: ANN201
    """`capi.llama_clover_pass` appending each call's seconds to `inside` (to put in its place)."""
    raw_pass = capi.llama_clover_pass

    def timed_pass(ctx, params):  # noqa: ANN001, ANN202
        t0 = time.perf_counter()
        rc = raw_pass(ctx, params)
        inside.append(time.perf_counter() - t0)
        return rc

    return timed_pass


def host_split(eng: engine.LlamaEngine, prompt: list[int], s: DecodingSettings) -> dict:
    """The `ar` loop's wall time per token, split into `llama_clover_pass` and the rest (the loop's
    and the engine's Python): medians in microseconds."""
    inside: list[float] = []
    raw_pass = capi.llama_clover_pass
    timed_pass = timing_pass(inside)

    def stub_pass(ctx, params):  # noqa: ANN001, ANN202
        eng._tok[0], eng._prob[0] = 1 + len(inside) % 97, 0.5  # no pass: the loop's Python alone
        inside.append(0.0)
        return 0

    engine.capi.llama_clover_pass = timed_pass
    try:
        steps = [e.seconds for e in loops.ar_loop(eng, prompt, s) if isinstance(e, loops.TokenEvent)]
        eng.reset()
        engine.capi.llama_clover_pass = stub_pass
        stubbed = [e.seconds for e in loops.ar_loop(eng, prompt, s) if isinstance(e, loops.TokenEvent)]
    finally:
        engine.capi.llama_clover_pass = raw_pass
        eng.reset()
    passes = inside[1 : 1 + len(steps)]  # inside[0] is the prefill
    return {
        "tokens": len(steps),
        "step_us": statistics.median(steps) * 1e6,
        "pass_us": statistics.median(passes) * 1e6,
        "python_us": statistics.median([a - b for a, b in zip(steps, passes, strict=True)]) * 1e6,
        # the same steps with the C call stubbed out: the Python on warm caches
        "python_stub_us": statistics.median(stubbed) * 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=64, help="prompt length (random token ids)")
    ap.add_argument("--profile", action="store_true", help="also print cProfile's top functions")
    args = ap.parse_args(argv)

    with engine.LlamaEngine(args.model, n_ctx=args.prompt + args.tokens + 64, n_threads=args.threads) as eng:
        mask = eng.mask_token_id
        s = DecodingSettings(
            mask_token_id=mask, max_new_tokens=args.tokens, presence_penalty=1.5, stop_token_ids=(0,)
        )
        prompt = list(range(1, args.prompt + 1))
        split = host_split(eng, prompt, s)
        print(f"{split['tokens']} tokens: step {split['step_us']:.0f} us, ", end="")
        print(f"llama_clover_pass {split['pass_us']:.0f} us, ", end="")
        print(f"host Python per token {split['python_us']:.1f} us (median; ", end="")
        print(f"{split['python_stub_us']:.1f} us with the pass stubbed out)")
        if args.profile:
            # here, not at the top: bench/device/profile.py shadows the stdlib module cProfile imports
            # for bench/device/timing.py, which imports host_split from this file
            import cProfile
            import pstats

            prof = cProfile.Profile()
            prof.enable()
            loops.last_result(loops.ar_loop(eng, prompt, s))
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(15)
    return 0


if __name__ == "__main__":
    sys.exit(main())
