"""The `speculative` mode on the patched llama.cpp (F32 GGUFs of the tiny checkpoints): greedy output
token-identical to `ar` on the same file, a verification equal to a commit followed by a preview,
and rollbacks that leave exactly the state of committing the kept rows."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import pytest
from test_llama_engine import LOG, N_GPU_LAYERS, PROB_RTOL, SAME, engine

from clover_local import speculative
from clover_local.api import Clover
from clover_local.backend import (
    GREEDY,
    LogitAdjustment,
    RowAdjustments,
    Sampler,
    Verification,
    distribution,
    pick,
)
from clover_local.llama import unavailable
from clover_local.loops import ar_loop, last_result
from clover_local.model.config import CheckpointConfig
from clover_local.policy import DecodingSettings, row_adjustments
from clover_local.speculative import SpeculativeResult, SpeculativeSettings

SKIP = unavailable()
pytestmark = [pytest.mark.llama, pytest.mark.skipif(SKIP is not None, reason=SKIP or "")]

PROMPTS = {"long": [475, 84, 82, 269, 198, 432, 295, 266, 392, 281, 380, 30, 476], "one-token": [302]}
# a policy whose adjustment changes from row to row of a verification (seen tokens are rewarded)
REPEAT = {"presence_penalty": -2.0, "repetition_penalty": 0.8}


@pytest.fixture(scope="module")
def gguf(gguf_factory):
    ckpt, path = gguf_factory("tiny")
    return path, CheckpointConfig.from_dir(ckpt).model.mask_token_id


@pytest.fixture(scope="module")
def ar_engine(gguf):
    with engine(gguf[0]) as eng:
        yield eng


@pytest.fixture(scope="module")
def spec_engine(gguf):
    with engine(gguf[0], speculative=True) as eng:
        yield eng


class Prophet:
    """The engine, with each preview's draft replaced by `truth` (the `ar` output) at the rows'
    positions, wrong at the positions in `wrong`: random weights never draft what they verify, so
    this is how the engine's own causal rows get to accept, reject and roll back."""

    def __init__(self, engine, truth: Sequence[int], wrong: set[int]):
        self.engine, self.truth, self.wrong = engine, list(truth), wrong
        self.vocab_size, self.capabilities = engine.vocab_size, engine.capabilities

    def prefill(self, tokens, adj, draw=None):
        return self.engine.prefill(tokens, adj, draw)

    def commit(self, tokens, adj, draw=None):
        return self.engine.commit(tokens, adj, draw)

    def rollback(self, n_keep: int) -> None:
        self.engine.rollback(n_keep)

    def verify_and_draft(self, tokens, adjs, preview, sampler=GREEDY, routing=None) -> Verification:
        first = self.engine.n_past + len(tokens) + 1  # the position preview row 0 predicts
        v = self.engine.verify_and_draft(tokens, adjs, preview, sampler, routing)
        draft = [self.truth[p] if p < len(self.truth) else 0 for p in range(first, first + len(preview))]
        draft = [(t + 1) % self.vocab_size if p in self.wrong else t for p, t in enumerate(draft, first)]
        return dataclasses.replace(
            v, draft_tokens=np.array(draft, dtype=np.int64), draft_probs=np.ones(len(draft))
        )


def settings(mask: int, block_size: int, max_new_tokens: int, **kw) -> DecodingSettings:
    return DecodingSettings(
        mask_token_id=mask, block_size=block_size, max_new_tokens=max_new_tokens, **{**REPEAT, **kw}
    )


def run_spec(backend, prompt, s, spec: SpeculativeSettings) -> SpeculativeResult:
    result = last_result(speculative.speculative_loop(backend, prompt, s, spec))
    assert isinstance(result, SpeculativeResult)
    return result


def assert_same_state(a: bytes, b: bytes, atol: float) -> None:
    """Serialized states equal; `atol` > 0 allows float noise (a 1-row commit runs other kernels)."""
    if atol == 0 or a == b:
        assert a == b
        return
    assert len(a) == len(b)
    n = len(a) // 4 * 4
    np.testing.assert_allclose(np.frombuffer(a[:n], np.float32), np.frombuffer(b[:n], np.float32), atol=atol)


def assert_same_logits(dist: np.ndarray, expected: np.ndarray) -> None:
    """Distributions whose logs (the adjusted logits / temperature, up to a constant per row) agree
    within 1e-4, and with the same impossible tokens (bias -inf)."""
    live = expected > 0
    np.testing.assert_array_equal(dist > 0, live)
    np.testing.assert_allclose(np.log(dist[live]), np.log(expected[live]), rtol=0, atol=1e-4)


