"""The decoding policy, one for every backend: fill rule, logit adjustment, penalties, ramps,
stops and the length limit (docs/model.md 2.1, 2.5; docs/design.md "Decoding").

A backend only runs passes and returns, per row, the argmax token (or a token its sampler draws at
the uniforms drawn here, `Draws`) and its probability after the logit adjustment built here (`pick`
and `sample` are that contract in numpy). Every decision about which positions to fill, when to
stop and what to penalise is taken in this module.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .backend import GREEDY, Draw, LogitAdjustment, Routing, RowAdjustments, Sampler
from .model.config import CONTEXT_LIMIT, GenerationDefaults
from .model.decoding_parameters import PARAMETERS, DecodingParameters


class RequestTooLong(ValueError):
    """A request cannot fit the model's context (prompt + room to finish the last block)."""


@dataclass(frozen=True, kw_only=True)
class DecodingSettings(DecodingParameters):
    """Everything the policy needs for one request: the decoding parameters (`GenerationDefaults`
    plus the request's overrides) and what the model and the request add.

    The previews' coreset settings are None where nobody chose them (settings made without the
    model's defaults): the passes then route as the model file says (`Backend.default_routing`).
    """

    coreset_enabled: bool | None = None
    coreset_top_p: float | None = None
    mask_token_id: int
    stop_token_ids: tuple[int, ...] = ()
    think_start_id: int | None = None  # `<think>` / `</think>` ids; None: no think ramp
    think_end_id: int | None = None
    context_limit: int = CONTEXT_LIMIT
    sampler: Sampler = GREEDY  # how every pass picks its rows' tokens
    seed: int | None = None  # the sampler's seed; None: a fresh one per request

    def __post_init__(self) -> None:
        if (self.coreset_enabled is None) != (self.coreset_top_p is None):
            raise ValueError("coreset_enabled and coreset_top_p are set together (or both left None)")

    @property
    def routing(self) -> Routing | None:
        """The previews' MoE routing; None: the model file's."""
        if self.coreset_enabled is None or self.coreset_top_p is None:
            return None
        return Routing(self.coreset_enabled, self.coreset_top_p)

    @classmethod
    def from_defaults(
        cls, gen: GenerationDefaults, mask_token_id: int, **overrides: object
    ) -> DecodingSettings:
        """Settings from a checkpoint's generation defaults; `overrides` win (None means keep)."""
        kw: dict[str, object] = {p.name: getattr(gen, p.name) for p in PARAMETERS}
        kw.update(mask_token_id=mask_token_id, stop_token_ids=gen.eos_token_ids)
        kw.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**kw)


class Draws:
    """A request's randomness: per sampled pass one uniform per head row, from one generator seeded
    with the request's seed and drawn in pass order, so a seed reproduces a request on every
    backend (docs/model.md 2.1). Greedy settings draw nothing (every pass gets None)."""

    def __init__(self, s: DecodingSettings):
        self.sampler = s.sampler
        self.rng = None if s.sampler.greedy else np.random.default_rng(s.seed)

    def __call__(self, rows: int) -> Draw | None:
        """The draw of a pass with `rows` head rows."""
        return None if self.rng is None else Draw(self.sampler, self.rng.random(rows))


