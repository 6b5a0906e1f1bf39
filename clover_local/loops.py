"""The block-diffusion loop (docs/model.md 2.1-2.2): a generator of per-pass events over a `Backend`.

A request is one prefill, then per block of `block_size` positions: previews until every needed
position is resolved (`policy.fill_positions`), then one commit. The API, streaming, the visual
trace and the benchmark all consume `diffusion_loop`; `complete` just runs it to the end.

Which tokens get committed: exactly the tokens returned. A block cut by a stop token or by the
budget is committed up to its cut (stop token included), so after a request the backend's state
holds the prompt followed by `Result.tokens`, ready for a continuation.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from . import policy
from .backend import Backend, FusedBackend
from .policy import DecodingSettings


@dataclass(frozen=True)
class PassEvent:
    """One preview pass: which block positions it filled and the block afterwards."""

    block: int
    pass_index: int
    position: int  # sequence position of block row 0
    filled: tuple[int, ...]
    tokens: tuple[int, ...]  # snapshot after the pass; mask id where unresolved
    probs: tuple[float, ...]  # candidate probability of every position in this pass
    seconds: float  # a preview fused with the previous commit: only its filling (the pass is in `BlockEvent`)


@dataclass(frozen=True)
class BlockEvent:
    """A finished block: its committed tokens (cut at the stop or budget) and its cost."""

    block: int
    tokens: tuple[int, ...]
    passes: int
    commit_seconds: float  # with `FusedBackend`: the commit and the next block's first preview


@dataclass(frozen=True)
class Result:
    """The end of a request. `tokens_per_pass` counts fills, so positions later cut by a stop count too."""

    tokens: tuple[int, ...]
    finish_reason: str  # "stop" or "length"
    prompt_tokens: int
    passes_per_block: tuple[int, ...]
    tokens_per_pass: tuple[int, ...]
    prefill_seconds: float
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        """Generation speed after the prefill: response tokens per second of decoding."""
        decoding = self.seconds - self.prefill_seconds
        return len(self.tokens) / decoding if decoding > 0 else 0.0


@dataclass(frozen=True)
class TokenEvent:
    """One step of the `ar` loop: the token appended at `position`, its probability and the step's cost."""

    position: int
    token: int
    prob: float
    seconds: float


Event = PassEvent | BlockEvent | TokenEvent | Result


def aligned_candidates(
    anchor: tuple[int, float], tokens: np.ndarray, probs: np.ndarray, logit_shift: int
) -> tuple[np.ndarray, np.ndarray]:
    """Logit alignment (docs/model.md 2.5 [ours]): each block position's candidate from a preview.

    With shift 1 the candidate for position 0 is `anchor` (the pick of the row before the block:
    the prefill's or the previous commit's last row, fixed for the block) and position i >= 1
    takes preview row i-1; the preview's last row is unused. With shift 0 row i serves position i.
    """
    if logit_shift == 0:
        return np.asarray(tokens), np.asarray(probs, dtype=np.float64)
    return np.concatenate([[anchor[0]], tokens[:-1]]), np.concatenate([[anchor[1]], probs[:-1]])


