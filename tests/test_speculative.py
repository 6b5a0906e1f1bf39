"""The `ar` loop and the `speculative` mode: greedy token identity with `ar` on generated models, the
fused pass's draft semantics, stops and budget inside drafts, per-row adjustments, the adaptive
draft length, and the sampled acceptance rule's output distribution."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from itertools import product

import numpy as np
import pytest
from sampling_stats import assert_samples_follow, exact_ar, total_variation

from clover_local import policy, simulation, speculative
from clover_local.backend import (
    GREEDY,
    LogitAdjustment,
    RowAdjustments,
    Sampler,
    Verification,
    distribution,
    head,
    pick,
)
from clover_local.loops import TokenEvent, ar_loop, last_result
from clover_local.model.config import CheckpointConfig
from clover_local.policy import DecodingSettings
from clover_local.reference.backend import NumpyBackend
from clover_local.reference.model import ReferenceModel, State
from clover_local.speculative import (
    DraftLength,
    IterationEvent,
    SpeculativeResult,
    SpeculativeSettings,
)

PROMPTS = {
    "long": [475, 84, 82, 269, 198, 432, 295, 266, 392, 281, 380, 30, 476, 198, 475, 444, 361, 83, 64, 261],
    "one-token": [302],
}
STOPS = (476, 474)


@pytest.fixture(scope="module")
def mask_id(tiny_checkpoint) -> int:
    return CheckpointConfig.from_dir(tiny_checkpoint).model.mask_token_id


@pytest.fixture(scope="module", params=[np.float64, np.float32], ids=["f64", "f32"])
def model(request, tiny_checkpoint) -> ReferenceModel:
    return ReferenceModel.from_checkpoint(tiny_checkpoint, dtype=request.param)


# Policies whose adjustment changes from row to row of a verification, so that only per-row
# adjustments reproduce `ar`: rewarding seen tokens makes the tiny model loop on its own response
# (which tokens are seen decides the output); a steep stop ramp decides the length.
POLICIES = {
    "repeat": {"presence_penalty": -2.0, "repetition_penalty": 0.8},
    "ramp": {"stop_ramp_start": 0.0, "stop_ramp_max": 30.0},
}


def settings(mask_id: int, block_size: int, max_new_tokens: int = 24, **kw) -> DecodingSettings:
    base = {"stop_token_ids": STOPS, **POLICIES["repeat"]}
    return DecodingSettings(
        mask_token_id=mask_id, block_size=block_size, max_new_tokens=max_new_tokens, **{**base, **kw}
    )


def run(backend, prompt, s, spec) -> tuple[list[IterationEvent], SpeculativeResult]:
    events = list(speculative.speculative_loop(backend, prompt, s, spec))
    assert isinstance(events[-1], SpeculativeResult)
    return events[:-1], events[-1]


def fresh_state(model, tokens: Sequence[int]) -> State:
    state = model.new_state()
    model.commit(list(tokens), state)
    return state


def assert_state_holds(backend: NumpyBackend, model, tokens: Sequence[int]) -> None:
    """The backend's state is exactly a fresh commit of `tokens` (rollbacks left nothing behind)."""
    fresh = fresh_state(model, tokens)
    assert backend.state.n_past == fresh.n_past == len(tokens)
    tol = 1e-4 if model.dtype == np.float32 else 1e-9
    for layer, rec in fresh.recurrent.items():
        np.testing.assert_allclose(backend.state.recurrent[layer], rec, rtol=tol, atol=tol)
    for layer, keys in fresh.keys.items():
        np.testing.assert_allclose(backend.state.keys[layer], keys, rtol=tol, atol=tol)


# -- the `ar` loop ----------------------------------------------------------------------------------
def test_ar_is_the_one_token_causal_greedy_loop(model, mask_id):
    prompt, s = PROMPTS["long"], settings(mask_id, 8, max_new_tokens=12)
    backend = NumpyBackend(model)
    events = list(ar_loop(backend, prompt, s))
    result = events[-1]
    # independent oracle: the model's logits, the policy's adjustment, argmax
    state, expected, logits = model.new_state(), [], None
    logits = model.commit(prompt, state)[-1]
    for _ in range(12):
        expected.append(int(pick(logits[None], policy.adjustment(s, 512, prompt, expected))[0][0]))
        logits = model.commit(expected[-1:], state)[-1]
    assert result.tokens == tuple(expected) and result.finish_reason == "length"
    assert [e.token for e in events if isinstance(e, TokenEvent)] == expected
    assert [e.position for e in events[:-1]] == list(range(len(prompt), len(prompt) + 12))
    assert_state_holds(backend, model, prompt + expected)
    assert result.tokens_per_second > 0


