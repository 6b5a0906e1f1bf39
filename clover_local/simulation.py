"""Labelled acceptance simulations: the real decode loops with a fixed acceptance per pass.

Random weights never reach the confidence threshold (a preview resolves one token) and their
drafts never agree with the verifier, so the engine's speed at a trained model's acceptance
cannot be seen on them. These wrappers run the unchanged `loops.diffusion_loop` and
`speculative.speculative_loop` loops on a real backend and rewrite only what decides acceptance: the
confidences of a preview (exactly `k` masked positions per pass are sure) or the verifier's picks
(exactly `a` drafted tokens agree). Every pass, fused pass, rollback and host step of a real run
happens; the tokens are the random model's. Results carry `SIMULATION_LABEL` wherever reported.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from . import loops, speculative
from .backend import (
    GREEDY,
    Backend,
    Capabilities,
    Draw,
    FusedBackend,
    LogitAdjustment,
    Routing,
    RowAdjustments,
    Sampler,
    SpeculativeBackend,
    Verification,
)
from .policy import DecodingSettings
from .speculative import SpeculativeSettings

SIMULATION_LABEL = "labelled simulation: random weights, acceptance fixed per pass (not a model's output)"


class FixedFill:
    """A `backend.Backend` whose previews are sure of exactly the first `k` masked positions.

    Candidates keep the model's tokens; only the probabilities change: 1 for the chosen
    positions, 0 elsewhere, after the loop's alignment (`loops.aligned_candidates`: with logit
    shift 1, position 0 takes the anchor's probability, so anchors report 1).
    """

    def __init__(self, inner: Backend, k: int, s: DecodingSettings):
        if k < 1 or not 0 < s.threshold <= 1:
            raise ValueError("a fill simulation needs k >= 1 and a threshold in (0, 1]")
        self.inner, self.k, self.s = inner, k, s
        self.vocab_size = inner.vocab_size
        self.capabilities = Capabilities(fused=inner.capabilities.fused)
        self.default_routing = inner.default_routing

    def _sure(self, block: Sequence[int], tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        masked = [i for i, t in enumerate(block) if t == self.s.mask_token_id][: self.k]
        shift = self.s.logit_shift
        probs = np.zeros(len(tokens), dtype=np.float32)
        rows = [i - shift for i in masked if i - shift >= 0]
        probs[rows] = 1.0
        return np.asarray(tokens), probs

    def prefill(
        self, tokens: Sequence[int], adj: LogitAdjustment, draw: Draw | None = None
    ) -> tuple[int, float]:
        return self.inner.prefill(tokens, adj, draw)[0], 1.0

    def commit(
        self, tokens: Sequence[int], adj: LogitAdjustment, draw: Draw | None = None
    ) -> tuple[int, float]:
        return self.inner.commit(tokens, adj, draw)[0], 1.0

    def preview(
        self,
        block: Sequence[int],
        adj: LogitAdjustment,
        routing: Routing | None = None,
        draw: Draw | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        return self._sure(block, self.inner.preview(block, adj, routing, draw)[0])

    def commit_and_preview(
        self,
        tokens: Sequence[int],
        adj: LogitAdjustment,
        block: Sequence[int],
        routing: Routing | None = None,
        draw: Draw | None = None,
    ) -> tuple[tuple[int, float], tuple[np.ndarray, np.ndarray]]:
        inner = cast(FusedBackend, self.inner)
        anchor, (picks, _) = inner.commit_and_preview(tokens, adj, block, routing, draw)
        return (anchor[0], 1.0), self._sure(block, picks)


class FixedAccept:
    """A `backend.SpeculativeBackend` whose verifier agrees with exactly `a` drafted tokens.

    The verifier's picks for the first `a` drafted positions are replaced by the drafted tokens
    and the next pick is made to differ; the drafts' confidences read 1 (no threshold cut). The
    speculative loop's shadow check (a plain step right after a pass that drafted nothing, whose
    pick is compared with that pass's first preview token) agrees exactly when `a` >= 1.
    Greedy only: a sampled run's acceptance is decided by the distributions.
    """

    def __init__(self, inner: SpeculativeBackend, a: int):
        if a < 0:
            raise ValueError("a must be >= 0")
        self.inner, self.a = inner, a
        self.vocab_size = inner.vocab_size
        self.capabilities = Capabilities(speculative=True, max_verify_rows=inner.capabilities.max_verify_rows)
        self.default_routing = inner.default_routing
        self._shadow: int | None = None  # the first preview token of a pass that drafted nothing

    def prefill(
        self, tokens: Sequence[int], adj: LogitAdjustment, draw: Draw | None = None
    ) -> tuple[int, float]:
        self._shadow = None
        return self.inner.prefill(tokens, adj, draw)

    def preview(
        self,
        block: Sequence[int],
        adj: LogitAdjustment,
        routing: Routing | None = None,
        draw: Draw | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        return self.inner.preview(block, adj, routing, draw)

    def commit(
        self, tokens: Sequence[int], adj: LogitAdjustment, draw: Draw | None = None
    ) -> tuple[int, float]:
        pick, prob = self.inner.commit(tokens, adj, draw)
        shadow, self._shadow = self._shadow, None
        if shadow is not None and len(tokens) == 1:  # a shadow check: agree iff a >= 1
            if self.a:
                pick = shadow
            elif pick == shadow:
                pick = (pick + 1) % self.vocab_size
        return pick, prob

    def rollback(self, n_keep: int) -> None:
        self._shadow = None
        self.inner.rollback(n_keep)

    def verify_and_draft(
        self,
        tokens: Sequence[int],
        adjs: RowAdjustments,
        preview: Sequence[int],
        sampler: Sampler = GREEDY,
        routing: Routing | None = None,
    ) -> Verification:
        if not sampler.greedy:
            raise ValueError("the acceptance simulation is greedy only")
        v = self.inner.verify_and_draft(tokens, adjs, preview, sampler, routing)
        drafted = list(tokens[1:])
        self._shadow = int(v.draft_tokens[0]) if not drafted and len(v.draft_tokens) else None
        picks = np.array(v.tokens, copy=True)
        n = min(self.a, len(drafted))
        picks[:n] = drafted[:n]
        if n < len(drafted) and picks[n] == drafted[n]:
            picks[n] = (drafted[n] + 1) % self.vocab_size
        return dataclasses.replace(v, tokens=picks, draft_probs=np.ones_like(v.draft_probs))


def _speed(result: loops.Result, passes: int) -> dict[str, Any]:
    n = len(result.tokens)
    return {
        "tokens": n,
        "passes": passes,
        "tokens_per_pass": n / passes if passes else 0.0,
        "seconds": result.seconds - result.prefill_seconds,
        "tokens_per_s": result.tokens_per_second,
    }


def diffusion(backend: Backend, prompt: Sequence[int], s: DecodingSettings, k: int) -> dict[str, Any]:
    """Block diffusion resolving exactly `k` tokens per preview pass (no stop tokens)."""
    s = dataclasses.replace(s, stop_token_ids=())
    result = loops.complete(FixedFill(backend, k, s), prompt, s)
    return _speed(result, sum(result.passes_per_block))


def self_speculative(
    backend: SpeculativeBackend,
    prompt: Sequence[int],
    s: DecodingSettings,
    a: int,
    spec: SpeculativeSettings | None = None,
) -> dict[str, Any]:
    """Self-speculative decoding accepting exactly `a` drafted tokens per iteration (when `a` were
    drafted), the draft length adapting as in a real run (no stop tokens)."""
    s = dataclasses.replace(s, stop_token_ids=(), sampler=GREEDY)
    result = loops.last_result(speculative.speculative_loop(FixedAccept(backend, a), prompt, s, spec))
    assert isinstance(result, speculative.SpeculativeResult)
    out = _speed(result, len(result.accepted))
    out["mean_draft_length"] = float(np.mean(result.draft_lengths)) if result.draft_lengths else 0.0
    out["accepted_per_iteration"] = float(np.mean(result.accepted)) if result.accepted else 0.0
    return out
