"""The decoding policy: fill rule, logit adjustment, response-only penalties, ramps, stops, length."""

from __future__ import annotations

import numpy as np
import pytest

from clover_local import policy
from clover_local.backend import LogitAdjustment, adjust_logits, pick
from clover_local.model.config import GenerationDefaults
from clover_local.policy import DecodingSettings, RequestTooLong

MASK = 99
V = 100


def settings(**kw) -> DecodingSettings:
    return DecodingSettings(mask_token_id=MASK, block_size=8, max_new_tokens=64, **kw)


def test_fill_rule_takes_every_confident_position():
    probs = np.array([0.99, 0.2, 0.96, 0.97, 0.5])
    masked = np.array([True, True, True, False, True])
    assert policy.fill_positions(probs, masked, 0.95).tolist() == [0, 2]  # 3 is already resolved


def test_fill_rule_falls_back_to_the_single_most_confident():
    probs = np.array([0.3, 0.6, 0.9, 0.6])
    masked = np.array([True, True, False, True])
    assert policy.fill_positions(probs, masked, 0.95).tolist() == [1]  # tie 1/3: lower position
    assert policy.fill_positions(probs, np.zeros(4, bool), 0.95).tolist() == []


def test_adjustment_formula():
    logits = np.array([[2.0, -2.0, 0.0, 1.0]])
    adj = LogitAdjustment.from_vectors(
        np.array([0.5, 0.5, 1, 1]), np.array([2.0, 2.0, 1, 1]), np.array([0, 0, 0.5, -1])
    )
    np.testing.assert_allclose(adjust_logits(logits, adj), [[1.0, -4.0, 0.5, 0.0]])


def test_pick_returns_argmax_and_probability_after_adjustment():
    logits = np.array([[1.0, 3.0, 2.0], [0.0, 0.0, 5.0]])
    adj = LogitAdjustment.from_vectors(np.ones(3), np.ones(3), np.array([0.0, -2.5, 0.0]))
    tokens, probs = pick(logits, adj)
    assert tokens.tolist() == [2, 2]
    e = np.exp([1.0, 0.5, 2.0])
    np.testing.assert_allclose(probs[0], e[2] / e.sum())


def test_penalties_count_response_tokens_only():
    s = settings(presence_penalty=0.5, frequency_penalty=0.25, repetition_penalty=2.0)
    prompt = [5, 5, 6]
    seen = policy.resolved_response([7, 7], [8, MASK, 7, MASK], MASK)
    assert seen == [7, 7, 8, 7]
    adj = policy.adjustment(s, V, prompt, seen)
    assert adj.bias[5] == adj.bias[6] == 0 and adj.pos_scale[5] == 1 and adj.neg_scale[6] == 1
    assert adj.bias[7] == pytest.approx(-(0.5 + 0.25 * 3)) and adj.bias[8] == pytest.approx(-(0.5 + 0.25))
    assert adj.pos_scale[7] == 0.5 and adj.neg_scale[7] == 2.0
    assert adj.pos_scale[MASK] == 1


def test_the_mask_token_is_never_picked():
    adj = policy.adjustment(settings(), V, [3], [])
    logits = np.zeros((2, V))
    logits[:, MASK] = 50.0
    tokens, probs = pick(logits, adj)
    assert MASK not in tokens.tolist() and probs == pytest.approx([1 / (V - 1)] * 2)


def test_ramp_grows_linearly_from_start_to_budget():
    values = [policy.ramp(n, 100, 0.5, 4.0) for n in (0, 50, 60, 75, 100, 150)]
    assert values == pytest.approx([0, 0, 0.8, 2.0, 4.0, 4.0])
    assert policy.ramp(99, 100, 0.5, 0.0) == 0


