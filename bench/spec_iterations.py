"""Where the speculative mode's time goes when no draft is accepted (a = 0), iteration by iteration.

    python bench/spec_iterations.py MODEL.gguf [--tokens 256] [--gpu-layers -1] [--threads 2]
        [--between] [--reps 2]

Runs `speculative.speculative_loop` on `simulation.FixedAccept(a=0)` over the speculative engine
and splits its decoding time into the ordinary `ar` steps, the iterations that ran a preview (the
probes, whose first token the next step checks), the ones that verified a draft and the ones
right after a rollback, beside the `ar` loop on a plain engine of the same file, loaded beside it
and run alternately. Prints milliseconds. `--between` also reports a run that follows other loops
on the same engine (diffusion k = 8, speculative a = 2), as in `timing.py`'s round-robin, where
their pass shapes hold the graph slots.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from clover_local import loops, simulation, speculative  # noqa: E402
from clover_local.llama.engine import LlamaEngine  # noqa: E402
from clover_local.policy import DecodingSettings  # noqa: E402


class Previews:
    """The engine, noting whether a call since the last `take` ran a preview (the prompt's pass,
    the first call after `start`, is not an iteration's)."""

    def __init__(self, inner: LlamaEngine):
        self.inner, self.ran, self.first = inner, False, False

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self.inner, name)

    def verify_and_draft(self, tokens: Sequence[int], adjs, preview: Sequence[int], *args):  # noqa: ANN001, ANN201
        self.ran |= len(preview) > 0 and not self.first
        self.first = False
        return self.inner.verify_and_draft(tokens, adjs, preview, *args)

    def start(self) -> None:
        self.ran, self.first = False, True

    def take(self) -> bool:
        ran, self.ran = self.ran, False
        return ran


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--between", action="store_true", help="also a run after other loops (graph slots taken)")
    ap.add_argument("--reps", type=int, default=2, help="timed rounds of an `ar` run then an a = 0 run")
    args = ap.parse_args(argv)
    kw = dict(n_ctx=1024, n_threads=args.threads, n_gpu_layers=args.gpu_layers)
    prompt = list(range(1, 65))
    runs: dict[str, list] = {}
    ar: list[list[float]] = []
    # both engines loaded, their runs alternated, so that drift and clocks hit them alike
    with LlamaEngine(args.model, speculative=True, **kw) as eng, LlamaEngine(args.model, **kw) as plain:
        s = DecodingSettings(
            mask_token_id=eng.mask_token_id,
            max_new_tokens=args.tokens,
            stop_token_ids=(),
            coreset_enabled=False,  # as timing.py's simulations
            coreset_top_p=eng.default_routing.top_p,
        )
        marked = Previews(eng)

        def a0() -> list[tuple[speculative.IterationEvent, bool]]:
            marked.start()
            loop = speculative.speculative_loop(simulation.FixedAccept(marked, 0), prompt, s)
            return [(e, marked.take()) for e in loop if isinstance(e, speculative.IterationEvent)]

        for rep in range(args.reps + 1):  # the first round warms up (graphs built, kernels loaded)
            steps = [e.seconds for e in loops.ar_loop(plain, prompt, s) if isinstance(e, loops.TokenEvent)]
            run = a0()
            if rep:
                ar.append(steps)
                runs[f"a = 0, run {rep}"] = run
        if args.between:
            simulation.diffusion(eng, prompt, s, 8)
            simulation.self_speculative(eng, prompt, s, 2)
            runs["a = 0 after other loops"] = a0()
    for i, steps in enumerate(ar, 1):
        med = statistics.median(steps)
        print(f"ar loop, run {i}: {1e3 * sum(steps):.1f} ms (step median {1e3 * med:.3f} ms)")
    for name, events in runs.items():
        report(name, events)
    return 0


def report(name: str, marked: list[tuple[speculative.IterationEvent, bool]]) -> None:
    events = [e for e, _ in marked]
    groups = {
        "with a preview": {i for i, (_, preview) in enumerate(marked) if preview},
        "verifying a draft": {i for i, e in enumerate(events) if e.draft},
        "after a rollback": {i + 1 for i, e in enumerate(events) if e.accepted < len(e.draft)},
    }
    ordinary = [e for i, e in enumerate(events) if not any(i in g for g in groups.values())]
    ms = [1e3 * e.seconds for e in ordinary]
    med = statistics.median(ms)
    print(f"{name}: {len(events)} iterations, {1e3 * sum(e.seconds for e in events):.1f} ms")
    print(
        f"  ordinary ar steps: {len(ms)}, {sum(ms):.1f} ms (median {med:.3f} ms, "
        f"{sum(ms) - med * len(ms):.1f} ms above the median in all)"
    )
    slow = sorted(ordinary, key=lambda e: -e.seconds)[:8]
    print(
        "  slowest ordinary steps (iteration: ms): "
        + " ".join(f"{e.index}: {1e3 * e.seconds:.2f}" for e in slow)
    )
    for group, idx in groups.items():
        idx = {i for i in idx if i < len(events)}
        print(
            f"  {group}: {len(idx)}, {1e3 * sum(events[i].seconds for i in idx):.1f} ms: "
            + " ".join(f"{i}: {1e3 * events[i].seconds:.2f}" for i in sorted(idx))
        )


if __name__ == "__main__":
    sys.exit(main())
