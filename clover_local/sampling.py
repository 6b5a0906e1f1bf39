"""Sampling for the `ar` mode without full logits: Gumbel noise in the logit adjustment.

A backend returns per row only the argmax after the adjustment. With g ~ Gumbel(0, 1) per vocab
entry, argmax(l' + T g) is a sample of softmax(l' / T) (the Gumbel-max trick), so adding T g to
the adjustment's bias samples exactly while the argmax stays in the graph. It needs fresh noise
per row, which a one-row `ar` step has and a block-wide preview (one bias for all rows) has not.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .backend import Backend, Capabilities, LogitAdjustment, Routing


def gumbel(adj: LogitAdjustment, temperature: float, rng: np.random.Generator) -> LogitAdjustment:
    """The adjustment plus temperature-scaled Gumbel noise on its bias."""
    pos_scale, neg_scale, bias = adj.vectors()
    noise = rng.gumbel(size=bias.shape).astype(np.float32)
    return LogitAdjustment.from_vectors(pos_scale, neg_scale, bias + np.float32(temperature) * noise)


class GumbelBackend:
    """A `Backend` whose causal picks are samples at `temperature` (previews are refused)."""

    def __init__(self, backend: Backend, temperature: float, rng: np.random.Generator):
        self.backend, self.temperature, self.rng = backend, temperature, rng
        self.vocab_size = backend.vocab_size
        self.capabilities = Capabilities()  # the three passes only
        self.default_routing = backend.default_routing

    def prefill(self, tokens: Sequence[int], adj: LogitAdjustment) -> tuple[int, float]:
        return self.backend.prefill(tokens, gumbel(adj, self.temperature, self.rng))

    def commit(self, tokens: Sequence[int], adj: LogitAdjustment) -> tuple[int, float]:
        return self.backend.commit(tokens, gumbel(adj, self.temperature, self.rng))

    def preview(
        self, block: Sequence[int], adj: LogitAdjustment, routing: Routing | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        raise ValueError("sampled previews are not supported: one noise vector would serve every row")