@pytest.mark.parametrize("prompt_name", list(PROMPTS))
@pytest.mark.parametrize("block_size", [4, 8])
@pytest.mark.parametrize("drafts", ["model", "prophet"])
def test_greedy_speculative_equals_ar_on_the_gguf(
    gguf, ar_engine, spec_engine, prompt_name, block_size, drafts
):
    mask = gguf[1]
    prompt, s = PROMPTS[prompt_name], settings(mask, block_size, 24, stop_token_ids=())
    ar = last_result(ar_loop(ar_engine, prompt, s))
    backend = spec_engine
    if drafts == "prophet":
        backend = Prophet(spec_engine, prompt + list(ar.tokens), {len(prompt) + i for i in (3, 4, 13)})
    result = run_spec(backend, prompt, s, SpeculativeSettings())
    assert result.tokens == ar.tokens and result.finish_reason == ar.finish_reason
    if drafts == "prophet":
        assert result.acceptance_rate > 0.3 and 0 < sum(result.accepted) < sum(result.draft_lengths)
    assert spec_engine.n_past == len(prompt) + len(ar.tokens)


@pytest.mark.parametrize("stop_at,budget", [(9, 24), (None, 11)], ids=["stop-in-draft", "budget-in-draft"])
def test_stops_and_budget_inside_a_draft_end_the_response_as_ar(
    gguf, ar_engine, spec_engine, stop_at, budget
):
    mask = gguf[1]
    prompt = PROMPTS["long"]
    free = last_result(ar_loop(ar_engine, prompt, settings(mask, 8, 24, stop_token_ids=())))
    stops = () if stop_at is None else (free.tokens[stop_at],)
    s = settings(mask, 8, budget, stop_token_ids=stops)
    ar = last_result(ar_loop(ar_engine, prompt, s))
    assert ar.finish_reason == ("length" if stop_at is None else "stop")
    backend = Prophet(spec_engine, prompt + list(free.tokens), set())
    result = run_spec(backend, prompt, s, SpeculativeSettings(adaptive=False))
    assert result.tokens == ar.tokens and result.finish_reason == ar.finish_reason
    assert spec_engine.n_past == len(prompt) + len(ar.tokens)
    # the state is the prompt and the response: the next token is the one `ar` would pick
    ar_engine.prefill(prompt + list(ar.tokens), LogitAdjustment.identity(ar_engine.vocab_size))
    assert_same_state(spec_engine.state_bytes(), ar_engine.state_bytes(), atol=1e-5)


@pytest.mark.parametrize("sampler", [GREEDY, Sampler(0.7), Sampler(0.7, top_k=40, top_p=0.9)], ids=str)
@pytest.mark.parametrize("top_p", [1.0, 0.5], ids=["no-coreset", "coreset"])
def test_the_fused_pass_equals_a_commit_then_a_preview(gguf, sampler, top_p):
    """Causal rows with per-row adjustments, then a block with its coreset, in one graph: the
    picks of a commit and of a preview after it, the same logits (log-distributions), and the
    state of the commit alone."""
    path, mask = gguf
    prompt, rows = PROMPTS["long"], [17, 17, 230, 5, 17]
    s = settings(mask, 8, 24, stop_token_ids=(476,), stop_ramp_start=0.0, stop_ramp_max=10.0)
    coreset = {"coreset": top_p < 1, "coreset_top_p": top_p}
    with engine(path, speculative=True, **coreset) as fused, engine(path, **coreset) as ref:
        adjs = row_adjustments(s, fused.vocab_size, prompt, [3, 17], rows)
        assert len(adjs.ids) and not np.array_equal(adjs.bias[0], adjs.bias[-1])  # rows differ
        ident = LogitAdjustment.identity(fused.vocab_size)
        block = [mask] * 6

        fused.prefill(prompt, ident)
        v = fused.verify_and_draft(rows, adjs, block, sampler)
        ref.prefill(prompt, ident)
        causal = ref.causal_logits(rows)
        ahead = ref.preview_logits(block)
        assert_same_state(fused.state_bytes(), ref.state_bytes(), atol=0)

    for j in range(len(rows)):
        tok, prob = pick(causal[j : j + 1], adjs.row(j))
        assert v.tokens[j] == tok[0] and v.probs[j] == pytest.approx(prob[0], rel=PROB_RTOL)
    tok, prob = pick(ahead, adjs.last())
    np.testing.assert_array_equal(v.draft_tokens, tok)
    np.testing.assert_allclose(v.draft_probs, prob, rtol=PROB_RTOL)
    if not sampler.greedy:
        assert v.dist is not None and v.draft_dist is not None
        expected = np.array([distribution(causal[j], adjs.row(j), sampler) for j in range(len(rows))])
        assert_same_logits(v.dist, expected)
        assert_same_logits(v.draft_dist, distribution(ahead, adjs.last(), sampler))
    else:
        assert v.dist is None and v.draft_dist is None


