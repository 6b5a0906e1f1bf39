"""The sampler every mode applies, in numpy (`backend.kept`, `distribution`, `sample`, `confidence`):
llama.cpp's own sampler chain, an exact inverse CDF, and the seeded draws of `policy.Draws`."""

from __future__ import annotations

import ctypes
from collections import Counter
from dataclasses import replace

import llama_cpp as ll
import numpy as np
import pytest
from sampling_stats import assert_samples_follow

from clover_local.backend import (
    GREEDY,
    Draw,
    LogitAdjustment,
    Sampler,
    adjust_logits,
    confidence,
    distribution,
    pick,
    sample,
)
from clover_local.policy import DecodingSettings, Draws

V = 300
SAMPLERS = [
    Sampler(0.7),
    Sampler(1.0, top_k=20),
    Sampler(1.3, top_p=0.8),
    Sampler(0.9, min_p=0.05),
    Sampler(1.1, top_k=50, top_p=0.9, min_p=0.02),
    Sampler(2.0, top_k=1),
    Sampler(1.0, top_p=0.0),
    Sampler(1.5, top_k=V + 5, top_p=1.0),
]


def rows(n: int = 6, seed: int = 0) -> tuple[np.ndarray, LogitAdjustment]:
    """Random logits [n, V] of varied sharpness and an adjustment: a masked token, a penalty, a bias."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, V)) * np.linspace(0.5, 4.0, n)[:, None]
    pos, neg, bias = np.ones(V, np.float32), np.ones(V, np.float32), np.zeros(V, np.float32)
    bias[7] = -np.inf  # the mask token
    pos[[3, 11]], neg[[3, 11]], bias[[3, 11]] = 1 / 1.3, 1.3, -0.5
    bias[42] = 2.0
    return logits.astype(np.float32), LogitAdjustment.from_vectors(pos, neg, bias)


def llama_cpp_chain(row: np.ndarray, s: Sampler) -> dict[int, float]:
    """llama.cpp's CPU samplers in the chain llama-cpp-python builds (`Llama._init_sampler`: top_k,
    top_p, min_p with min_keep 1, temperature) applied to one row of logits: the tokens left and
    their probabilities."""
    chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
    for smpl in (
        ll.llama_sampler_init_top_k(s.top_k),
        ll.llama_sampler_init_top_p(s.top_p, 1),
        ll.llama_sampler_init_min_p(s.min_p, 1),
        ll.llama_sampler_init_temp(s.temperature),
    ):
        ll.llama_sampler_chain_add(chain, smpl)
    data = (ll.llama_token_data * len(row))(
        *(ll.llama_token_data(i, float(x), 0.0) for i, x in enumerate(row))
    )
    cur = ll.llama_token_data_array(data, len(row), -1, False)
    ll.llama_sampler_apply(chain, ctypes.byref(cur))
    ll.llama_sampler_free(chain)
    left = np.array([data[i].logit for i in range(cur.size)], dtype=np.float64)
    p = np.exp(left - left.max())
    return {data[i].id: float(q) for i, q in enumerate(p / p.sum()) if q > 0}


@pytest.mark.parametrize("sampler", SAMPLERS, ids=str)
def test_the_distribution_is_llama_cpps_sampler_chain(sampler):
    """The same tokens kept and the same probabilities as llama.cpp's own samplers give `Llama`."""
    logits, adj = rows()
    dist = distribution(logits, adj, sampler)
    adjusted = adjust_logits(logits, adj)
    for j in range(len(logits)):
        theirs = llama_cpp_chain(adjusted[j], sampler)
        assert set(np.flatnonzero(dist[j] > 0)) == set(theirs)
        np.testing.assert_allclose([dist[j, t] for t in theirs], list(theirs.values()), rtol=1e-5)
    assert (dist[:, 7] == 0).all()  # a -inf token is never drawn


@pytest.mark.parametrize("sampler", SAMPLERS, ids=str)
def test_the_inverse_cdf_at_a_grid_of_uniforms_is_the_distribution(sampler):
    """Uniforms at (i + 1/2) / N put within one of N x p(token) draws on every token: the draw is an
    exact inverse CDF of `distribution`, never a token without probability."""
    logits, adj = rows(3)
    n = 4000
    grid = (np.arange(n) + 0.5) / n
    for j in range(len(logits)):
        tokens, _ = sample(np.repeat(logits[j : j + 1], n, axis=0), adj, Draw(sampler, grid))
        share = np.bincount(tokens, minlength=V) / n
        p = distribution(logits[j], adj, sampler)
        assert np.abs(share - p).max() <= 1 / n + 1e-12
        assert (p[tokens] > 0).all()


def test_seeded_draws_sample_the_distribution():
    """Uniforms from `policy.Draws`, as a request draws them: chi-square and total variation bounds."""
    logits, adj = rows(2)
    s = DecodingSettings(mask_token_id=7, sampler=Sampler(1.2, top_k=40, top_p=0.95), seed=11)
    draws, n = Draws(s), 3000
    for j in range(len(logits)):
        tokens, _ = sample(np.repeat(logits[j : j + 1], n, axis=0), adj, draws(n))
        expected = {(t,): float(p) for t, p in enumerate(distribution(logits[j], adj, s.sampler)) if p > 0}
        assert_samples_follow(Counter((int(t),) for t in tokens), expected, n)


def test_the_confidence_is_the_models_probability_of_the_drawn_token():
    """Whatever the sampler drew: softmax of the adjusted logits at temperature 1 over the whole
    vocabulary (not the cut, tempered distribution); top_k 1 is the greedy pick, bit for bit."""
    logits, adj = rows()
    u = np.random.default_rng(1).random(len(logits))
    model = distribution(logits, adj, Sampler(1.0))
    for sampler in SAMPLERS:
        tokens, conf = sample(logits, adj, Draw(sampler, u))
        np.testing.assert_allclose(conf, model[np.arange(len(logits)), tokens], rtol=1e-12)
        adjusted = adjust_logits(np.asarray(logits, dtype=np.float64), adj)
        np.testing.assert_array_equal(conf, confidence(adjusted, tokens))
    greedy, greedy_conf = pick(logits, adj)
    tokens, conf = sample(logits, adj, Draw(Sampler(0.3, top_k=1), u))
    np.testing.assert_array_equal(tokens, greedy)
    np.testing.assert_array_equal(conf, greedy_conf)


def test_draws_are_seeded_and_split_like_their_passes():
    """A seed gives the same uniforms; a fused pass's 1 + B uniforms are a commit's 1 then a
    preview's B (so fusing changes no draw); greedy settings draw nothing."""
    s = DecodingSettings(mask_token_id=0, sampler=Sampler(0.8), seed=5)
    a, b = Draws(s), Draws(s)
    fused = a(1 + 8).uniforms
    np.testing.assert_array_equal(fused, np.concatenate([b(1).uniforms, b(8).uniforms]))
    assert not np.array_equal(Draws(replace(s, seed=6))(9).uniforms, fused)
    assert ((fused >= 0) & (fused < 1)).all() and a(3).sampler == s.sampler
    assert Draws(replace(s, sampler=GREEDY))(4) is None


def test_the_sampler_says_what_it_applies():
    assert str(GREEDY) == "greedy" and GREEDY.greedy
    assert str(Sampler(0.7)) == "temperature 0.7"
    assert str(Sampler(0.8, top_k=40, top_p=0.95, min_p=0.05)) == (
        "temperature 0.8, top_k 40, top_p 0.95, min_p 0.05"
    )
