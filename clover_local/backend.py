"""The backend contract: what a model runtime offers the decoding loops, and nothing above it.

A backend runs passes; the loops and the policy (`loops`, `speculative`, `policy`) decide what to
run. This module holds the pass protocols (`Backend`, `FusedBackend`, `SpeculativeBackend`), the
logit adjustment a pass applies and its numpy definition (`pick`, `distribution`: what the graph
computes), and the verification result. Backends (`llama/`, `reference/`) import only this (and
the model description); the loops import it too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class LogitAdjustment:
    """`l' = max(l,0) * pos_scale + min(l,0) * neg_scale + bias` over a vocabulary, kept as its entries.

    `ids` are the (unique) token ids where it differs from the identity and `values` [len(ids), 3] their
    (pos_scale, neg_scale, bias); every other token keeps its logit exactly. Penalties, ramps and the
    mask token touch a few ids, so a pass carries O(response) numbers, never O(vocabulary).
    """

    ids: np.ndarray  # [n] token ids
    values: np.ndarray  # [n, 3] float32: pos_scale, neg_scale, bias
    vocab_size: int

    @classmethod
    def identity(cls, vocab_size: int) -> LogitAdjustment:
        return cls(np.zeros(0, dtype=np.int64), np.zeros((0, 3), dtype=np.float32), vocab_size)

    @classmethod
    def from_vectors(cls, pos_scale: np.ndarray, neg_scale: np.ndarray, bias: np.ndarray) -> LogitAdjustment:
        """The adjustment of per-vocab vectors (entries where any of them is not the identity's)."""
        dense = np.stack([pos_scale, neg_scale, bias], axis=1).astype(np.float32)
        ids = np.flatnonzero((dense[:, 0] != 1) | (dense[:, 1] != 1) | (dense[:, 2] != 0))
        return cls(ids, dense[ids], len(dense))

    def vectors(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-vocab (pos_scale, neg_scale, bias) vectors."""
        pos, neg = np.ones(self.vocab_size, dtype=np.float32), np.ones(self.vocab_size, dtype=np.float32)
        bias = np.zeros(self.vocab_size, dtype=np.float32)
        pos[self.ids], neg[self.ids], bias[self.ids] = self.values.T
        return pos, neg, bias

    @property
    def pos_scale(self) -> np.ndarray:
        return self.vectors()[0]

    @property
    def neg_scale(self) -> np.ndarray:
        return self.vectors()[1]

    @property
    def bias(self) -> np.ndarray:
        return self.vectors()[2]


def adjust_logits(logits: np.ndarray, adj: LogitAdjustment) -> np.ndarray:
    """Apply the adjustment to logits [..., V] at its entries (the same formula runs in the graph)."""
    out = np.array(logits, copy=True)
    at = out[..., adj.ids]
    pos, neg, bias = adj.values.T
    out[..., adj.ids] = np.maximum(at, 0) * pos + np.minimum(at, 0) * neg + bias
    return out


@dataclass(frozen=True)
class Sampler:
    """How a pass turns a row's adjusted logits into its token: the argmax at temperature 0, else a draw
    from `distribution`, cut as llama.cpp's sampler chain (and so `llama_cpp.Llama`) cuts them.

    `top_k` keeps the k most likely tokens (0: all), `top_p` then the fewest of those whose probability
    reaches p (1: all), `min_p` then those at least min_p times as likely as the most likely (0: all);
    the temperature divides the logits of what is left. A pass gets one with its uniforms (`Draw`).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    def __str__(self) -> str:
        """What a result reports (`clover.sampling`): "greedy", or the temperature and the cuts in effect."""
        if self.greedy:
            return "greedy"
        parts = [f"temperature {self.temperature}"]
        parts += [f"top_k {self.top_k}"] if self.top_k > 0 else []
        parts += [f"top_p {self.top_p}"] if self.top_p < 1 else []
        parts += [f"min_p {self.min_p}"] if self.min_p > 0 else []
        return ", ".join(parts)


GREEDY = Sampler()


@dataclass(frozen=True)
class Draw:
    """A sampled pass: its sampler and one uniform in [0, 1) per head row, the only random numbers that
    reach a backend (so a pass is a function of its inputs, and a seed reproduces a request)."""

    sampler: Sampler
    uniforms: np.ndarray  # [head rows] float64


def split_draw(draw: Draw | None) -> tuple[Draw | None, Draw | None]:
    """A fused pass's draw as its commit's (the first head row) and its preview's (the rest)."""
    if draw is None:
        return None, None
    return Draw(draw.sampler, draw.uniforms[:1]), Draw(draw.sampler, draw.uniforms[1:])


def confidence(adjusted: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """A row's confidence in its token, [T] (docs/model.md 2.1 [ours]; the graph's `build_clover_confidence`).

    The token's probability under the adjusted logits [T, V] over the whole vocabulary at temperature 1,
    however it was chosen: what the fill threshold compares, the greedy pick's probability, and for a
    sampled token the model's own certainty of it, not its probability under the cut, tempered
    distribution it was drawn from (which a temperature near 0 or top_k 1 would push to 1 everywhere).
    """
    top = adjusted.max(axis=-1, keepdims=True)
    own = np.take_along_axis(adjusted, np.asarray(tokens)[:, None], axis=-1)
    return (np.exp(own - top) / np.exp(adjusted - top).sum(axis=-1, keepdims=True))[:, 0]


def pick(logits: np.ndarray, adj: LogitAdjustment) -> tuple[np.ndarray, np.ndarray]:
    """Per row of logits [T, V]: the argmax token after adjustment and its softmax probability."""
    adjusted = adjust_logits(np.asarray(logits, dtype=np.float64), adj)
    tokens = adjusted.argmax(axis=-1)
    return tokens, confidence(adjusted, tokens)


def kept(adjusted: np.ndarray, sampler: Sampler) -> np.ndarray:
    """The tokens a sampler's cut keeps, a mask like `adjusted` [..., V] (the graph's `build_clover_cut`).

    llama.cpp's order: the top_k most likely, then of those the fewest whose probability (softmax over
    them at temperature 1) reaches top_p, then those whose logit is at least the maximum + log(min_p);
    at least the most likely token. The cut is the lowest kept logit: tokens tied with it stay too.
    """
    vocab = adjusted.shape[-1]
    k = sampler.top_k if 0 < sampler.top_k < vocab else vocab
    if k == vocab and sampler.top_p >= 1:
        if sampler.min_p <= 0:
            return np.ones(adjusted.shape, dtype=bool)
        return adjusted >= adjusted.max(axis=-1, keepdims=True) + np.log(sampler.min_p)
    ranked = -np.sort(-adjusted, axis=-1)[..., :k]  # descending
    n = np.full(adjusted.shape[:-1], k)
    if sampler.top_p < 1:
        e = np.exp(ranked - ranked[..., :1])
        before = np.cumsum(e, axis=-1) - e
        n = np.minimum(n, (before < sampler.top_p * e.sum(axis=-1, keepdims=True)).sum(axis=-1))
    if sampler.min_p > 0:
        n = np.minimum(n, (ranked >= ranked[..., :1] + np.log(sampler.min_p)).sum(axis=-1))
    cut = np.take_along_axis(ranked, np.clip(n, 1, k)[..., None] - 1, axis=-1)
    return adjusted >= cut


def distribution(logits: np.ndarray, adj: LogitAdjustment, sampler: Sampler) -> np.ndarray:
    """Sampling distributions [..., V]: the adjusted logits cut as the sampler says (`kept`), divided by
    its temperature (> 0), softmax. What every sampled mode draws from; greedy is its limit at 0.
    """
    adjusted = adjust_logits(np.asarray(logits, dtype=np.float64), adj)
    scaled = np.where(kept(adjusted, sampler), adjusted, -np.inf) / sampler.temperature
    e = np.exp(scaled - scaled.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def sample(logits: np.ndarray, adj: LogitAdjustment, draw: Draw) -> tuple[np.ndarray, np.ndarray]:
    """Per row of logits [T, V]: a token drawn from `distribution` by inverse CDF at the row's uniform,
    over the vocabulary in id order (the graph's `build_clover_sample`), and its `confidence`."""
    adjusted = adjust_logits(np.asarray(logits, dtype=np.float64), adj)
    cdf = np.cumsum(distribution(logits, adj, draw.sampler), axis=-1)
    at = (cdf <= (np.asarray(draw.uniforms) * cdf[:, -1])[:, None]).sum(axis=-1)
    tokens = np.minimum(at, (cdf < cdf[:, -1:]).sum(axis=-1))  # never past the last token with weight
    return tokens, confidence(adjusted, tokens)


def head(logits: np.ndarray, adj: LogitAdjustment, draw: Draw | None) -> tuple[np.ndarray, np.ndarray]:
    """What a pass's head returns per row of logits [T, V]: `pick`, or `sample` when the pass draws."""
    return pick(logits, adj) if draw is None else sample(logits, adj, draw)


@dataclass(frozen=True)
class Capabilities:
    """What a backend offers beyond `Backend`'s three passes: declared by the backend, never probed.

    `fused`: `FusedBackend.commit_and_preview`. `speculative`: `SpeculativeBackend`'s
    `verify_and_draft` and `rollback`, for at most `max_verify_rows` causal rows per verification
    (None: any number). `counts_bytes`: `bytes_read` / `bytes_written` count what passes move
    between host and model.
    """

    fused: bool = False
    speculative: bool = False
    max_verify_rows: int | None = None
    counts_bytes: bool = False


@dataclass(frozen=True)
class Routing:
    """How a preview routes its MoE layers (docs/model.md 2.4), given with every pass that previews.

    Within the block's expert coreset when `coreset`, keeping `top_p` of the block's router mass;
    commits always route unrestricted. A pass given None routes as the model file says
    (`Backend.default_routing`); nothing a request chooses is ever stored on a backend.
    """

    coreset: bool = True
    top_p: float = 0.9


class Backend(Protocol):
    """What a model runtime must offer the loop; every answer is O(block) numbers.

    Each method runs one pass and returns, per head row, the argmax token after the logit
    adjustment and its probability (`pick`), or with a `Draw` (one uniform per head row, in row
    order) a token drawn by its sampler and its confidence (`sample`). Rows are the pass's input
    positions; row i's hidden state predicts position i + 1 (the loop does the alignment,
    `aligned_candidates`).
    """

    vocab_size: int
    capabilities: Capabilities
    default_routing: Routing  # the model file's (`clover-moe.diffusion.coreset_*`, config.json)

    def prefill(
        self, tokens: Sequence[int], adj: LogitAdjustment, draw: Draw | None = None
    ) -> tuple[int, float]:
        """Start a new sequence with a causal pass over `tokens`; the last row's pick (one head row)."""
        ...

    def preview(
        self,
        block: Sequence[int],
        adj: LogitAdjustment,
        routing: Routing | None = None,
        draw: Draw | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Denoising pass over the block after the committed prefix, state untouched; all rows' picks."""
        ...

    def commit(
        self, tokens: Sequence[int], adj: LogitAdjustment, draw: Draw | None = None
    ) -> tuple[int, float]:
        """Causal pass appending `tokens` to the sequence; the last row's pick (one head row)."""
        ...

    def close(self) -> None:
        """Free what the backend holds (a model, a context); it is unusable afterwards."""
        ...


class FusedBackend(Backend, Protocol):
    """A `Backend` that can also run a block's commit and the next block's first preview as one pass.

    Every block ends with a commit, and unless the request ends there, the next block starts with a
    preview over the state that commit leaves, under the same adjustment (nothing new is resolved in
    between). Fusing them runs one graph per block instead of two (the passes are small, so a
    graph's fixed cost, its dispatch and the layers' weight reads, is much of a pass's cost).
    `loops.diffusion_loop` uses it when the backend declares it (`Capabilities.fused`); the trace is
    the unfused loop's.
    """

    def commit_and_preview(
        self,
        tokens: Sequence[int],
        adj: LogitAdjustment,
        block: Sequence[int],
        routing: Routing | None = None,
        draw: Draw | None = None,
    ) -> tuple[tuple[int, float], tuple[np.ndarray, np.ndarray]]:
        """`commit(tokens, adj)`, then `preview(block, adj, routing)` over the state it leaves; head
        rows: the commit's last row, then the block's (1 + len(block) uniforms)."""
        ...


@dataclass(frozen=True)
class RowAdjustments:
    """Per-row logit adjustments of a causal pass: one shared base plus, per row, values at a few ids.

    Row j predicts the token that follows rows[:j+1], so its penalties and ramps count the
    response plus those rows (as one `ar` step each would). Against the base (the response alone)
    that changes only the rows' own tokens, the stop tokens (stop ramp) and `</think>` (think
    ramp): `ids` holds those, so a graph uploads the base once and [rows, len(ids)] numbers more.
    """

    base: LogitAdjustment
    ids: np.ndarray  # [K] token ids whose values differ between rows
    pos_scale: np.ndarray  # [rows, K]
    neg_scale: np.ndarray  # [rows, K]
    bias: np.ndarray  # [rows, K]

    @classmethod
    def constant(cls, adj: LogitAdjustment, n_rows: int) -> RowAdjustments:
        """The same adjustment for every row (a prompt row: nothing it appends counts)."""
        empty = np.zeros((n_rows, 0), dtype=np.float32)
        return cls(adj, np.zeros(0, dtype=np.int64), empty, empty, empty)

    def __len__(self) -> int:
        return self.bias.shape[0]

    def entries(self) -> tuple[np.ndarray, np.ndarray]:
        """Every row's adjustment entries, the same ids for all rows: ids [n] and values [rows, n, 3]
        (the base's entries outside `ids`, then `ids` with the row's values)."""
        keep = ~np.isin(self.base.ids, self.ids)
        ids = np.concatenate([self.base.ids[keep], self.ids])
        values = np.empty((len(self), len(ids), 3), dtype=np.float32)
        values[:, : keep.sum()] = self.base.values[keep]
        values[:, keep.sum() :] = np.stack([self.pos_scale, self.neg_scale, self.bias], axis=2)
        return ids, values

    def row(self, j: int) -> LogitAdjustment:
        """Row j's full adjustment."""
        ids, values = self.entries()
        return LogitAdjustment(ids, values[j], self.base.vocab_size)

    def last(self) -> LogitAdjustment:
        """The adjustment of the preview rows: the last causal row's (the base when there is none)."""
        return self.row(len(self) - 1) if len(self) else self.base


@dataclass(frozen=True)
class Verification:
    """What one speculative pass returns: O(block) numbers greedy, full rows only when sampling.

    `tokens` / `probs`: per causal row the argmax after that row's adjustment and its probability
    (`pick`); row j predicts position start + j + 1. `draft_tokens` / `draft_probs`: the
    same for the preview rows under `RowAdjustments.last()`; row i predicts position
    start + len(causal rows) + i + 1. With a sampler, `dist` / `draft_dist` hold the rows'
    sampling distributions (`distribution`), else None.
    """

    tokens: np.ndarray
    probs: np.ndarray
    draft_tokens: np.ndarray
    draft_probs: np.ndarray
    dist: np.ndarray | None = None  # [causal rows, V]
    draft_dist: np.ndarray | None = None  # [preview rows, V]


class SpeculativeBackend(Backend, Protocol):
    """A `Backend` that can verify a draft and draft the next block in one pass, and roll back."""

    def verify_and_draft(
        self,
        tokens: Sequence[int],
        adjs: RowAdjustments,
        preview: Sequence[int],
        sampler: Sampler = GREEDY,
        routing: Routing | None = None,
    ) -> Verification:
        """One pass: `tokens` run causally after the sequence (appended, with a recurrent-state
        snapshot after every row), then `preview` (mask ids, or draft tokens when refining) runs as
        a denoising block right after them over the state they produce, writing nothing.

        `tokens` may be empty (a plain preview) and `preview` may be empty (a plain commit). Causal
        row j uses `adjs.row(j)`, preview rows `adjs.last()`; a sampler (not greedy) asks for the
        distributions too: the acceptance rule weighs p against q over the whole vocabulary, so
        this pass reads full logits where the others draw in the graph (`Draw`); `routing` is the
        preview rows' (None: `default_routing`).
        """
        ...

    def rollback(self, n_keep: int) -> None:
        """Truncate the sequence to its first `n_keep` positions: 0 (empty), or anywhere from the
        start of the last `verify_and_draft`'s causal rows to the end (K/V cut, GDN conv and
        recurrent state restored from that pass's snapshot)."""
        ...