def test_empty_parts_are_a_plain_preview_and_a_plain_commit(gguf, ar_engine, spec_engine):
    mask = gguf[1]
    prompt, block = PROMPTS["long"], [mask] * 4
    ident = LogitAdjustment.identity(spec_engine.vocab_size)
    spec_engine.prefill(prompt, ident)
    ar_engine.prefill(prompt, ident)
    v = spec_engine.verify_and_draft([], RowAdjustments.constant(ident, 0), block)
    tok, prob = ar_engine.preview(block, ident)
    assert len(v.tokens) == 0 and spec_engine.n_past == len(prompt)
    np.testing.assert_array_equal(v.draft_tokens, tok)
    v = spec_engine.verify_and_draft([9, 8], RowAdjustments.constant(ident, 2), [])
    assert len(v.draft_tokens) == 0 and v.tokens[-1] == ar_engine.commit([9, 8], ident)[0]


@pytest.mark.parametrize("kept", range(0, 7))
def test_rollback_leaves_the_state_of_committing_only_the_kept_rows(gguf, ar_engine, spec_engine, kept):
    mask = gguf[1]
    prompt, rows = PROMPTS["long"], [11, 42, 7, 300, 5, 99]
    ident = LogitAdjustment.identity(spec_engine.vocab_size)
    spec_engine.reset()  # a fresh prefill (not the previous case's sequence, extended) in both
    spec_engine.prefill(prompt, ident)
    spec_engine.verify_and_draft(rows, RowAdjustments.constant(ident, len(rows)), [mask] * 8)
    spec_engine.rollback(len(prompt) + kept)
    ar_engine.reset()
    ar_engine.prefill(prompt + rows[:kept], ident)
    assert spec_engine.n_past == ar_engine.n_past == len(prompt) + kept
    # a 1-row commit runs the autoregressive delta-rule kernel, the verification the chunked one
    atol = 1e-5 if kept == 1 else 0
    assert_same_state(spec_engine.state_bytes(), ar_engine.state_bytes(), atol)
    # a preview right after the rollback reads the kept state and leaves it in place
    np.testing.assert_allclose(
        spec_engine.preview_logits([mask] * 4), ar_engine.preview_logits([mask] * 4), rtol=0, atol=SAME
    )
    np.testing.assert_allclose(
        spec_engine.causal_logits([4, 5]), ar_engine.causal_logits([4, 5]), rtol=0, atol=SAME
    )


def test_speculative_commits_are_final_and_verifications_still_roll_back(gguf, ar_engine, spec_engine):
    """A commit is never rolled back, so its rows write only the state after them, as in an engine
    without snapshots (patch 0011, `no_snapshots`): one-row steps leave the `ar` engine's state, a
    rollback into them is refused, and a verification after them keeps its snapshots again."""
    ident = LogitAdjustment.identity(spec_engine.vocab_size)
    rows = [11, 42, 7]
    for eng in (spec_engine, ar_engine):
        eng.reset()
        tok, _ = eng.prefill(PROMPTS["long"], ident)
        for _ in range(5):
            tok, _ = eng.commit([tok], ident)
    assert_same_state(spec_engine.state_bytes(), ar_engine.state_bytes(), atol=0)
    with pytest.raises(ValueError, match="cannot roll back"):
        spec_engine.rollback(spec_engine.n_past - 1)
    n = spec_engine.n_past
    spec_engine.verify_and_draft(rows, RowAdjustments.constant(ident, len(rows)), [])
    spec_engine.rollback(n + 2)
    ar_engine.commit(rows[:2], ident)
    assert_same_state(spec_engine.state_bytes(), ar_engine.state_bytes(), atol=0)