def test_ar_stops_after_the_stop_token_and_commits_it(model, mask_id):
    prompt = PROMPTS["long"]
    free = last_result(ar_loop(NumpyBackend(model), prompt, settings(mask_id, 8, stop_token_ids=())))
    stop = free.tokens[5]
    backend = NumpyBackend(model)
    result = last_result(ar_loop(backend, prompt, settings(mask_id, 8, stop_token_ids=(stop,))))
    cut = free.tokens.index(stop) + 1
    assert result.tokens == free.tokens[:cut] and result.finish_reason == "stop"
    assert_state_holds(backend, model, prompt + list(result.tokens))


# -- per-row adjustments ----------------------------------------------------------------------------
def test_row_adjustments_equal_each_rows_full_adjustment():
    think_start, think_end = 10, 11
    s = DecodingSettings(
        mask_token_id=99,
        max_new_tokens=20,
        stop_token_ids=(1, 2),
        presence_penalty=0.5,
        frequency_penalty=0.3,
        repetition_penalty=1.5,
        stop_ramp_start=0.0,
        stop_ramp_max=3.0,
        think_ramp_start=0.0,
        think_ramp_max=2.0,
        think_start_id=think_start,
        think_end_id=think_end,
    )
    prompt, response = [5, think_start], [7, 8, 7]
    rows = [8, 12, think_end, 12, 1]  # repeats, leaves the think section, reaches a stop token
    adjs = policy.row_adjustments(s, 100, prompt, response, rows)
    assert len(adjs) == len(rows) and adjs.ids.size <= len(set(rows)) + 3
    for j in range(len(rows)):
        full = policy.adjustment(s, 100, prompt, [*response, *rows[: j + 1]])
        row = adjs.row(j)
        for f in ("pos_scale", "neg_scale", "bias"):
            np.testing.assert_array_equal(getattr(row, f), getattr(full, f))
    assert not np.array_equal(adjs.row(0).bias, adjs.row(4).bias)  # the rows really differ
    np.testing.assert_array_equal(adjs.last().bias, adjs.row(4).bias)
    base = policy.adjustment(s, 100, prompt, response)
    constant = RowAdjustments.constant(base, 3)
    assert len(constant) == 3 and constant.row(2).bias.tolist() == base.bias.tolist()
    assert RowAdjustments.constant(base, 0).last() is base


# -- greedy: token-identical to `ar` ----------------------------------------------------------------
CASES = [
    (4, SpeculativeSettings(adaptive=False)),
    (4, SpeculativeSettings(draft_len=1, refinements=1)),
    (8, SpeculativeSettings()),
    (8, SpeculativeSettings(adaptive=False, refinements=2, draft_threshold=0.05)),
    (8, SpeculativeSettings(draft_len=0)),
    (32, SpeculativeSettings(draft_len=12, adaptive=False)),
]


@pytest.mark.parametrize(
    "prompt_name,policy_name", [("long", "repeat"), ("one-token", "repeat"), ("long", "ramp")]
)
@pytest.mark.parametrize("block_size,spec", CASES)
def test_greedy_speculative_equals_ar(model, mask_id, prompt_name, policy_name, block_size, spec):
    prompt = PROMPTS[prompt_name]
    n = 10 if block_size == 32 else 20
    s = settings(mask_id, block_size, max_new_tokens=n, **POLICIES[policy_name])
    ar = last_result(ar_loop(NumpyBackend(model), prompt, s))
    backend = NumpyBackend(model)
    events, result = run(backend, prompt, s, spec)
    assert result.tokens == ar.tokens and result.finish_reason == ar.finish_reason
    assert_state_holds(backend, model, prompt + list(result.tokens))
    # the statistics describe the iterations
    assert sum(result.tokens_per_pass) == len(result.tokens) == sum(len(e.tokens) for e in events)
    assert result.accepted == tuple(e.accepted for e in events)
    assert result.draft_lengths == tuple(len(e.draft) for e in events)
    assert all(
        len(e.draft) <= block_size - 1 and e.tokens == (e.tokens[0], *e.draft[: e.accepted]) for e in events
    )
    if spec.draft_len == 0:
        assert set(result.draft_lengths) == {0} and len(events) == len(result.tokens)
    elif not spec.adaptive:
        assert max(result.draft_lengths) > 0
    else:  # the tiny model's previews rarely agree with it, so shadow checks stop most drafts:
        # verify drafts from previews that agree but for a few positions, with the same causal passes
        wrong = {len(prompt) + i for i in (3, 9)}
        prophet = NumpyBackend(Prophet(model, prompt + list(ar.tokens), wrong))
        _, scripted = run(prophet, prompt, s, spec)
        assert scripted.tokens == ar.tokens and max(scripted.draft_lengths) > 0
        assert_state_holds(prophet, model, prompt + list(ar.tokens))
    assert result.ms_per_iteration > 0 and result.tokens_per_second > 0


