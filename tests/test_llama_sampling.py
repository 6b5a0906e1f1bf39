"""The sampler in the graph (`build_clover_sample`): each head row's draw at its uniform against the
numpy reference (`backend.sample`, `distribution`) on F32 GGUFs of the tiny checkpoints."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from sampling_stats import assert_samples_follow
from test_llama_engine import PROB_RTOL, engine

from clover_local.backend import Draw, LogitAdjustment, Sampler, distribution, pick, sample, split_draw
from clover_local.llama import unavailable
from clover_local.model.config import CheckpointConfig
from clover_local.policy import DecodingSettings, Draws, adjustment
from clover_local.reference.model import ReferenceModel

SKIP = unavailable()
pytestmark = [pytest.mark.llama, pytest.mark.skipif(SKIP is not None, reason=SKIP or "")]

SAMPLERS = [
    Sampler(1.0),
    Sampler(0.6),
    Sampler(1.5, top_k=30),
    Sampler(1.5, top_p=0.9),
    Sampler(1.2, min_p=0.05),
    Sampler(1.3, top_k=60, top_p=0.8, min_p=0.02),
]
PROMPT = [475, 84, 82, 269, 198, 432, 295, 266, 392, 281, 380, 30, 476]


def setup(gguf_factory, preset: str):
    """(reference model, GGUF path, a penalising adjustment with the mask at -inf, an 8-row block)."""
    ckpt, path = gguf_factory(preset)
    cfg = CheckpointConfig.from_dir(ckpt)
    mask = cfg.model.mask_token_id
    s = DecodingSettings(mask_token_id=mask, presence_penalty=1.0, repetition_penalty=1.3)
    adj = adjustment(s, cfg.model.vocab_size, PROMPT, [17, 230, 5])
    block = [17, mask, 230, mask, mask, 5, mask, mask]
    return ReferenceModel.from_checkpoint(ckpt), path, adj, block


@pytest.mark.parametrize(
    "preset,passes", [("tiny", 40), ("tiny-qwen-vocab", 8)], ids=["2-chunks", "128-chunks"]
)
def test_every_pass_draws_what_the_reference_draws_at_the_same_uniforms(gguf_factory, preset, passes):
    """Previews, a commit's last row and a fused pass: the same token at the same uniform (a draw
    within float error of a CDF boundary may differ: at most 1 in 200), and its confidence."""
    ref, path, adj, block = setup(gguf_factory, preset)
    state = ref.new_state()
    rng = np.random.default_rng(0)
    drawn = differ = 0

    def check(got: tuple, logits: np.ndarray, draw: Draw) -> None:
        nonlocal drawn, differ
        tokens, probs = (np.atleast_1d(x) for x in got)
        want, want_probs = sample(logits, adj, draw)
        same = tokens == want
        drawn, differ = drawn + len(tokens), differ + int((~same).sum())
        np.testing.assert_allclose(probs[same], want_probs[same], rtol=PROB_RTOL)
        assert (distribution(logits, adj, draw.sampler)[np.arange(len(tokens)), tokens] > 0).all()

    with engine(path) as eng:
        eng.prefill(PROMPT, adj)
        ref.commit(PROMPT, state)
        ahead = ref.preview(block, state)
        for sampler in SAMPLERS:
            for _ in range(passes):
                draw = Draw(sampler, rng.random(len(block)))
                check(eng.preview(block, adj, draw=draw), ahead, draw)
        rows, sampler = [17, 17, 230], SAMPLERS[-1]
        draw = Draw(sampler, rng.random(1 + len(block)))
        (tok, prob), picks = eng.commit_and_preview(rows, adj, block, draw=draw)
        first, rest = split_draw(draw)
        causal = ref.commit(rows, state)[-1:]
        check((tok, prob), causal, first)
        check(picks, ref.preview(block, state), rest)
        draw = Draw(sampler, rng.random(1))
        check(eng.commit([9], adj, draw), ref.commit([9], state)[-1:], draw)
    assert drawn > 300 and differ <= drawn // 200


@pytest.mark.parametrize(
    "sampler", [Sampler(1.0), Sampler(2.0, top_k=20, top_p=0.99, min_p=0.001)], ids=["full", "cut"]
)
def test_each_rows_draws_follow_the_reference_distribution(gguf_factory, sampler):
    """6000 previews at seeded uniforms (`policy.Draws`, as a request draws them): every row's
    tokens against the exact distribution of the reference's logits (over the whole vocabulary, or
    the 2 to 17 tokens the cut keeps), chi-square at the 0.1% level and a total variation that
    direct sampling would exceed only 0.1% of the time (bounds that catch a temperature 15% off)."""
    ref, path, adj, block = setup(gguf_factory, "tiny")
    state = ref.new_state()
    ref.commit(PROMPT, state)
    dist = distribution(ref.preview(block, state), adj, sampler)
    draws, n = Draws(DecodingSettings(mask_token_id=0, sampler=sampler, seed=4)), 6000
    with engine(path) as eng:
        eng.prefill(PROMPT, adj)
        tokens = np.array([eng.preview(block, adj, draw=draws(len(block)))[0] for _ in range(n)])
    assert (dist > 0.01).sum(axis=1).min() >= 2  # no row is one-hot
    for j in range(len(block)):
        expected = {(t,): float(p) for t, p in enumerate(dist[j]) if p > 0}
        assert_samples_follow(Counter((int(t),) for t in tokens[:, j]), expected, n)


def test_top_k_one_draws_the_greedy_pick_bit_for_bit(gguf_factory):
    """The sampled head keeps the greedy head's confidence: with top_k 1 it returns the argmax and
    the very same probability, at any temperature and uniform."""
    ref, path, adj, block = setup(gguf_factory, "tiny")
    with engine(path) as eng:
        eng.prefill(PROMPT, adj)
        tokens, probs = eng.preview(block, adj)
        u = np.random.default_rng(3).random(len(block))
        for temperature in (0.2, 3.0):
            got = eng.preview(block, adj, draw=Draw(Sampler(temperature, top_k=1), u))
            np.testing.assert_array_equal(got[0], tokens)
            np.testing.assert_array_equal(got[1], probs)
        state = ref.new_state()
        ref.commit(PROMPT, state)
        np.testing.assert_array_equal(tokens, pick(ref.preview(block, state), adj)[0])


def test_a_draw_needs_one_uniform_per_head_row(gguf_factory):
    ref, path, adj, block = setup(gguf_factory, "tiny")
    with engine(path) as eng:
        eng.prefill(PROMPT, LogitAdjustment.identity(eng.vocab_size))
        with pytest.raises(ValueError, match="needs 8 uniforms, got 3"):
            eng.preview(block, adj, draw=Draw(Sampler(1.0), np.zeros(3)))