def diffusion_loop(backend: Backend, prompt: Sequence[int], s: DecodingSettings) -> Iterator[Event]:
    """Run one request; yields a `PassEvent` per preview, a `BlockEvent` per block, then the `Result`.

    With a `FusedBackend`, a block's commit runs with the next block's first preview
    (`commit_and_preview`): the same passes and events, the pair's time in the `BlockEvent`.
    """
    prompt = list(prompt)
    fused = cast(FusedBackend, backend).commit_and_preview if backend.capabilities.fused else None
    ahead: tuple[np.ndarray, np.ndarray] | None = None  # the first preview, run with the last commit
    policy.check_length(len(prompt), s)
    draws = policy.Draws(s)
    start = time.perf_counter()
    response: list[int] = []
    anchor = backend.prefill(prompt, policy.adjustment(s, backend.vocab_size, prompt, response), draws(1))
    prefill_seconds = time.perf_counter() - start
    passes_per_block: list[int] = []
    tokens_per_pass: list[int] = []
    finish = "length"
    while len(response) < s.max_new_tokens:
        index, position = len(passes_per_block), len(prompt) + len(response)
        block = np.full(s.block_size, s.mask_token_id, dtype=np.int64)
        end, stopped = policy.block_extent(block, s, s.max_new_tokens - len(response))
        passes = 0
        while (block[:end] == s.mask_token_id).any():
            t0 = time.perf_counter()
            if ahead is None:
                seen = policy.resolved_response(response, block, s.mask_token_id)
                adj = policy.adjustment(s, backend.vocab_size, prompt, seen)
                rows = backend.preview(block.tolist(), adj, s.routing, draws(s.block_size))
            else:
                rows, ahead = ahead, None
            cand, probs = aligned_candidates(anchor, *rows, s.logit_shift)
            masked = block == s.mask_token_id
            masked[end:] = False
            filled = policy.fill_positions(probs, masked, s.threshold)
            block[filled] = cand[filled]
            end, stopped = policy.block_extent(block, s, s.max_new_tokens - len(response))
            tokens_per_pass.append(len(filled))
            yield PassEvent(
                index,
                passes,
                position,
                tuple(int(f) for f in filled),
                tuple(int(t) for t in block),
                tuple(float(p) for p in probs),
                time.perf_counter() - t0,
            )
            passes += 1
        kept = [int(t) for t in block[:end]]
        response += kept
        t0 = time.perf_counter()
        adj = policy.adjustment(s, backend.vocab_size, prompt, response)
        if fused is not None and not stopped and len(response) < s.max_new_tokens:
            # the next block's first preview: all masks, so it counts exactly `response` (this adj)
            masks = [s.mask_token_id] * s.block_size
            anchor, ahead = fused(kept, adj, masks, s.routing, draws(1 + s.block_size))
        else:
            anchor = backend.commit(kept, adj, draws(1))
        passes_per_block.append(passes)
        yield BlockEvent(index, tuple(kept), passes, time.perf_counter() - t0)
        if stopped:
            finish = "stop"
            break
    yield Result(
        tuple(response),
        finish,
        len(prompt),
        tuple(passes_per_block),
        tuple(tokens_per_pass),
        prefill_seconds,
        time.perf_counter() - start,
    )


def ar_loop(backend: Backend, prompt: Sequence[int], s: DecodingSettings) -> Iterator[TokenEvent | Result]:
    """The `ar` mode: one-token causal steps (greedy, or drawn in the pass by `s.sampler`); yields a
    `TokenEvent` per token, then the `Result`.

    The left-to-right baseline and the oracle of `speculative`. Same policy as `diffusion_loop`: each
    step's adjustment counts the response so far, a stop token ends the response (included), the
    budget cuts it, `check_length` applies unchanged; every returned token is committed, so the
    state then holds the prompt followed by `Result.tokens` (the last commit's pick goes unused).
    """
    prompt = list(prompt)
    policy.check_length(len(prompt), s)
    start = time.perf_counter()
    response: list[int] = []
    running = policy.RunningAdjustment(s, backend.vocab_size, prompt)
    draws = policy.Draws(s)
    token, prob = backend.prefill(prompt, running.adjustment(), draws(1))
    prefill_seconds = time.perf_counter() - start
    finish = "length"
    while len(response) < s.max_new_tokens:
        t0 = time.perf_counter()
        response.append(token)
        running.append(token)
        following = backend.commit([token], running.adjustment(), draws(1))
        yield TokenEvent(len(prompt) + len(response) - 1, token, prob, time.perf_counter() - t0)
        if token in s.stop_token_ids:
            finish = "stop"
            break
        token, prob = following
    yield Result(
        tuple(response),
        finish,
        len(prompt),
        (),
        (1,) * len(response),
        prefill_seconds,
        time.perf_counter() - start,
    )


def last_result(events: Iterable[object]) -> Result:
    """Consume a mode's event stream (`diffusion_loop`, `ar_loop`, `speculative_loop`); its `Result`."""
    for event in events:
        if isinstance(event, Result):
            return event
    raise AssertionError("the event stream ended without a Result")


def complete(backend: Backend, prompt: Sequence[int], s: DecodingSettings) -> Result:
    """Run `diffusion_loop` to the end and return its `Result`."""
    return last_result(diffusion_loop(backend, prompt, s))