def test_the_verified_draft_is_the_preview_over_the_accepted_state(model, mask_id):
    """The fused pass: each draft is the preview at the pending token's position over exactly the
    committed prefix before it (never a state holding rejected rows)."""
    prompt, s = PROMPTS["long"], settings(mask_id, 8, max_new_tokens=16)
    events, result = run(NumpyBackend(model), prompt, s, SpeculativeSettings(adaptive=False))
    full = prompt + list(result.tokens)
    checked = 0
    for e in events:
        if e.draft:
            before = full[: e.position]
            adj = policy.adjustment(s, 512, prompt, before[len(prompt) :])
            rows = pick(model.preview([mask_id] * 8, fresh_state(model, before)), adj)[0]
            assert list(e.draft) == rows[: len(e.draft)].tolist()
            checked += 1
    assert checked >= 4
    rejected = [e for e in events if e.accepted < len(e.draft)]
    assert rejected and all(
        not nxt.draft for e, nxt in zip(events, events[1:], strict=False) if e.accepted < len(e.draft)
    )


def test_previews_stay_inside_the_context_and_rollback_stays_inside_the_last_pass(model, mask_id):
    prompt = PROMPTS["long"]
    s = settings(mask_id, 8, 16, context_limit=len(PROMPTS["long"]) + 16)  # the least `check_length` allows

    class Bounded(NumpyBackend):
        def verify_and_draft(self, tokens, adjs, preview, sampler=GREEDY, routing=None):
            assert self.state.n_past + len(tokens) + len(preview) <= s.context_limit
            return super().verify_and_draft(tokens, adjs, preview, sampler, routing)

    ar = last_result(ar_loop(NumpyBackend(model), prompt, s))
    backend = Bounded(model)
    events, result = run(backend, prompt, s, SpeculativeSettings(adaptive=False))
    assert result.tokens == ar.tokens and not events[-1].draft
    plain = NumpyBackend(model)
    plain.prefill(prompt, LogitAdjustment.identity(512))
    plain.verify_and_draft([5, 6], RowAdjustments.constant(LogitAdjustment.identity(512), 2), [])
    with pytest.raises(ValueError, match="cannot roll back"):
        plain.rollback(len(prompt) - 1)
    plain.rollback(len(prompt) + 1)
    assert_state_holds(plain, model, prompt + [5])


# -- drafts that agree: a preview that knows the `ar` continuation, with planted mistakes ------------
class Prophet:
    """The real causal passes of a model with scripted previews: preview row i predicts `truth` at
    its position, except at `wrong` positions (another token) and `unsure` ones (low confidence)."""

    def __init__(self, model: ReferenceModel, truth: Sequence[int], wrong=(), unsure=()):
        self.model, self.cfg, self.truth = model, model.cfg, list(truth)
        self.wrong, self.unsure = set(wrong), set(unsure)
        self.default_routing = model.default_routing

    def new_state(self) -> State:
        return self.model.new_state()

    def commit(self, tokens: Sequence[int], state: State) -> np.ndarray:
        return self.model.commit(tokens, state)

    def preview(self, block: Sequence[int], state: State, routing=None) -> np.ndarray:
        logits = np.zeros((len(block), self.cfg.vocab_size))
        for i in range(len(block)):
            pos = state.n_past + i + 1
            token = self.truth[pos] if pos < len(self.truth) else 0
            token = (token + 1) % 470 if pos in self.wrong else token
            logits[i, token] = 2.0 if pos in self.unsure else 40.0
        return logits