def test_a_final_commit_writes_no_rollback_snapshot(spec_engine):
    """What 0011 saves is observable: after a one-row verification, llama.cpp's rollback of that
    row reads the snapshot of the state before it; after a final commit there is none, so the same
    rollback (the engine refuses it, llama.cpp's memory does not) reads another state."""
    import llama_cpp as ll

    from clover_local.llama.engine import SEQ

    ident = LogitAdjustment.identity(spec_engine.vocab_size)
    rolled_back = []
    for final in (False, True):
        spec_engine.reset()
        tok, _ = spec_engine.prefill(PROMPTS["long"], ident)
        before, n = spec_engine.state_bytes(), spec_engine.n_past
        if final:
            spec_engine.commit([tok], ident)
        else:
            spec_engine.verify_and_draft([tok], RowAdjustments.constant(ident, 1), [])
        assert ll.llama_memory_seq_rm(ll.llama_get_memory(spec_engine.ctx), SEQ, n, -1)
        rolled_back.append(spec_engine.state_bytes() == before)
    spec_engine.reset()
    assert rolled_back == [True, False]


@pytest.mark.parametrize("back", [1, 2, "all"])
def test_a_ubatch_longer_than_its_snapshots_rolls_back_as_a_commit(gguf, ar_engine, back):
    """A plain `llama_decode` (llama.cpp's own API; the engine's verifications never are this
    long) of more tokens than `n_rs_seq` + 1 keeps the snapshots of only its last `n_rs_seq` + 1
    steps (patch 0008); a rollback into them leaves the state of decoding only the kept tokens."""
    import llama_cpp as ll

    from clover_local.llama.engine import SEQ

    ident = LogitAdjustment.identity(ar_engine.vocab_size)
    with engine(gguf[0], speculative=True) as eng:
        tokens = (PROMPTS["long"] * 8)[: eng.n_rs_seq + 6]
        n_keep = len(tokens) - (eng.n_rs_seq if back == "all" else back)
        ids = (ll.llama_token * len(tokens))(*tokens)  # the batch points into it
        assert ll.llama_decode(eng.ctx, ll.llama_batch_get_one(ids, len(tokens))) == 0
        assert ll.llama_memory_seq_rm(ll.llama_get_memory(eng.ctx), SEQ, n_keep, -1)
        ar_engine.reset()
        ar_engine.prefill(tokens[:n_keep], ident)
        assert eng.n_past == ar_engine.n_past == n_keep
        assert_same_state(eng.state_bytes(), ar_engine.state_bytes(), atol=0)


def test_out_of_range_rollbacks_and_verifications_are_refused(ar_engine, spec_engine):
    from clover_local.llama.engine import EngineError

    ident = LogitAdjustment.identity(spec_engine.vocab_size)
    spec_engine.prefill(PROMPTS["long"], ident)
    spec_engine.verify_and_draft([1, 2, 3], RowAdjustments.constant(ident, 3), [])
    n = len(PROMPTS["long"])
    for bad in (n - 1, n + 4):
        with pytest.raises(ValueError, match="cannot roll back"):
            spec_engine.rollback(bad)
    spec_engine.rollback(n + 2)
    with pytest.raises(EngineError, match="roll back"):  # one rollback per verification
        spec_engine.rollback(n + 1)
    rows = list(range(spec_engine.n_rs_seq + 1))
    with pytest.raises(EngineError, match="snapshots"):
        spec_engine.verify_and_draft(rows, RowAdjustments.constant(ident, len(rows)), [])
    with pytest.raises(EngineError, match="snapshots"):  # an engine without snapshots cannot verify
        ar_engine.verify_and_draft([1], RowAdjustments.constant(ident, 1), [])
    # and says so: the capabilities the API and the benchmark read
    assert not ar_engine.capabilities.speculative and ar_engine.capabilities.fused
    caps = spec_engine.capabilities
    assert caps.speculative and caps.max_verify_rows == spec_engine.n_rs_seq


def test_clover_speculative_mode_on_a_gguf_equals_ar(gguf):
    path = gguf[0]
    kw = {"n_ctx": 256, "n_threads": 2, "n_gpu_layers": N_GPU_LAYERS, "verbose": LOG}
    with Clover(path, mode="ar", **kw) as ar, Clover(path, mode="speculative", **kw) as spec:
        expected = ar.create_completion(PROMPTS["long"], max_tokens=16)
        got = spec.create_completion(PROMPTS["long"], max_tokens=16)
    assert got["choices"][0]["text"] == expected["choices"][0]["text"]
    assert got["clover"]["tokens"] == expected["clover"]["tokens"]
