"""The [ours] operators against literal, loop-by-loop readings of docs/model.md 2.3 and 2.4."""

from __future__ import annotations

import math

import numpy as np

from clover_local.reference.gdn import block_softmax_history_mix, causal_conv, gated_delta_rule, preview_conv
from clover_local.reference.moe import block_expert_coreset, top_k_routing
from clover_local.reference.ops import l2norm, silu

rng = np.random.default_rng(11)


def test_preview_conv_matches_the_formula():
    kernel, n_rows, channels = 4, 6, 5
    state, block = rng.normal(size=(kernel - 1, channels)), rng.normal(size=(n_rows, channels))
    w, r = rng.normal(size=(channels, kernel)), rng.normal(size=(channels, kernel - 1))
    x = np.concatenate([state, block])
    expected = np.zeros((n_rows, channels))
    for t in range(n_rows):
        for c in range(channels):
            acc = sum(w[c, i] * x[t + i, c] for i in range(kernel))
            acc += sum(r[c, d - 1] * block[t + d, c] for d in range(1, kernel) if t + d < n_rows)
            expected[t, c] = acc
    np.testing.assert_allclose(preview_conv(state, block, w, r), silu(expected), rtol=1e-12, atol=1e-12)


def test_preview_conv_without_right_taps_is_the_causal_conv():
    state, block, w = rng.normal(size=(3, 4)), rng.normal(size=(5, 4)), rng.normal(size=(4, 4))
    y, new_state = causal_conv(state, block, w)
    np.testing.assert_array_equal(preview_conv(state, block, w, np.zeros((4, 3))), y)
    np.testing.assert_array_equal(new_state, block[-3:])


def test_block_softmax_history_mix_matches_the_formula():
    n_rows, heads, dk, dv = 5, 3, 4, 6
    q, k = l2norm(rng.normal(size=(n_rows, heads, dk))), l2norm(rng.normal(size=(n_rows, heads, dk)))
    v, state = rng.normal(size=(n_rows, heads, dv)), rng.normal(size=(heads, dk, dv))
    lam, hb, hc = rng.uniform(1, 4, heads), rng.normal(size=heads), rng.normal(size=heads)
    expected = np.zeros((n_rows, heads, dv))
    for h in range(heads):
        for t in range(n_rows):
            u = state[h].T @ (q[t, h] / math.sqrt(dk))
            s = [lam[h] * q[t, h] @ k[j, h] for j in range(n_rows)] + [hb[h]]
            p = np.exp(s) / np.sum(np.exp(s))
            expected[t, h] = sum(p[j] * v[j, h] for j in range(n_rows)) + p[-1] * hc[h] * u
    np.testing.assert_allclose(block_softmax_history_mix(q, k, v, state, lam, hb, hc), expected, atol=1e-12)


def test_gated_delta_rule_matches_the_spec_recurrence():
    n_rows, heads, dk, dv = 4, 2, 3, 5
    q, k = l2norm(rng.normal(size=(n_rows, heads, dk))), l2norm(rng.normal(size=(n_rows, heads, dk)))
    v, g, beta = (
        rng.normal(size=(n_rows, heads, dv)),
        -rng.uniform(0, 1, (n_rows, heads)),
        rng.uniform(0, 1, (n_rows, heads)),
    )
    s0 = rng.normal(size=(heads, dk, dv))
    out, s_end = gated_delta_rule(q, k, v, g, beta, s0)
    for h in range(heads):
        s = s0[h].copy()
        for t in range(n_rows):
            s = math.exp(g[t, h]) * s
            delta = beta[t, h] * (v[t, h] - s.T @ k[t, h])
            s = s + np.outer(k[t, h], delta)
            np.testing.assert_allclose(out[t, h], s.T @ q[t, h], atol=1e-12)
        np.testing.assert_allclose(s_end[h], s, atol=1e-12)


def test_coreset_keeps_the_smallest_prefix_reaching_top_p():
    # candidates (top-2): row 0 -> experts 0 (.5), 1 (.3); row 1 -> 1 (.4), 2 (.35); aggregates
    # 0: .5, 1: .7, 2: .35 (total 1.55); expert 3 is never a candidate
    probs = np.array([[0.5, 0.3, 0.1, 0.1], [0.05, 0.4, 0.35, 0.2]])
    assert block_expert_coreset(probs, 2, 0.4).tolist() == [False, True, False, False]  # .7 >= .62
    assert block_expert_coreset(probs, 2, 0.5).tolist() == [True, True, False, False]  # .7 < .775
    assert block_expert_coreset(probs, 2, 1.0).tolist() == [True, True, True, False]


def test_coreset_ties_go_to_the_lower_expert():
    probs = np.array([[0.4, 0.1, 0.4, 0.1]])
    assert block_expert_coreset(probs, 2, 0.5).tolist() == [True, False, False, False]


def test_routing_within_a_coreset_renormalises_over_the_chosen():
    probs = np.array([[0.5, 0.3, 0.15, 0.05]])
    ids, weights = top_k_routing(probs, 2, np.array([False, True, True, True]))
    assert ids.tolist() == [[1, 2]]
    np.testing.assert_allclose(weights, [[0.3 / 0.45, 0.15 / 0.45]])
    ids, weights = top_k_routing(probs, 2, np.array([False, False, True, False]))  # fewer kept than k
    assert ids.tolist() == [[2]] and weights.tolist() == [[1.0]]
