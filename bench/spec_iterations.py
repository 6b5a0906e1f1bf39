"""Where the speculative mode's time goes when no draft is accepted (a = 0), iteration by iteration.

    python bench/spec_iterations.py MODEL.gguf [--tokens 256] [--gpu-layers -1] [--threads 2]

Runs `speculative.speculative_loop` on `simulation.FixedAccept(a=0)` over the speculative engine
and splits its decoding time into the ordinary `ar` steps, the iterations that carry a draft
(the optimistic first one, the probes) and the iterations right after them (rollback, graph
switch), beside the `ar` loop's step on a plain engine of the same file. Prints milliseconds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from clover_local import loops, simulation, speculative  # noqa: E402
from clover_local.llama.engine import LlamaEngine  # noqa: E402
from clover_local.policy import DecodingSettings  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--gpu-layers", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    kw = dict(n_ctx=1024, n_threads=args.threads, n_gpu_layers=args.gpu_layers)
    prompt = list(range(1, 65))
    with LlamaEngine(args.model, speculative=True, **kw) as eng:
        mask = eng.mask_token_id
        s = DecodingSettings(mask_token_id=mask, max_new_tokens=args.tokens, stop_token_ids=())
        for _ in range(2):  # the second run is reported (graphs built, allocations warm)
            events = [
                e
                for e in speculative.speculative_loop(simulation.FixedAccept(eng, 0), prompt, s)
                if isinstance(e, speculative.IterationEvent)
            ]
    with LlamaEngine(args.model, **kw) as eng:
        for _ in range(2):
            ar = [e.seconds for e in loops.ar_loop(eng, prompt, s) if isinstance(e, loops.TokenEvent)]
    drafted = {i for i, e in enumerate(events) if e.draft}
    after = {i + 1 for i in drafted} - drafted
    before = {i - 1 for i in drafted} - drafted  # the step whose preview made the probe's draft
    groups = {"drafted": drafted, "before a draft": before, "after a draft": after}
    ordinary = [e.seconds for i, e in enumerate(events) if not any(i in g for g in groups.values())]
    total = sum(e.seconds for e in events)
    print(
        f"{len(events)} iterations, {1e3 * total:.1f} ms; ar loop {1e3 * sum(ar):.1f} ms "
        f"(step median {1e3 * statistics.median(ar):.3f} ms)"
    )
    print(
        f"  ordinary ar steps: {len(ordinary)}, {1e3 * sum(ordinary):.1f} ms "
        f"(median {1e3 * statistics.median(ordinary):.3f} ms)"
    )
    for name, idx in groups.items():
        ms = [1e3 * events[i].seconds for i in sorted(idx)]
        print(f"  {name}: {len(ms)}, {sum(ms):.1f} ms: " + " ".join(f"{m:.2f}" for m in ms))
    return 0


if __name__ == "__main__":
    sys.exit(main())