@pytest.mark.parametrize("block_size", [4, 8, 32])
def test_agreeing_drafts_are_accepted_and_output_still_equals_ar(model, mask_id, block_size):
    prompt, s = PROMPTS["long"], settings(mask_id, block_size, max_new_tokens=40, stop_token_ids=())
    ar = last_result(ar_loop(NumpyBackend(model), prompt, s))
    truth = prompt + list(ar.tokens)
    wrong = {len(prompt) + i for i in (6, 7, 19, 33)}
    backend = NumpyBackend(Prophet(model, truth, wrong))
    events, result = run(backend, prompt, s, SpeculativeSettings())
    assert result.tokens == ar.tokens
    assert_state_holds(backend, model, truth)
    full = [e for e in events if e.draft and e.accepted == len(e.draft)]
    partial = [e for e in events if e.accepted < len(e.draft)]
    assert full and partial and len(events) < len(ar.tokens) / 2
    assert result.acceptance_rate > 0.3 and result.mean_tokens_per_iteration > 2


def test_a_stop_token_inside_a_draft_ends_the_response_there(model, mask_id):
    prompt = PROMPTS["long"]
    free = last_result(ar_loop(NumpyBackend(model), prompt, settings(mask_id, 8, 40, stop_token_ids=())))
    stop = free.tokens[13]
    s = settings(mask_id, 8, 40, stop_token_ids=(stop,))
    ar = last_result(ar_loop(NumpyBackend(model), prompt, s))
    assert ar.finish_reason == "stop" and ar.tokens[-1] == stop
    backend = NumpyBackend(Prophet(model, prompt + list(free.tokens)))
    events, result = run(backend, prompt, s, SpeculativeSettings(adaptive=False))
    assert result.tokens == ar.tokens and result.finish_reason == "stop"
    assert events[-1].accepted >= 1 and events[-1].draft[-1] == stop  # the draft was cut after the stop
    assert_state_holds(backend, model, prompt + list(ar.tokens))


def test_the_budget_ends_inside_a_draft(model, mask_id):
    prompt, s = PROMPTS["long"], settings(mask_id, 8, 11, stop_token_ids=())
    ar = last_result(ar_loop(NumpyBackend(model), prompt, settings(mask_id, 8, 40, stop_token_ids=())))
    backend = NumpyBackend(Prophet(model, prompt + list(ar.tokens)))
    events, result = run(backend, prompt, s, SpeculativeSettings(adaptive=False))
    assert result.tokens == ar.tokens[:11] and result.finish_reason == "length"
    assert [len(e.draft) for e in events] == [7, 2]  # 1 + 7, then 1 + 2 = the budget's 11
    assert_state_holds(backend, model, prompt + list(result.tokens))


def test_the_threshold_cuts_a_draft_before_its_first_unsure_row(model, mask_id):
    prompt, s = PROMPTS["long"], settings(mask_id, 8, 16, stop_token_ids=())
    ar = last_result(ar_loop(NumpyBackend(model), prompt, s))
    unsure = {len(prompt) + 4, len(prompt) + 10}
    backend = NumpyBackend(Prophet(model, prompt + list(ar.tokens), unsure=unsure))
    spec = SpeculativeSettings(adaptive=False, draft_threshold=0.5)
    events, result = run(backend, prompt, s, spec)
    assert result.tokens == ar.tokens
    spans = [range(e.position + 1, e.position + 1 + len(e.draft)) for e in events]
    assert all(not unsure & set(span) for span in spans)
    assert [len(e.draft) for e in events][:2] == [3, 5]  # 1-3 (4 unsure), then 4 + 5-9 (10 unsure)


# -- the adaptive draft length ----------------------------------------------------------------------
def test_draft_length_doubles_on_full_acceptance_drops_to_the_agreeing_run_and_probes():
    d = DraftLength(limit=7, probe_after=2)
    steps = [(7, 3), (0, 0), (3, 3), (6, 6), (7, 0)]  # -> 3, 3, 6, 7, 0 (a first miss: the wait is 2)
    steps += [(0, 0)] * 2 + [(1, 0)]  # AR steps, then a probe that finds nothing (a second miss: 2 x 8)
    steps += [(0, 0)] * 16 + [(1, 0)]  # and a third (2 x 8 x 8)
    steps += [(0, 0)] * 128 + [(1, 1), (1, 1), (2, 2)]  # the probe agrees: a doubling failed, so it
    trace = []  # takes 2 full acceptances to double (1, 2), then a kept doubling resets that to 1 (4)
    for drafted, accepted in steps:
        d.update(drafted, accepted)
        trace.append(d.length)
    assert trace == [3, 3, 6, 7, 0] + [0, 1, 0] + [0] * 15 + [1, 0] + [0] * 127 + [1, 1, 2, 4]
    assert d.after_full_acceptance() == 7 and not d.probing
    for _ in range(12):  # misses only: the wait between probes stops growing at MAX_PROBE_GAP
        d.update(d.length, 0)
        assert d.probing
        while d.length == 0:
            d.update(0, 0)
    assert d.gap == DraftLength.MAX_PROBE_GAP
    fixed = DraftLength(limit=5, adaptive=False)
    fixed.update(5, 0)
    assert fixed.length == 5


