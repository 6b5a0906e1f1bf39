"""`clover bench`: what each kind of pass costs on these weights, and what block diffusion buys.

One run on one loaded model measures prompt processing (a prefill per prompt length), the preview
pass (one block of masks over the prompt), the commit pass (one block appended), the AR step (one
token appended), the speculative pass (one block verified and the next one drafted) and the bytes
each pass moves between host and model, then a greedy generation that gives tokens per pass and
end-to-end speed, in the model's mode and side by side in every mode the model runs (`ar`,
`diffusion`, `speculative`). With `simulate`, the same loops also run under the labelled
acceptance simulations of `simulation` (k tokens resolved per preview, a drafted tokens accepted
per iteration), so the engine's speed shows apart from what random weights accept. Each timing is
the median of `repeats` runs; nothing is estimated.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from . import policy, simulation
from .api import Clover
from .backend import RowAdjustments

SIMULATED_K = (1, 2, 4, 8, 16)
SIMULATED_ACCEPT = (0, 1, 2, 4, 8)

FILLER = "The quick brown fox jumps over the lazy dog while the block diffusion model resolves its masks. "


def median_ms(run: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def bench_prompt(clover: Clover, n_tokens: int) -> list[int]:
    """`n_tokens` of ordinary text (filler repeated and cut)."""
    ids: list[int] = []
    chunk = clover.tokenizer.encode(FILLER)
    while len(ids) < n_tokens:
        ids += chunk
    return ids[:n_tokens]


def _generation(clover: Clover, prompt: list[int], gen_tokens: int, mode: str) -> dict[str, Any]:
    """A greedy generation in `mode` on the loaded model: speed, passes and tokens per pass (for
    `speculative`, a pass is an iteration: 1 + the accepted drafted tokens)."""
    loaded, clover.mode = clover.mode, mode
    try:
        stats = clover.create_completion(prompt, max_tokens=gen_tokens)["clover"]
    finally:
        clover.mode = loaded
    tokens, passes, tok_s = len(stats["tokens"]), stats["passes"], stats["generation_tokens_per_s"]
    out = {
        "tokens": tokens,
        "passes": passes,
        "tokens_per_pass": stats["mean_tokens_per_pass"],
        "ms_per_pass": tokens / tok_s / passes * 1e3 if passes else None,
        "tokens_per_s": tok_s,
    }
    if mode == "speculative":
        out["accepted_per_iteration"] = stats["mean_tokens_per_pass"] - 1
    return out


def _moved(backend: Any, run: Callable[[], object]) -> dict[str, int] | None:
    """Bytes one call moves between host and model (the engine counts them; None elsewhere)."""
    if not backend.capabilities.counts_bytes:
        return None
    read, written = backend.bytes_read, backend.bytes_written
    run()
    return {"read": backend.bytes_read - read, "written": backend.bytes_written - written}


def run_bench(
    clover: Clover,
    prompt_tokens: Sequence[int] = (512,),
    gen_tokens: int = 128,
    repeats: int = 3,
    simulate: bool = False,
) -> dict[str, Any]:
    """Timings in ms and speeds in tokens/s; a Clover in AR mode skips previews (`--ar-only` files).

    Decode timings run after a prefill of the first prompt length. The speculative pass and mode
    need a backend that can roll back a block: the reference always, the llama.cpp engine when
    loaded in `speculative` mode (its recurrent-state snapshots).
    """
    for n in prompt_tokens:  # every length must fit with the generation, before any work
        policy.check_length(n, clover.decoding_settings(n, gen_tokens))
    backend, prompt = clover.backend, bench_prompt(clover, prompt_tokens[0])
    previews = clover.mode != "ar"  # AR mode: also what `--ar-only` files run
    caps = backend.capabilities
    verifies = (
        previews
        and caps.speculative
        and (caps.max_verify_rows is None or caps.max_verify_rows >= clover.defaults.block_size)
    )
    s = clover.decoding_settings(len(prompt), gen_tokens)
    adj = policy.adjustment(s, backend.vocab_size, prompt, [])
    block_size = clover.defaults.block_size
    block = [s.mask_token_id] * block_size
    filler = prompt[:block_size]
    out: dict[str, Any] = {"model": clover.model_path, "mode": clover.mode, "prompt_tokens": len(prompt)}
    out["block_size"] = block_size

    out["prompt_processing"] = {}
    for n in prompt_tokens:
        tokens = bench_prompt(clover, n)
        ms = median_ms(lambda t=tokens: backend.prefill(t, adj), repeats)
        out["prompt_processing"][str(n)] = {"ms": ms, "tokens_per_s": n / ms * 1e3}
    backend.prefill(prompt, adj)
    out["prefill_ms"] = out["prompt_processing"][str(len(prompt))]["ms"]
    out["prompt_tokens_per_s"] = out["prompt_processing"][str(len(prompt))]["tokens_per_s"]
    out["preview_ms"] = median_ms(lambda: backend.preview(block, adj), repeats) if previews else None
    out["commit_ms"] = median_ms(lambda: backend.commit(filler, adj), repeats)
    out["ar_step_ms"] = median_ms(lambda: backend.commit(filler[:1], adj), repeats)
    out["ar_tokens_per_s"] = 1e3 / out["ar_step_ms"]
    rows = RowAdjustments.constant(adj, block_size)
    out["fused_pass_ms"] = (
        median_ms(lambda: backend.verify_and_draft(filler, rows, block), repeats) if verifies else None
    )
    out["bytes_per_pass"] = {
        "ar_step": _moved(backend, lambda: backend.commit(filler[:1], adj)),
        "commit": _moved(backend, lambda: backend.commit(filler, adj)),
        "preview": _moved(backend, lambda: backend.preview(block, adj)) if previews else None,
        "fused": _moved(backend, lambda: backend.verify_and_draft(filler, rows, block)) if verifies else None,
    }

    result = clover.create_completion(prompt, max_tokens=gen_tokens)
    stats = result["clover"]
    out["generation"] = {
        "tokens": result["usage"]["completion_tokens"],
        "passes": stats["passes"],
        "blocks": stats["blocks"],
        "tokens_per_pass": stats["mean_tokens_per_pass"],
        "tokens_per_s": stats["generation_tokens_per_s"],
    }
    out["speedup_vs_ar"] = stats["generation_tokens_per_s"] / out["ar_tokens_per_s"]
    runs = ["ar", *(["diffusion"] if previews else []), *(["speculative"] if verifies else [])]
    out["modes"] = {m: _generation(clover, prompt, gen_tokens, m) for m in runs}
    out["llama_cpp_ar"] = _upstream(clover, prompt, gen_tokens, out["modes"]["ar"]["tokens_per_s"])
    if simulate:
        out["simulation"] = _simulations(clover, prompt, gen_tokens, previews, verifies)
    return out


def _upstream(clover: Clover, prompt: list[int], gen_tokens: int, ar_tok_s: float) -> dict[str, float] | None:
    """Plain llama.cpp greedy decoding of the same file in the same library (`llama.upstream`),
    beside the `ar` mode's speed; None on the reference backend."""
    try:
        from .llama import upstream
    except ImportError:  # no llama-cpp-python: the reference backend
        return None
    if not isinstance(clover.backend, upstream.LlamaEngine):
        return None
    _, tok_s = upstream.greedy_decode(clover.backend, prompt, gen_tokens)
    return {"tokens_per_s": tok_s, "ar_ratio": ar_tok_s / tok_s}


def _simulations(
    clover: Clover, prompt: list[int], gen_tokens: int, previews: bool, verifies: bool
) -> dict[str, Any]:
    """The labelled acceptance simulations on the loaded model, against its `ar` loop's speed."""
    backend, s = clover.backend, clover.decoding_settings(len(prompt), gen_tokens)
    ar = _generation(clover, prompt, gen_tokens, "ar")["tokens_per_s"]
    out: dict[str, Any] = {"label": simulation.SIMULATION_LABEL, "ar_tok_s": ar}
    if previews:
        runs = {str(k): simulation.diffusion(backend, prompt, s, k) for k in SIMULATED_K}
        out["e2e_tok_s_by_k"] = {k: r["tokens_per_s"] for k, r in runs.items()}
        out["diffusion_runs"] = runs
    if verifies:
        runs = {str(a): simulation.self_speculative(backend, prompt, s, a) for a in SIMULATED_ACCEPT}
        out["spec_tok_s_by_accept"] = {a: r["tokens_per_s"] for a, r in runs.items()}
        out["speculative_runs"] = runs
    return out