def test_stop_ramp_biases_stop_tokens_and_think_ramp_only_while_thinking():
    s = settings(
        stop_token_ids=(1, 2),
        stop_ramp_start=0.5,
        stop_ramp_max=4.0,
        think_ramp_start=0.0,
        think_ramp_max=2.0,
        think_start_id=10,
        think_end_id=11,
    )
    response = [3] * 48  # 48 of 64: stop ramp 4 * (48 - 32) / 32 = 2, think ramp 2 * 48 / 64 = 1.5
    thinking = policy.adjustment(s, V, [4, 10], response)
    assert thinking.bias[1] == thinking.bias[2] == pytest.approx(2.0)
    assert thinking.bias[11] == pytest.approx(1.5)
    done = policy.adjustment(s, V, [4, 10], [11, *response[1:]])
    assert done.bias[11] == pytest.approx(-0.0) and done.bias[1] == pytest.approx(2.0)
    early = policy.adjustment(s, V, [4, 10], [3] * 8)
    assert early.bias[1] == 0 and early.bias[11] == pytest.approx(0.25)


def test_stop_inside_a_block_cuts_the_extent():
    s = settings(stop_token_ids=(1,))
    assert policy.block_extent([5, 6, MASK, 1, 7, 1, MASK, MASK], s, 64) == (4, True)
    assert policy.block_extent([5, MASK, MASK, MASK, MASK, MASK, MASK, MASK], s, 64) == (8, False)
    assert policy.block_extent([5, 6, MASK, 1, 7, 1, MASK, MASK], s, 3) == (3, False)  # budget first


def test_length_limit_counts_whole_blocks():
    s = DecodingSettings(mask_token_id=MASK, block_size=32, max_new_tokens=100, context_limit=1000)
    policy.check_length(1000 - 128, s)  # 100 new tokens need 4 blocks = 128 positions
    with pytest.raises(RequestTooLong) as e:
        policy.check_length(1000 - 127, s)
    msg = str(e.value)
    for number in ("873", "128", "100", "1001", "1000", "96"):
        assert number in msg
    with pytest.raises(ValueError, match="empty"):
        policy.check_length(0, s)


def test_settings_from_generation_defaults():
    gen = GenerationDefaults.from_dict({"threshold": 0.9, "eos_token_id": [3, 4], "max_new_tokens": 10})
    s = DecodingSettings.from_defaults(gen, mask_token_id=MASK, max_new_tokens=5, threshold=None)
    assert (s.threshold, s.max_new_tokens, s.stop_token_ids, s.mask_token_id) == (0.9, 5, (3, 4), MASK)


def test_thinking_follows_the_last_think_tag():
    s = settings(think_start_id=10, think_end_id=11)
    assert policy.thinking([4, 10, 5], [6], s)  # template opened <think>
    assert not policy.thinking([4, 10, 11, 5], [6], s)  # enable_thinking=false: closed in the prompt
    assert not policy.thinking([4, 10], [6, 11, 7], s)
    assert policy.thinking([4], [10, 6], s)
    assert not policy.thinking([4, 10], [6], settings())  # no think ids known


@pytest.mark.parametrize(
    "kw",
    [
        {},  # neutral penalties, no ramp: the same adjustment every step
        {"presence_penalty": 0.5, "frequency_penalty": 0.25, "repetition_penalty": 1.3},
        {"stop_ramp_start": 0.25, "stop_ramp_max": 4.0, "think_ramp_start": 0.5, "think_ramp_max": 2.0},
        # float32 rounding of the counted rows against the vectorised formula, ramps on the same rows
        {"presence_penalty": 0.1, "frequency_penalty": 0.3, "repetition_penalty": 1.1, "stop_ramp_start": 0.1,
         "stop_ramp_max": 3.3, "think_ramp_start": 0.2, "think_ramp_max": 0.7},
    ],
)  # fmt: skip
def test_running_adjustment_equals_the_adjustment_of_the_whole_response(kw):
    s = settings(stop_token_ids=(3,), think_start_id=5, think_end_id=6, **kw)
    vocab, prompt = V, [1, 5, 2]  # the prompt ends inside a think section
    running = policy.RunningAdjustment(s, vocab, prompt)
    rng = np.random.default_rng(0)
    response: list[int] = []
    # seen tokens new and repeated, then the special ones too: the stop token, </think>, the mask
    tokens = [*rng.integers(7, 20, size=30), 6, *rng.integers(7, 20, size=20), 3, MASK, 3, 99, 0]
    for token in tokens:
        expected = policy.adjustment(s, vocab, prompt, response).vectors()
        got = running.adjustment().vectors()
        for e, g in zip(expected, got, strict=True):
            np.testing.assert_array_equal(g, e)
        running.append(int(token))
        response.append(int(token))
