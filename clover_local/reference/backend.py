"""The numpy reference as a `backend.Backend` and `backend.SpeculativeBackend`: the oracle every
other backend's trace is compared with."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..backend import (
    GREEDY,
    Capabilities,
    Draw,
    LogitAdjustment,
    Routing,
    RowAdjustments,
    Sampler,
    Verification,
    distribution,
    head,
    pick,
    split_draw,
)
from .model import ReferenceModel, State


class NumpyBackend:
    """One sequence on a `ReferenceModel`; `state` is the committed prefix."""

    capabilities = Capabilities(fused=True, speculative=True)

    def __init__(self, model: ReferenceModel):
        self.model = model
        self.vocab_size = model.cfg.vocab_size
        self.default_routing = model.default_routing
        self.state: State = model.new_state()
        self._pass: tuple[State, list[int]] | None = None  # the last verification: start state, causal rows

    def prefill(
        self, tokens: Sequence[int], adj: LogitAdjustment, draw: Draw | None = None
    ) -> tuple[int, float]:
        self.state = self.model.new_state()
        return self.commit(tokens, adj, draw)

    def preview(
        self,
        block: Sequence[int],
        adj: LogitAdjustment,
        routing: Routing | None = None,
        draw: Draw | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        return head(self.model.preview(block, self.state, routing=routing), adj, draw)

    def commit(
        self, tokens: Sequence[int], adj: LogitAdjustment, draw: Draw | None = None
    ) -> tuple[int, float]:
        self._pass = None
        tok, prob = head(self.model.commit(tokens, self.state)[-1:], adj, draw)
        return int(tok[0]), float(prob[0])

    def close(self) -> None:
        """Nothing to free: the model's arrays go with the object."""

    def commit_and_preview(
        self,
        tokens: Sequence[int],
        adj: LogitAdjustment,
        block: Sequence[int],
        routing: Routing | None = None,
        draw: Draw | None = None,
    ) -> tuple[tuple[int, float], tuple[np.ndarray, np.ndarray]]:
        """`backend.FusedBackend`: a commit, then a preview over the state it left (what the fused
        graph of another backend must equal)."""
        first, rest = split_draw(draw)
        return self.commit(tokens, adj, first), self.preview(block, adj, routing, rest)

    def verify_and_draft(
        self,
        tokens: Sequence[int],
        adjs: RowAdjustments,
        preview: Sequence[int],
        sampler: Sampler = GREEDY,
        routing: Routing | None = None,
    ) -> Verification:
        """One speculative pass: a causal commit of `tokens`, then a preview over the state it left."""
        self._pass = (self.state.copy(), list(tokens))
        causal = self.model.commit(tokens, self.state) if len(tokens) else np.zeros((0, self.vocab_size))
        ahead = (
            self.model.preview(preview, self.state, routing=routing)
            if len(preview)
            else np.zeros((0, self.vocab_size))
        )
        picks = [pick(causal[j : j + 1], adjs.row(j)) for j in range(len(tokens))]
        draft_tokens, draft_probs = pick(ahead, adjs.last())
        sampled = not sampler.greedy
        return Verification(
            np.array([int(t[0]) for t, _ in picks], dtype=np.int64),
            np.array([float(p[0]) for _, p in picks]),
            draft_tokens,
            draft_probs,
            np.array([distribution(causal[j], adjs.row(j), sampler) for j in range(len(tokens))])
            if sampled
            else None,
            distribution(ahead, adjs.last(), sampler) if sampled else None,
        )

    def rollback(self, n_keep: int) -> None:
        """Restore the state of the last pass's start and re-commit its kept rows: the reference
        recomputes what a graph keeps as per-row snapshots (same state, chunking is free)."""
        if n_keep == 0:
            self.state, self._pass = self.model.new_state(), None
            return
        start, rows = self._pass if self._pass else (self.state, [])
        if not start.n_past <= n_keep <= self.state.n_past:
            raise ValueError(
                f"cannot roll back to {n_keep}: the last pass spans {start.n_past}..{self.state.n_past}"
            )
        if n_keep < self.state.n_past:
            self.state, kept = start.copy(), rows[: n_keep - start.n_past]
            if kept:
                self.model.commit(kept, self.state)
            self._pass = (start, kept)
