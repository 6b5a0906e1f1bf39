"""The numpy reference as a `decode.Backend`: the oracle every other backend's trace is compared with."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..policy import LogitAdjustment, pick
from .model import ReferenceModel, State


class NumpyBackend:
    """One sequence on a `ReferenceModel`; `state` is the committed prefix."""

    def __init__(self, model: ReferenceModel):
        self.model = model
        self.vocab_size = model.cfg.vocab_size
        self.state: State = model.new_state()

    def prefill(self, tokens: Sequence[int], adj: LogitAdjustment) -> tuple[int, float]:
        self.state = self.model.new_state()
        return self.commit(tokens, adj)

    def preview(self, block: Sequence[int], adj: LogitAdjustment) -> tuple[np.ndarray, np.ndarray]:
        return pick(self.model.preview(block, self.state), adj)

    def commit(self, tokens: Sequence[int], adj: LogitAdjustment) -> tuple[int, float]:
        tok, prob = pick(self.model.commit(tokens, self.state)[-1:], adj)
        return int(tok[0]), float(prob[0])
