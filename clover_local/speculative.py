"""Self-speculative decoding (docs/model.md 2.5): the preview drafts, the causal pass verifies, in one pass.

Terms. The backend's sequence holds n committed positions. The *pending* token is the next
response token, already decided (the causal pick at row n-1, or a sample of it) but not yet in the
state. A *draft* d_1..d_k proposes positions n+1..n+k, k <= block_size - 1, so that pending token
and draft fill at most one block.

One iteration is one backend call (`SpeculativeBackend.verify_and_draft`): the rows
[pending, d_1..d_k] run causally at positions n..n+k (K/V appended, GDN state advanced), and in the
same pass a preview of `block_size` mask rows runs at positions n+k+1.. over the state those rows
produce. Alignment (logit shift 1): causal row j predicts position n+j+1, so d_{j+1} is checked
against row j; preview row i predicts position n+k+2+i, the bonus token filling n+k+1.

Acceptance: greedy keeps the longest draft prefix equal to the causal picks; sampled keeps d_j
with probability min(1, p(d_j)/q(d_j)) and on the first rejection samples from
normalize(max(0, p - q)) (Leviathan et al. 2023), so the output has exactly `ar`'s distribution.
The causal pick (or sample) after the last kept row is the bonus: the next pending token. So an
iteration appends 1 + accepted tokens to the response; with an empty draft it is one `ar` step.

Partial acceptance (a < k): the backend rolls back to n+1+a positions. The preview of that pass
ran over a state holding the rejected rows, so it is discarded and the next iteration verifies
the bonus alone and drafts in the same pass: no extra pass and never a stale draft.

Shadow check: until a drafted token has been accepted (at the start, and after the adaptive
length fell to 0 and probes again: `DraftLength.probing`) a preview is not verified at once. The
next iteration is a plain `ar` step, whose pick is compared with the preview's first token; only if
they agree does the iteration after it verify the rest. The preview's tokens are proposals made
before that step, and a proposal may come from anywhere: verification keeps the output exact
(greedy) or `ar`-distributed (sampled; the rows were drawn independently of the check). A draft
that would have failed costs no verification pass and no rollback.

Stops and budget: one policy (`policy`) for every mode. Row j's adjustment counts the response
plus rows[:j+1] (`RowAdjustments`), exactly as `loops.ar_loop`'s step would; a draft is cut
after its first stop token and to the remaining budget, and every returned token is committed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from . import policy
from .backend import RowAdjustments, SpeculativeBackend, Verification
from .loops import Result
from .policy import DecodingSettings


@dataclass(frozen=True)
class SpeculativeSettings:
    """Draft controls of the `speculative` mode (the policy, sampler and seed included, stays
    `DecodingSettings`)."""

    draft_len: int | None = None  # most drafted tokens per iteration; None: block_size - 1
    refinements: int = 0  # preview passes refining a draft before it is verified; 0: the fused pass only
    draft_threshold: float = 0.0  # cut a draft before its first row less confident than this
    adaptive: bool = True  # adapt the draft length to the acceptance (`DraftLength`)
    probe_after: int = 4  # adaptive: plain `ar` steps before drafting again once the length hit 0
    first_draft: int | None = None  # adaptive: the first draft's length (None: the limit), doubled from there

    def draft_limit(self, s: DecodingSettings) -> int:
        """The draft length limit, checked: pending token + draft fill at most one block."""
        n = s.block_size - 1 if self.draft_len is None else self.draft_len
        if not 0 <= n <= s.block_size - 1:
            raise ValueError(f"draft_len {n} outside 0..{s.block_size - 1} (block_size - 1)")
        if self.refinements < 0 or self.probe_after < 1:
            raise ValueError("refinements must be >= 0, probe_after >= 1")
        if not 0 <= self.draft_threshold <= 1:  # NaN too
            raise ValueError(f"draft_threshold must be a number from 0 to 1, got {self.draft_threshold!r}")
        if self.first_draft is not None and self.first_draft < 0:
            raise ValueError(f"first_draft must be >= 0, got {self.first_draft}")
        return n


@dataclass
class DraftLength:
    """Adaptive draft length. After a verification of k >= 1 drafted tokens with a accepted:

    - a < k: the length drops to a, the run that agreed. The pass's preview saw the rejected
      rows, so the next iteration verifies the bonus token alone: every cut draft costs an
      iteration that yields one token.
    - a == k: after `patience` full acceptances in a row the length doubles (at most `limit`).
      A doubled draft that is cut doubles the patience (up to `MAX_PATIENCE`), one that is kept
      resets it to 1. Under a steady acceptance the length settles there and longer drafts are
      tried ever more rarely; a run of agreement still grows it as fast as slow start.

    At 0 the iterations are plain `ar` steps without a preview; after `probe_after` of them the
    length goes back to 1 to measure again, and every further check in a row that finds nothing
    accepted multiplies that wait by `PROBE_BACKOFF` (up to `MAX_PROBE_GAP`). The start counts as
    one miss (nothing has agreed yet), so a draft that never agrees is checked at the start (the
    prompt's pass), after 32 steps, then every 256, while a miss after an accepted draft waits 4.
    It starts at `start` (default: `limit`); without `adaptive` it stays at `limit`.

    `probing`: no drafted token has been accepted since the start or since the length fell to 0.
    Then a preview is not verified at once: the loop checks its first token against the next
    plain `ar` step (the shadow check) and verifies the rest only if it agreed, so a model whose
    drafts never agree costs a preview pass per probe and nothing else: no verification pass, no
    rollback (the multi-row passes of a probe have shapes the loop meets once in a few hundred
    tokens, so they run without a built graph: docs/performance.md).
    """

    MAX_PATIENCE = 64
    PROBE_BACKOFF = 8
    MAX_PROBE_GAP = 256

    limit: int
    adaptive: bool = True
    probe_after: int = 4
    start: int | None = None  # the first length (None: `limit`; ignored unless adaptive)
    length: int = field(init=False)
    _ar_steps: int = field(default=0, init=False)
    _misses: int = field(default=1, init=False)  # checks in a row that accepted nothing (none yet: one)
    _streak: int = field(default=0, init=False)  # full acceptances in a row at this length
    _patience: int = field(default=1, init=False)  # full acceptances in a row before doubling
    _grown: bool = field(default=False, init=False)  # the current length was just doubled
    probing: bool = field(default=True, init=False)

    def __post_init__(self) -> None:
        start = self.limit if self.start is None or not self.adaptive else min(self.start, self.limit)
        self.length, self.probing = start, self.adaptive

    @property
    def gap(self) -> int:
        """Plain `ar` steps at length 0 before the next probe."""
        wait = self.probe_after * self.PROBE_BACKOFF ** max(self._misses - 1, 0)
        return min(self.MAX_PROBE_GAP, wait)

    def _doubles(self) -> bool:
        """Whether one more full acceptance doubles the length."""
        return self._streak + 1 >= self._patience

    def after_full_acceptance(self) -> int:
        """The length the next draft gets if every token of the current one is kept."""
        if not self.adaptive or not self._doubles():
            return self.length
        return min(self.limit, 2 * self.length)

    def update(self, drafted: int, accepted: int) -> None:
        if not self.adaptive:
            return
        if drafted:
            if accepted == drafted:
                if self._grown:
                    self._patience = 1
                grown = self.after_full_acceptance()
                self._grown = grown > self.length
                self._streak = 0 if self._grown else self._streak + 1
                self.length = grown
            else:
                if self._grown:
                    self._patience = min(self.MAX_PATIENCE, 2 * self._patience)
                self.length, self._streak, self._grown = accepted, 0, False
            self._misses = 0 if accepted else self._misses + 1
            self._ar_steps, self.probing = 0, not accepted
        elif self.length == 0:
            self._ar_steps += 1
            if self._ar_steps >= self.gap:
                self.length, self._ar_steps = min(1, self.limit), 0


@dataclass(frozen=True)
class IterationEvent:
    """One iteration: the draft it verified, what it appended, and its cost."""

    index: int
    position: int  # sequence position of the pending token (the pass's row 0)
    draft: tuple[int, ...]  # the drafted tokens verified after the pending token
    accepted: int  # how many of them were kept
    tokens: tuple[int, ...]  # appended to the response: the pending token + the accepted drafts
    passes: int  # backend passes: the fused one + refinements
    seconds: float


@dataclass(frozen=True)
class SpeculativeResult(Result):
    """`Result` of the speculative mode; `tokens_per_pass` holds the tokens of each iteration."""

    draft_lengths: tuple[int, ...] = ()
    accepted: tuple[int, ...] = ()
    iteration_seconds: tuple[float, ...] = ()

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafted tokens / drafted tokens (0 without drafts)."""
        drafted = sum(self.draft_lengths)
        return sum(self.accepted) / drafted if drafted else 0.0

    @property
    def mean_tokens_per_iteration(self) -> float:
        return len(self.tokens) / len(self.accepted) if self.accepted else 0.0

    @property
    def ms_per_iteration(self) -> float:
        return (
            1000 * sum(self.iteration_seconds) / len(self.iteration_seconds)
            if self.iteration_seconds
            else 0.0
        )


@dataclass(frozen=True)
class _Draft:
    """Drafted tokens and, sampling, the distributions q they were drawn from."""

    tokens: tuple[int, ...] = ()
    dist: np.ndarray | None = None

    def cut(self, n: int) -> _Draft:
        if n >= len(self.tokens):
            return self
        return _Draft(self.tokens[:n], None if self.dist is None else self.dist[:n])

    def tail(self) -> _Draft:
        """All but the first token: what a shadow leaves to verify once its first token agreed."""
        return _Draft(self.tokens[1:], None if self.dist is None else self.dist[1:])


def _sample(rng: np.random.Generator, weights: np.ndarray) -> int:
    """One token drawn from unnormalised non-negative weights (inverse CDF, one uniform)."""
    cdf = np.cumsum(weights)
    return min(int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")), len(weights) - 1)


def _propose(v: Verification, length: int, threshold: float, rng: np.random.Generator) -> _Draft:
    """A draft from a pass's preview rows: at most `length` rows, cut before the first row whose
    confidence (argmax probability) is below `threshold`; drawn from the rows' distributions when
    sampling.

    The cut reads the distributions only, never the drawn tokens: a draft token kept because of
    its own value would not be distributed as q, and the acceptance rule would be biased.
    """
    n = min(length, len(v.draft_tokens))
    if n == 0:  # an `ar` step, or no draft wanted
        return _NO_DRAFT
    low = np.flatnonzero(v.draft_probs[:n] < threshold)
    n = int(low[0]) if low.size else n
    if v.draft_dist is None:
        return _Draft(tuple(int(t) for t in v.draft_tokens[:n]))
    return _Draft(tuple(_sample(rng, v.draft_dist[i]) for i in range(n)), v.draft_dist[:n])


def _accept(v: Verification, draft: _Draft, rng: np.random.Generator) -> tuple[int, int]:
    """(accepted drafted tokens, bonus token) of a verification (module docstring)."""
    if v.dist is None:
        agree = [d == int(t) for d, t in zip(draft.tokens, v.tokens[:-1], strict=True)]
        a = agree.index(False) if False in agree else len(draft.tokens)
        return a, int(v.tokens[a])
    assert draft.dist is not None or not draft.tokens
    for i, x in enumerate(draft.tokens):
        p, q = v.dist[i], draft.dist[i]
        if rng.random() * q[x] >= p[x]:
            residual = np.maximum(p - q, 0.0)
            return i, _sample(rng, residual if residual.sum() > 0 else p)
    return len(draft.tokens), _sample(rng, v.dist[len(draft.tokens)])


_NO_DRAFT = _Draft()


def speculative_loop(
    backend: SpeculativeBackend,
    prompt: Sequence[int],
    s: DecodingSettings,
    spec: SpeculativeSettings | None = None,
) -> Iterator[IterationEvent | SpeculativeResult]:
    """Run one request in the `speculative` mode; yields an `IterationEvent` per iteration, then the
    `SpeculativeResult`. Greedy output equals `loops.ar_loop`'s; sampled output has its
    distribution. Afterwards the state holds the prompt followed by `Result.tokens`.
    """
    spec = spec or SpeculativeSettings()
    if s.logit_shift != 1:
        raise ValueError(
            "speculative decoding needs logit_shift 1: causal rows must predict the next position"
        )
    prompt, limit = list(prompt), spec.draft_limit(s)
    policy.check_length(len(prompt), s)
    rng, sampler, vocab = np.random.default_rng(s.seed), s.sampler, backend.vocab_size
    lengths = DraftLength(limit, spec.adaptive, spec.probe_after, spec.first_draft)
    running = policy.RunningAdjustment(s, vocab, prompt)  # the response and each pending token
    stops = set(s.stop_token_ids)

    def masks() -> list[int]:
        """The next preview block: one row more than the draft it can serve (a full block for the
        longest draft, as in diffusion, where a block's last preview row is unused; few rows for a
        short one)."""
        return [s.mask_token_id] * min(s.block_size, lengths.after_full_acceptance() + 1)

    start = time.perf_counter()

    def preview_fits(position: int) -> bool:
        """A preview block at `position` (the bonus's) helps only if a draft is wanted and fits."""
        return lengths.length > 0 and position + s.block_size <= s.context_limit

    # The prompt's last row is a pass of its own: its pick is the first token, its preview the first draft.
    adj = policy.adjustment(s, vocab, prompt, [])
    if len(prompt) > 1:
        backend.prefill(prompt[:-1], adj)
    else:
        backend.rollback(0)
    drafting = s.max_new_tokens > 1 and preview_fits(len(prompt))
    v = backend.verify_and_draft(
        prompt[-1:], RowAdjustments.constant(adj, 1), masks() if drafting else [], sampler, s.routing
    )

    def from_preview(v: Verification) -> tuple[_Draft, _Draft | None]:
        """(the draft the next iteration verifies, the shadow it checks instead) from a pass's
        preview: while `lengths.probing` the whole preview is a shadow, whose first token the next
        plain `ar` step checks before any pass verifies the rest."""
        if not lengths.probing:
            return _propose(v, lengths.length, spec.draft_threshold, rng), None
        shadow = _propose(v, len(v.draft_tokens), spec.draft_threshold, rng)
        return _NO_DRAFT, (shadow if shadow.tokens else None)

    pending = int(v.tokens[0]) if v.dist is None else _sample(rng, v.dist[0])
    draft, shadow = from_preview(v)
    prefill_seconds = time.perf_counter() - start

    response: list[int] = []
    drafted, accepted, per_iteration, seconds = [], [], [], []
    finish = "length"
    while len(response) < s.max_new_tokens:
        t0, position, passes = time.perf_counter(), len(prompt) + len(response), 1
        running.append(pending)  # always kept
        room = s.max_new_tokens - len(response) - 1  # positions left after the pending token
        draft = draft.cut(0 if pending in stops else room)
        for _ in range(spec.refinements if draft.tokens else 0):
            block = [pending, *draft.tokens, *masks()][: s.block_size]
            seen = policy.resolved_response(response, block, s.mask_token_id)
            base = policy.adjustment(s, vocab, prompt, seen)
            r = backend.verify_and_draft([], RowAdjustments.constant(base, 0), block, sampler, s.routing)
            draft = _propose(r, len(draft.tokens), spec.draft_threshold, rng)
            passes += 1
        draft = draft.cut(next((i + 1 for i, t in enumerate(draft.tokens) if t in stops), len(draft.tokens)))
        rows = [pending, *draft.tokens]
        ends = any(t in stops for t in rows) or len(draft.tokens) == room  # if every draft token is kept
        wanted = not ends and shadow is None and preview_fits(position + len(rows))
        if draft.tokens or wanted or not sampler.greedy:
            adjs = policy.row_adjustments(s, vocab, prompt, response, rows)
            v = backend.verify_and_draft(rows, adjs, masks() if wanted else [], sampler, s.routing)
            a, bonus = _accept(v, draft, rng)
        else:  # nothing to verify or draft, greedy: the `ar` loop's own step (the commit path, no snapshots)
            v, a, bonus = None, 0, backend.commit([pending], running.adjustment())[0]
        kept = rows[: a + 1]
        response += kept
        for t in kept[1:]:
            running.append(t)
        if a < len(draft.tokens):
            backend.rollback(len(prompt) + len(response))
        if shadow is not None:  # this step's pick checked the shadow's first token
            agreed = bonus == shadow.tokens[0]
            lengths.update(1, int(agreed))
            draft, shadow = (shadow.tail().cut(lengths.length) if agreed else _NO_DRAFT), None
        else:
            lengths.update(len(draft.tokens), a)
            # the pass's preview saw every causal row: a valid draft only if none was rejected
            if v is None or a < len(draft.tokens):
                draft = _NO_DRAFT
            else:
                draft, shadow = from_preview(v)
        drafted.append(len(rows) - 1)
        accepted.append(a)
        per_iteration.append(len(kept))
        seconds.append(time.perf_counter() - t0)
        yield IterationEvent(len(seconds) - 1, position, tuple(rows[1:]), a, tuple(kept), passes, seconds[-1])
        if kept[-1] in stops:
            finish = "stop"
            break
        pending = bonus
    yield SpeculativeResult(
        tuple(response),
        finish,
        len(prompt),
        (),
        tuple(per_iteration),
        prefill_seconds,
        time.perf_counter() - start,
        tuple(drafted),
        tuple(accepted),
        tuple(seconds),
    )
