"""Block diffusion with a block's commit fused with the next block's first preview
(`backend.FusedBackend`): one pass per block boundary, the same trace as the unfused loop."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from test_llama_engine import PROB_RTOL, engine
from test_llama_speculative import assert_same_state

from clover_local.backend import GREEDY, Capabilities, LogitAdjustment, Sampler
from clover_local.llama import unavailable
from clover_local.loops import BlockEvent, PassEvent, Result, diffusion_loop
from clover_local.model.config import CheckpointConfig
from clover_local.policy import DecodingSettings, adjustment, resolved_response
from clover_local.reference.backend import NumpyBackend
from clover_local.reference.model import ReferenceModel

SKIP = unavailable()
needs_llama = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")

PROMPTS = {"long": [475, 84, 82, 269, 198, 432, 295, 266, 392, 281, 380, 30, 476], "one-token": [302]}
# penalties and a stop ramp: every pass's adjustment depends on the response so far
POLICY = {"presence_penalty": 0.5, "repetition_penalty": 1.3, "stop_ramp_start": 0.2, "stop_ramp_max": 4.0}
# a sampled decode draws its uniforms in pass order: a fused pass's 1 + B are the commit's and the preview's
SAMPLERS = pytest.mark.parametrize("sampler", [GREEDY, Sampler(1.5, top_k=100, min_p=0.01)], ids=str)


class Unfused:
    """A backend without `commit_and_preview`: the loop falls back to a commit and a preview."""

    capabilities = Capabilities()

    def __init__(self, backend):
        self.backend, self.vocab_size = backend, backend.vocab_size

    def prefill(self, tokens, adj, draw=None):
        return self.backend.prefill(tokens, adj, draw)

    def preview(self, block, adj, routing=None, draw=None):
        return self.backend.preview(block, adj, routing, draw)

    def commit(self, tokens, adj, draw=None):
        return self.backend.commit(tokens, adj, draw)


class Counting(Unfused):
    """Records each call by name (a fused call is one entry)."""

    capabilities = Capabilities(fused=True)

    def __init__(self, backend):
        super().__init__(backend)
        self.calls: list[str] = []

    def prefill(self, tokens, adj, draw=None):
        self.calls.append("prefill")
        return super().prefill(tokens, adj, draw)

    def preview(self, block, adj, routing=None, draw=None):
        self.calls.append("preview")
        return super().preview(block, adj, routing, draw)

    def commit(self, tokens, adj, draw=None):
        self.calls.append("commit")
        return super().commit(tokens, adj, draw)

    def commit_and_preview(self, tokens, adj, block, routing=None, draw=None):
        self.calls.append("commit_and_preview")
        return self.backend.commit_and_preview(tokens, adj, block, routing, draw)


def settings(ckpt: Path, block_size: int, max_new_tokens: int, **kw) -> DecodingSettings:
    cfg = CheckpointConfig.from_dir(ckpt)
    return DecodingSettings.from_defaults(
        cfg.generation,
        cfg.model.mask_token_id,
        block_size=block_size,
        max_new_tokens=max_new_tokens,
        **{**POLICY, **kw},
    )


def trace(backend, prompt: Sequence[int], s: DecodingSettings) -> tuple[list[tuple], Result, np.ndarray]:
    """Everything of the events but their timings and probabilities; the `Result`; the passes'
    probabilities [passes, block_size]."""
    events = list(diffusion_loop(backend, prompt, s))
    out: list[tuple] = []
    probs = []
    for e in events[:-1]:
        if isinstance(e, PassEvent):
            out.append(("pass", e.block, e.pass_index, e.position, e.filled, e.tokens))
            probs.append(e.probs)
        else:
            assert isinstance(e, BlockEvent)
            out.append(("block", e.block, e.tokens, e.passes))
    result = events[-1]
    assert isinstance(result, Result)
    return out, result, np.array(probs)


def same_trace(got, want, atol: float = 0.0) -> None:
    assert got[0] == want[0]
    r, w = got[1], want[1]
    assert (r.tokens, r.finish_reason, r.passes_per_block, r.tokens_per_pass) == (
        w.tokens,
        w.finish_reason,
        w.passes_per_block,
        w.tokens_per_pass,
    )
    np.testing.assert_allclose(got[2], want[2], rtol=0, atol=atol)


def assert_fused_calls(calls: list[str], result: Result) -> None:
    """N blocks: the prefill, N - 1 fused calls, one plain commit (the last block's), and a preview
    for every pass that was not fused."""
    n = len(result.passes_per_block)
    assert calls[0] == "prefill" and calls[-1] == "commit"
    assert calls.count("commit_and_preview") == n - 1 and calls.count("commit") == 1
    assert calls.count("preview") == len(result.tokens_per_pass) - (n - 1)


# -- the numpy reference: the executable spec ---------------------------------------------------


@pytest.fixture(scope="module")
def reference(tiny_checkpoint):
    return NumpyBackend(ReferenceModel.from_checkpoint(tiny_checkpoint))


@SAMPLERS
@pytest.mark.parametrize("block_size,budget", [(4, 14), (8, 24)])
def test_reference_fused_loop_has_the_unfused_trace(tiny_checkpoint, reference, block_size, budget, sampler):
    s = settings(tiny_checkpoint, block_size, budget, sampler=sampler, seed=3)
    for prompt in PROMPTS.values():
        counting = Counting(reference)
        got = trace(counting, prompt, s)
        same_trace(got, trace(Unfused(reference), prompt, s))
        assert len(got[1].passes_per_block) > 1
        assert_fused_calls(counting.calls, got[1])


def test_no_fused_call_after_a_stop(tiny_checkpoint, reference):
    s = settings(tiny_checkpoint, 4, 24)
    prompt = PROMPTS["long"]
    tokens = trace(Unfused(reference), prompt, s)[1].tokens
    s = settings(tiny_checkpoint, 4, 24, stop_token_ids=(tokens[6],))  # a stop in the second block
    counting = Counting(reference)
    got = trace(counting, prompt, s)
    same_trace(got, trace(Unfused(reference), prompt, s))
    assert got[1].finish_reason == "stop" and len(got[1].passes_per_block) == 2
    assert_fused_calls(counting.calls, got[1])


def test_the_fused_preview_has_the_next_blocks_first_adjustment(tiny_checkpoint):
    """The fused preview runs under the commit's adjustment: the one the next block's first preview
    (an all-mask block, nothing of it resolved) computes."""
    s = settings(tiny_checkpoint, 4, 24)
    prompt, response = PROMPTS["long"], [17, 17, 230, 5, 17, 9]
    vocab = CheckpointConfig.from_dir(tiny_checkpoint).model.vocab_size
    first = adjustment(s, vocab, prompt, resolved_response(response, [s.mask_token_id] * 4, s.mask_token_id))
    commit = adjustment(s, vocab, prompt, response)
    np.testing.assert_array_equal(first.pos_scale, commit.pos_scale)
    np.testing.assert_array_equal(first.neg_scale, commit.neg_scale)
    np.testing.assert_array_equal(first.bias, commit.bias)


# -- the llama.cpp engine -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def gguf(gguf_factory):
    return gguf_factory("tiny")


@pytest.mark.llama
@needs_llama
@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "speculative"])
@pytest.mark.parametrize("top_p", [1.0, 0.5], ids=["no-coreset", "coreset"])
@pytest.mark.parametrize("n_rows", [1, 5])
def test_engine_commit_and_preview_equals_a_commit_then_a_preview(gguf, speculative, top_p, n_rows):
    """One graph on any engine (no recurrent-state snapshots needed): the picks of a commit and of
    a preview after it, and the commit's state."""
    ckpt, path = gguf
    mask = CheckpointConfig.from_dir(ckpt).model.mask_token_id
    prompt, rows, block = PROMPTS["long"], [17, 17, 230, 5, 17][:n_rows], [mask] * 8
    coreset = {"coreset": top_p < 1, "coreset_top_p": top_p}
    with engine(path, speculative=speculative, **coreset) as fused, engine(path, **coreset) as ref:
        s = settings(ckpt, 8, 24)
        ident = LogitAdjustment.identity(fused.vocab_size)
        adj = adjustment(s, fused.vocab_size, prompt, [*rows, 17])
        assert (fused.n_rs_seq > 0) == speculative
        fused.prefill(prompt, ident)
        ref.prefill(prompt, ident)
        (tok, prob), (btok, bprob) = fused.commit_and_preview(rows, adj, block)
        want_tok, want_prob = ref.commit(rows, adj)
        want_btok, want_bprob = ref.preview(block, adj)

        assert tok == want_tok and prob == pytest.approx(want_prob, rel=PROB_RTOL)
        np.testing.assert_array_equal(btok, want_btok)
        np.testing.assert_allclose(bprob, want_bprob, rtol=PROB_RTOL, atol=1e-4)
        assert fused.n_past == ref.n_past == len(prompt) + len(rows)
        # a 1-row commit runs the autoregressive delta-rule kernel, the fused pass the chunked one
        assert_same_state(fused.state_bytes(), ref.state_bytes(), atol=1e-5 if n_rows == 1 else 0)
        # and the next passes read the same state
        np.testing.assert_allclose(fused.preview_logits(block), ref.preview_logits(block), rtol=0, atol=1e-4)
        np.testing.assert_allclose(fused.causal_logits([3, 4]), ref.causal_logits([3, 4]), rtol=0, atol=1e-4)


@pytest.mark.llama
@needs_llama
def test_engine_commit_and_preview_beyond_a_ubatch_runs_two_passes(gguf):
    ckpt, path = gguf
    mask = CheckpointConfig.from_dir(ckpt).model.mask_token_id
    prompt, rows, block = PROMPTS["long"], [17, 17, 230, 5, 17], [mask] * 8
    with engine(path, n_ubatch=8) as small, engine(path) as ref:
        ident = LogitAdjustment.identity(small.vocab_size)
        small.prefill(prompt, ident)
        ref.prefill(prompt, ident)
        anchor, (btok, _) = small.commit_and_preview(rows, ident, block)
        assert anchor[0] == ref.commit(rows, ident)[0]
        np.testing.assert_array_equal(btok, ref.preview(block, ident)[0])
        with pytest.raises(ValueError, match="at least one token"):
            small.commit_and_preview([], ident, block)


@pytest.mark.llama
@needs_llama
@SAMPLERS
@pytest.mark.parametrize("prompt_name", list(PROMPTS))
@pytest.mark.parametrize("block_size,budget", [(4, 14), (8, 24)])
def test_engine_fused_loop_has_the_unfused_trace(gguf, prompt_name, block_size, budget, sampler):
    """Also the reference's tokens: one policy, and with a sampler the same draws at the same seed."""
    ckpt, path = gguf
    s = settings(ckpt, block_size, budget, sampler=sampler, seed=3)
    prompt = PROMPTS[prompt_name]
    with engine(path) as eng:
        counting = Counting(eng)
        got = trace(counting, prompt, s)
        same_trace(got, trace(Unfused(eng), prompt, s), atol=1e-4)
    assert len(got[1].passes_per_block) > 1
    assert_fused_calls(counting.calls, got[1])
    assert got[1].tokens == trace(NumpyBackend(ReferenceModel.from_checkpoint(ckpt)), prompt, s)[1].tokens