def check_length(prompt_len: int, s: DecodingSettings) -> None:
    """Reject a request whose prompt plus whole blocks for the budget exceed the context (2.1 [vendor]).

    Each block is `block_size` tokens wide even when the budget ends inside it, so the room needed
    is the budget rounded up to whole blocks. Called before any pass runs.
    """
    if prompt_len < 1:
        raise ValueError("the prompt is empty: block diffusion needs at least one prompt token")
    room = math.ceil(s.max_new_tokens / s.block_size) * s.block_size
    if prompt_len + room > s.context_limit:
        fits = max(0, (s.context_limit - prompt_len) // s.block_size * s.block_size)
        raise RequestTooLong(
            f"request too long: prompt {prompt_len} tokens + {room} for {s.max_new_tokens} new tokens "
            f"in blocks of {s.block_size} = {prompt_len + room} > the context of {s.context_limit} tokens; "
            f"shorten the prompt, lower max_tokens (-n) to {fits} or raise the context (-c / n_ctx)"
        )


def resolved_response(response: Sequence[int], block: Sequence[int], mask_token_id: int) -> list[int]:
    """Response tokens the penalties and ramps count (docs/model.md 2.5 [ours]).

    The committed response plus the current block's resolved positions (in position order);
    the prompt never counts. One count serves every row of a pass.
    """
    return [*response, *(t for t in block if t != mask_token_id)]


def ramp(n_generated: int, budget: int, start: float, peak: float) -> float:
    """A ramp's bias: 0 up to start x budget tokens, then linear to `peak` at the budget.

    docs/model.md 2.5 [ours]; the budget is max_new_tokens.
    """
    begin = start * budget
    if peak == 0 or n_generated <= begin:
        return 0.0
    if n_generated >= budget:
        return peak
    return peak * (n_generated - begin) / (budget - begin)


def thinking(prompt: Sequence[int], response: Sequence[int], s: DecodingSettings) -> bool:
    """Whether the text ends inside a `<think>` section (the last `<think>` is after any `</think>`)."""
    if s.think_start_id is None or s.think_end_id is None:
        return False
    for seq in (response, prompt):  # backwards: the chat template puts `<think>` at the prompt's end
        for t in reversed(seq):
            if t in (s.think_start_id, s.think_end_id):
                return t == s.think_start_id
    return False


def thinking_after(inside: bool, token: int, s: DecodingSettings) -> bool:
    """`thinking` after one more token, from its value before (the same rule, one step)."""
    if s.think_start_id is None or s.think_end_id is None:
        return False
    if token in (s.think_start_id, s.think_end_id):
        return token == s.think_start_id
    return inside


def adjustment(
    s: DecodingSettings, vocab_size: int, prompt: Sequence[int], response: Sequence[int]
) -> LogitAdjustment:
    """The logit adjustment of a pass, from the response resolved so far (`resolved_response`).

    Repetition penalty p on a seen token: pos_scale 1/p, neg_scale p. Presence and frequency
    penalties subtract from the bias; the stop ramp adds to the stop tokens' bias, the think ramp
    to `</think>`'s while thinking, both growing with the response length toward max_new_tokens.
    The mask token is never a candidate (bias -inf): filling a position with it would never end.
    """
    return _in_vocab(*_entries(s, prompt, response), vocab_size)


class RunningAdjustment:
    """`adjustment(s, V, prompt, response)` for a response that grows one token at a time (the `ar`
    loop): the entries before the ramps are kept sorted and updated in place per token, so a step
    costs a few small numpy calls whatever the response's length, not a recount of it (issue 11:
    the loop's host time per token)."""

    def __init__(self, s: DecodingSettings, vocab_size: int, prompt: Sequence[int]):
        self.s, self.vocab_size = s, vocab_size
        self.counts: dict[int, int] = {}
        self.n_generated = 0
        self.inside = thinking(prompt, [], s)
        ids, values = _penalty_entries(s, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
        # sorted ids (a list, for bisect) and the first len(ids) rows of the buffers
        self._sorted = [int(t) for t in ids]
        self._ids_buf = np.resize(ids, max(64, 2 * len(ids)))
        self._values_buf = np.resize(values, (len(self._ids_buf), 3))
        self._ids = ids  # the current ids as an array of their own (replaced when an id is added)
        self._rows: dict[int, tuple[float, float, float]] = {}  # the entry of a token seen n times
        # the last adjustment and what it was computed from: with neutral penalties and no ramp under
        # way a step's adjustment is the previous one (the loop's host time per token, on every backend)
        self._last: tuple[tuple, LogitAdjustment] | None = None

    def append(self, token: int) -> None:
        n = self.counts[token] = self.counts.get(token, 0) + 1
        self.n_generated += 1
        self.inside = thinking_after(self.inside, token, self.s)
        if penalised(self.s):
            self._count(token, n)

    def _count(self, token: int, n: int) -> None:
        """`_penalty_entries` after the n-th occurrence of `token`: its row, inserted when new."""
        if n not in self._rows:
            self._rows[n] = _seen_row(self.s, n)
        row = self._rows[n]
        if token == self.s.mask_token_id:
            row = (row[0], row[1], -np.inf)
        i, m = bisect.bisect_left(self._sorted, token), len(self._sorted)
        if i < m and self._sorted[i] == token:
            self._values_buf[i] = row
            return
        if m == len(self._ids_buf):
            self._ids_buf = np.resize(self._ids_buf, 2 * m)
            self._values_buf = np.resize(self._values_buf, (2 * m, 3))
        self._sorted.insert(i, token)
        self._ids_buf[i + 1 : m + 1] = self._ids_buf[i:m]
        self._values_buf[i + 1 : m + 1] = self._values_buf[i:m]
        self._ids_buf[i], self._values_buf[i] = token, row
        self._ids = self._ids_buf[: m + 1].copy()

    def adjustment(self) -> LogitAdjustment:
        s = self.s
        key = (
            self.n_generated if penalised(s) else None,
            ramp(self.n_generated, s.max_new_tokens, s.stop_ramp_start, s.stop_ramp_max),
            self.inside and ramp(self.n_generated, s.max_new_tokens, s.think_ramp_start, s.think_ramp_max),
        )
        if self._last is None or self._last[0] != key:
            values = self._values_buf[: len(self._ids)].copy()  # the buffer changes with every token
            values = _ramped(s, self._ids, values, self.n_generated, self.inside)
            self._last = key, _in_vocab(self._ids, values, self.vocab_size)
        return self._last[1]


def _seen_row(s: DecodingSettings, n: int) -> tuple[float, float, float]:
    """The entry of a token seen n times, in the float32 arithmetic of `_penalty_entries` (equal bit
    for bit)."""
    f32 = np.float32
    bias = f32(0) - (f32(s.presence_penalty) + f32(s.frequency_penalty) * f32(n))
    return float(f32(1.0 / s.repetition_penalty)), float(f32(s.repetition_penalty)), float(bias)


def penalised(s: DecodingSettings) -> bool:
    """Whether the penalties change the logits of seen tokens (else their entries are the identity)."""
    return s.repetition_penalty != 1.0 or s.presence_penalty != 0.0 or s.frequency_penalty != 0.0


def _in_vocab(ids: np.ndarray, values: np.ndarray, vocab_size: int) -> LogitAdjustment:
    """The adjustment of sorted entries, without ids outside the vocabulary (e.g. an absent mask id)."""
    if len(ids) and (ids[0] < 0 or ids[-1] >= vocab_size):
        inside = (ids >= 0) & (ids < vocab_size)
        ids, values = ids[inside], values[inside]
    return LogitAdjustment(ids, values, vocab_size)


def adjustment_rows(
    s: DecodingSettings, ids: np.ndarray, prompt: Sequence[int], response: Sequence[int], rows: Sequence[int]
) -> np.ndarray:
    """`adjustment(s, V, prompt, [*response, *rows[:j + 1]])` at the sorted token `ids` only, for
    every row j: [len(rows), len(ids), 3] values (pos_scale, neg_scale, bias), counting the response
    once, O(len(response) + len(rows) x len(ids)) whatever the vocabulary. `ids` must hold every row
    token. Per-row adjustments differ from a shared base only at a few ids (`backend.RowAdjustments`,
    `row_adjustments`).
    """
    ids = np.asarray(ids, dtype=np.int64)
    seen, n = np.unique(np.asarray(response, dtype=np.int64), return_counts=True)
    at = np.searchsorted(seen, ids).clip(max=max(len(seen) - 1, 0))
    counts = np.where(seen[at] == ids, n[at], 0) if len(seen) else np.zeros(len(ids), dtype=np.int64)
    inside = thinking(prompt, response, s)
    out = np.empty((len(rows), len(ids), 3), dtype=np.float32)
    for j, token in enumerate(rows):
        counts[np.searchsorted(ids, token)] += 1
        inside = thinking_after(inside, token, s)
        present = counts > 0
        entries = _entries_of_counts(s, ids[present], counts[present], len(response) + j + 1, inside)
        out[j] = _restrict(ids, *entries)
    return out


def row_adjustments(
    s: DecodingSettings,
    vocab_size: int,
    prompt: Sequence[int],
    response: Sequence[int],
    rows: Sequence[int],
) -> RowAdjustments:
    """Adjustments of causal rows that append `rows` (response tokens) after `response`."""
    touched = {*rows, *s.stop_token_ids, *([] if s.think_end_id is None else [s.think_end_id])}
    ids = np.array(sorted(t for t in touched if 0 <= t < vocab_size), dtype=np.int64)
    values = adjustment_rows(s, ids, prompt, response, rows)
    return RowAdjustments(adjustment(s, vocab_size, prompt, response), ids, *values.transpose(2, 0, 1))


def _restrict(ids: np.ndarray, entry_ids: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The entries' values at the sorted `ids`, [len(ids), 3] (the identity's where an id has no entry)."""
    out = _identity_values(len(ids))
    if not len(ids):
        return out
    at = np.searchsorted(ids, entry_ids).clip(max=len(ids) - 1)
    found = ids[at] == entry_ids
    out[at[found]] = values[found]
    return out


def _identity_values(n: int) -> np.ndarray:
    """[n, 3] values of the identity: pos_scale 1, neg_scale 1, bias 0."""
    out = np.empty((n, 3), dtype=np.float32)
    out[:] = (1.0, 1.0, 0.0)
    return out


def _entries(
    s: DecodingSettings, prompt: Sequence[int], response: Sequence[int]
) -> tuple[np.ndarray, np.ndarray]:
    """`adjustment`'s values where they differ from the identity: sorted token ids and their
    (pos_scale, neg_scale, bias), O(len(response)) whatever the vocabulary."""
    seen, n = np.unique(np.asarray(response, dtype=np.int64), return_counts=True)
    return _entries_of_counts(s, seen, n, len(response), thinking(prompt, response, s))


def _entries_of_counts(
    s: DecodingSettings, seen: np.ndarray, n: np.ndarray, n_generated: int, inside_think: bool
) -> tuple[np.ndarray, np.ndarray]:
    """The adjustment's formula from the response's token counts (`seen` sorted, `n` their counts),
    its length and whether it ends inside a think section: sorted ids and their [n, 3] values.
    Seen tokens get no entry when the penalties leave them as they are."""
    ids, values = _penalty_entries(s, seen, n)
    return ids, _ramped(s, ids, values, n_generated, inside_think)


def _penalty_entries(s: DecodingSettings, seen: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The entries before the ramps: the seen tokens' penalties, the special tokens' rows, the
    mask's -inf bias."""
    if not penalised(s):
        seen, n = seen[:0], n[:0]
    special = [s.mask_token_id, *s.stop_token_ids, *([] if s.think_end_id is None else [s.think_end_id])]
    ids = np.concatenate([seen, special]).astype(np.int64)
    ids.sort()
    ids = ids[np.concatenate([[True], ids[1:] != ids[:-1]])]  # the sorted union
    values = _identity_values(len(ids))
    pos_scale, neg_scale, bias = values.T
    at = np.searchsorted(ids, seen)
    pos_scale[at] = 1.0 / s.repetition_penalty
    neg_scale[at] = s.repetition_penalty
    bias[at] -= s.presence_penalty + s.frequency_penalty * n.astype(np.float32)
    bias[np.searchsorted(ids, s.mask_token_id)] = -np.inf  # -inf absorbs every other term
    return ids, values


def _ramped(
    s: DecodingSettings, ids: np.ndarray, values: np.ndarray, n_generated: int, inside_think: bool
) -> np.ndarray:
    """`values` (changed in place) with the stop ramp on the stop tokens and, while thinking, the
    think ramp on `</think>`, at `n_generated` tokens."""
    bias = values[:, 2]
    stop_bias = ramp(n_generated, s.max_new_tokens, s.stop_ramp_start, s.stop_ramp_max)
    if stop_bias and s.stop_token_ids:
        bias[np.searchsorted(ids, s.stop_token_ids)] += stop_bias
    if s.think_end_id is not None and inside_think:
        bias[np.searchsorted(ids, s.think_end_id)] += ramp(
            n_generated, s.max_new_tokens, s.think_ramp_start, s.think_ramp_max
        )
    return values


def block_extent(block: Sequence[int], s: DecodingSettings, remaining: int) -> tuple[int, bool]:
    """Stop rule (docs/model.md 2.1): how many leading block positions the response needs, and whether
    a stop token ends it.

    The extent is the block, cut to the remaining budget, cut again just after the first resolved
    stop token. The block is finished once every position inside the extent is resolved; the
    positions past it are discarded.
    """
    end = min(len(block), remaining)
    stops = set(s.stop_token_ids)
    for i in range(end):
        if block[i] in stops:
            return i + 1, True
    return end, False


def fill_positions(probs: np.ndarray, masked: np.ndarray, threshold: float) -> np.ndarray:
    """Fill rule (docs/model.md 2.1 [vendor]): the masked positions whose candidate probability is at
    least `threshold`; if none, the single most confident one (the lowest position on a tie).

    `masked` flags the positions still open (inside the block extent). Returns sorted positions.
    """
    open_pos = np.flatnonzero(masked)
    if open_pos.size == 0:
        return open_pos
    sure = open_pos[probs[open_pos] >= threshold]
    return sure if sure.size else open_pos[[int(np.argmax(probs[open_pos]))]]