class Calls:
    """Counts a backend's verifications of drafted rows, its preview passes and its rollbacks."""

    def __init__(self, inner):
        self.inner, self.verified, self.previews, self.rollbacks = inner, 0, 0, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def verify_and_draft(self, tokens, adjs, preview, *args):
        self.verified += len(tokens) > 1
        self.previews += len(preview) > 0
        return self.inner.verify_and_draft(tokens, adjs, preview, *args)

    def rollback(self, n_keep):
        self.rollbacks += 1
        return self.inner.rollback(n_keep)


def test_drafts_that_never_agree_cost_a_preview_per_probe_and_nothing_else(model, mask_id):
    """Shadow checks: with no drafted token ever accepted, no pass verifies a draft and nothing is
    rolled back; previews run at the start and at the probes (after 32 steps, then every 256)."""
    prompt, s = PROMPTS["long"], settings(mask_id, 8, max_new_tokens=60, stop_token_ids=())
    calls = Calls(simulation.FixedAccept(NumpyBackend(model), 0))
    events, result = run(calls, prompt, s, SpeculativeSettings())
    assert calls.verified == 0 and calls.rollbacks == 0 and set(result.draft_lengths) == {0}
    assert calls.previews == 2 and len(events) == len(result.tokens) == 60


def test_a_first_draft_shorter_than_the_limit_doubles_from_there(model, mask_id):
    """`first_draft`: the start's preview (a shadow of 2 + 2 + 1 rows) is checked by the first step,
    then drafts of 4 (the first length doubled by that check) and the limit (7); same output."""
    prompt, s = PROMPTS["long"], settings(mask_id, 8, max_new_tokens=24)
    ar = last_result(ar_loop(NumpyBackend(model), prompt, s))
    backend = NumpyBackend(Prophet(model, prompt + list(ar.tokens)))
    events, result = run(backend, prompt, s, SpeculativeSettings(first_draft=2))
    assert result.tokens == ar.tokens
    assert [len(e.draft) for e in events][:4] == [0, 4, 7, 7]
    assert DraftLength(limit=7, start=9).length == 7 and DraftLength(7, adaptive=False, start=2).length == 7
    with pytest.raises(ValueError, match="first_draft"):
        next(speculative.speculative_loop(backend, prompt, s, SpeculativeSettings(first_draft=-1)))


@pytest.mark.parametrize("a", [1, 2, 3, 5])
def test_draft_length_settles_under_a_steady_acceptance(a):
    """With a accepted whenever more are drafted, cut drafts (each costing an iteration) get rare:
    doubling is tried after 1, 2, 4, ... 64 full acceptances in a row, then every 64."""
    d, cuts = DraftLength(limit=31), 0
    for _ in range(500):
        drafted = d.length
        accepted = min(a, drafted)
        cuts += accepted < drafted
        d.update(drafted, accepted)
    assert d.length == a
    assert cuts <= 7 + 500 // 64 + 1


def test_settings_are_checked(model, mask_id):
    backend, prompt = NumpyBackend(model), PROMPTS["long"]
    with pytest.raises(ValueError, match="draft_len 8 outside 0..7"):
        next(
            speculative.speculative_loop(
                backend, prompt, settings(mask_id, 8), SpeculativeSettings(draft_len=8)
            )
        )
    with pytest.raises(ValueError, match="logit_shift 1"):
        next(speculative.speculative_loop(backend, prompt, settings(mask_id, 8, logit_shift=0)))
    with pytest.raises(ValueError, match="refinements"):
        next(
            speculative.speculative_loop(
                backend, prompt, settings(mask_id, 8), SpeculativeSettings(refinements=-1)
            )
        )


# -- sampling: the output distribution is `ar`'s --------------------------------------------------
class Bigram:
    """A fast `SpeculativeBackend` with known distributions: causal logits depend on the row's token
    (table `causal`), preview row i's on the last committed token and i (table `draft`)."""

    def __init__(self, causal: np.ndarray, draft: np.ndarray):
        self.causal, self.draft, self.vocab_size = causal, draft, causal.shape[0]
        self.seq: list[int] = []

    def prefill(self, tokens: Sequence[int], adj: LogitAdjustment, draw=None) -> tuple[int, float]:
        self.seq = list(tokens)
        t, p = head(self.causal[self.seq[-1:]], adj, draw)
        return int(t[0]), float(p[0])

    def verify_and_draft(self, tokens, adjs, preview, sampler=GREEDY, routing=None) -> Verification:
        self.seq += list(tokens)
        causal = self.causal[list(tokens)]
        ahead = self.draft[self.seq[-1], : len(preview)]
        picks = [pick(causal[j : j + 1], adjs.row(j)) for j in range(len(tokens))]
        return Verification(
            np.array([t[0] for t, _ in picks], dtype=np.int64),
            np.array([p[0] for _, p in picks]),
            *pick(ahead, adjs.last()),
            np.array([distribution(causal[j], adjs.row(j), sampler) for j in range(len(tokens))]),
            distribution(ahead, adjs.last(), sampler),
        )

    def rollback(self, n_keep: int) -> None:
        self.seq = self.seq[:n_keep]


def bigram(seed: int = 7, V: int = 6) -> Bigram:
    """A 6-token bigram model whose drafts are correlated with the truth."""
    rng = np.random.default_rng(seed)
    causal = 2.0 * rng.normal(size=(V, V))
    return Bigram(causal, causal[:, None, :] * 0.7 + rng.normal(size=(V, 4, V)))


@pytest.mark.parametrize(
    "sampler", [Sampler(1.0), Sampler(1.3, top_k=4, top_p=0.9, min_p=0.05)], ids=["plain", "cut"]
)
def test_sampled_speculative_has_the_ar_distribution_on_a_bigram_model(sampler):
    """Drafts agree often, so both branches of the acceptance rule carry weight; 3000 seeded runs of
    3 tokens against the exact `ar` distribution (with the sampler's cuts, which both p and q
    carry): chi-square at the 0.1% level, and a total variation that direct `ar` sampling would
    reach only 0.1% of the time (about 0.07 here, while drafts taken unchecked would be more than
    0.25 away)."""
    backend = bigram()
    V = backend.vocab_size
    s = DecodingSettings(
        mask_token_id=V - 1, block_size=4, max_new_tokens=3, presence_penalty=0.7, sampler=sampler
    )
    prompt, n_runs = [0], 3000
    counts: Counter = Counter()
    accepted = rejected = 0
    for seed in range(n_runs):
        events, result = run(backend, prompt, replace(s, seed=seed), SpeculativeSettings(adaptive=False))
        counts[result.tokens] += 1
        accepted += sum(e.accepted for e in events)
        rejected += sum(e.accepted < len(e.draft) for e in events)
    assert accepted > 0.3 * n_runs and rejected > 0.3 * n_runs
    expected = exact_ar(lambda seq: backend.causal[seq[-1]], prompt, s, V, 3)
    assert sum(expected.values()) == pytest.approx(1.0, abs=1e-4)
    assert_samples_follow(counts, expected, n_runs)
    # the bound can fail: the first pass's drafts (rows over the prompt) taken unchecked are far off
    first = policy.adjustment(s, V, prompt, [])
    p1, q = (
        distribution(backend.causal[0], first, sampler),
        distribution(backend.draft[0, :2], first, sampler),
    )
    unchecked = Counter({(a, b, c): p1[a] * q[0, b] * q[1, c] for a, b, c in product(range(V), repeat=3)})
    assert total_variation(unchecked, expected, 1) > 0.25


def test_sampled_speculative_has_the_ar_distribution_on_the_generated_model(mask_id, tiny_checkpoint):
    """The real reference (random previews rarely agree, so this weighs the residual branch): 200
    seeded runs of 2 tokens at temperature 1.5 against the exact `ar` distribution, bounds as above."""
    model = ReferenceModel.from_checkpoint(tiny_checkpoint)
    s = DecodingSettings(
        mask_token_id=mask_id, block_size=4, max_new_tokens=2, presence_penalty=1.0, sampler=Sampler(1.5)
    )
    prompt, n_runs = [475, 84], 200
    backend, counts = NumpyBackend(model), Counter()
    spec = SpeculativeSettings(draft_len=1, adaptive=False)
    for seed in range(n_runs):
        counts[run(backend, prompt, replace(s, seed=seed), spec)[1].tokens] += 1

    def step(seq: list[int]) -> np.ndarray:
        return model.commit(seq, model.new_state())[-1]

    assert_samples_follow(counts, exact_ar(step, prompt, s, model.cfg.vocab_size, 2), n_runs)
