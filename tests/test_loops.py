"""The block-diffusion loop: event trace, stops, budget, length check, alignment, and the numpy backend."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from clover_local.backend import Capabilities, LogitAdjustment, pick
from clover_local.loops import BlockEvent, PassEvent, Result, aligned_candidates, complete, diffusion_loop
from clover_local.model.config import CheckpointConfig
from clover_local.policy import DecodingSettings, RequestTooLong
from clover_local.reference.backend import NumpyBackend
from clover_local.reference.model import ReferenceModel

MASK, STOP = 99, 1


class ScriptedBackend:
    """Predicts a fixed response: the candidate for position p is `target[p]` with `confidence[p]`."""

    vocab_size = 100
    capabilities = Capabilities()

    def __init__(self, prompt_len: int, target: Sequence[int], confidence: Sequence[float]):
        self.prompt_len, self.target, self.confidence = prompt_len, list(target), list(confidence)
        self.calls: list[tuple[str, list[int]]] = []
        self.n_past = 0

    def _at(self, pos: int) -> tuple[int, float]:
        i = pos - self.prompt_len
        return (self.target[i], self.confidence[i]) if i < len(self.target) else (2, 0.5)

    def prefill(self, tokens: Sequence[int], adj: LogitAdjustment, draw=None) -> tuple[int, float]:
        self.calls.append(("prefill", list(tokens)))
        self.n_past = len(tokens)
        return self._at(self.n_past)

    def preview(
        self, block: Sequence[int], adj: LogitAdjustment, routing=None, draw=None
    ) -> tuple[np.ndarray, np.ndarray]:
        self.calls.append(("preview", list(block)))
        rows = [self._at(self.n_past + i + 1) for i in range(len(block))]  # row i predicts position i + 1
        return np.array([t for t, _ in rows]), np.array([p for _, p in rows])

    def commit(self, tokens: Sequence[int], adj: LogitAdjustment, draw=None) -> tuple[int, float]:
        self.calls.append(("commit", list(tokens)))
        self.n_past += len(tokens)
        return self._at(self.n_past)


def settings(**kw) -> DecodingSettings:
    base = {
        "mask_token_id": MASK,
        "block_size": 4,
        "threshold": 0.9,
        "max_new_tokens": 12,
        "stop_token_ids": (STOP,),
    }
    return DecodingSettings(**{**base, **kw})


def run(backend, prompt, s) -> tuple[list[PassEvent], list[BlockEvent], Result]:
    events = list(diffusion_loop(backend, prompt, s))
    result = events[-1]
    assert isinstance(result, Result) and not any(isinstance(e, Result) for e in events[:-1])
    return (
        [e for e in events if isinstance(e, PassEvent)],
        [e for e in events if isinstance(e, BlockEvent)],
        result,
    )


def test_alignment_shifts_preview_rows_by_one():
    tokens, probs = aligned_candidates(
        (7, 0.3), np.array([10, 11, 12, 13]), np.array([0.1, 0.2, 0.4, 0.8]), 1
    )
    assert tokens.tolist() == [7, 10, 11, 12] and probs.tolist() == [0.3, 0.1, 0.2, 0.4]
    tokens, _ = aligned_candidates((7, 0.3), np.array([10, 11, 12, 13]), np.ones(4), 0)
    assert tokens.tolist() == [10, 11, 12, 13]


def test_confident_positions_fill_together_and_the_fallback_fills_one():
    # block 0: positions 0, 1, 3 sure in pass 0; position 2 via the fallback in pass 1
    backend = ScriptedBackend(2, [5, 6, 7, 8, 9, 10, 11, 12], [0.95, 0.99, 0.5, 0.97, 1, 1, 1, 1])
    passes, blocks, result = run(backend, [3, 4], settings(max_new_tokens=8))
    assert [(e.block, e.pass_index, e.filled) for e in passes] == [
        (0, 0, (0, 1, 3)),
        (0, 1, (2,)),
        (1, 0, (0, 1, 2, 3)),
    ]
    assert passes[0].tokens == (5, 6, MASK, 8)
    assert result.tokens == (5, 6, 7, 8, 9, 10, 11, 12) and result.finish_reason == "length"
    assert result.passes_per_block == (2, 1) and result.tokens_per_pass == (3, 1, 4)
    assert [b.tokens for b in blocks] == [(5, 6, 7, 8), (9, 10, 11, 12)]


def test_stop_inside_a_block_truncates_and_commits_through_the_stop():
    backend = ScriptedBackend(1, [5, 6, 7, 8, 9, STOP, 10, 11], [1.0] * 8)
    passes, blocks, result = run(backend, [3], settings())
    assert result.tokens == (5, 6, 7, 8, 9, STOP) and result.finish_reason == "stop"
    assert blocks[-1].tokens == (9, STOP)
    assert backend.calls[-1] == ("commit", [9, STOP])  # state = prompt + every returned token
    assert backend.n_past == 1 + len(result.tokens)


def test_positions_past_a_resolved_stop_are_not_waited_for():
    # the stop at position 1 is sure; positions 2 and 3 never become confident
    backend = ScriptedBackend(1, [5, STOP, 7, 8], [0.3, 1.0, 0.1, 0.1])
    passes, _, result = run(backend, [3], settings())
    assert [e.filled for e in passes] == [(1,), (0,)]
    assert result.tokens == (5, STOP) and result.passes_per_block == (2,)


def test_max_tokens_cuts_the_last_block():
    backend = ScriptedBackend(1, list(range(10, 30)), [1.0] * 20)
    passes, blocks, result = run(backend, [3], settings(max_new_tokens=6))
    assert result.tokens == tuple(range(10, 16)) and result.finish_reason == "length"
    assert passes[-1].filled == (0, 1)  # only the positions inside the budget
    assert backend.calls[-1] == ("commit", [14, 15])


def test_over_long_request_is_rejected_before_any_pass():
    backend = ScriptedBackend(1, [5] * 8, [1.0] * 8)
    s = settings(context_limit=20, max_new_tokens=9)  # 3 blocks of 4 = 12 positions
    with pytest.raises(RequestTooLong, match="9 \\+ 12|12 for 9"):
        next(diffusion_loop(backend, list(range(9)), s))
    assert backend.calls == []
    complete(backend, list(range(8)), s)  # 8 + 12 = 20 fits


# -- the numpy backend on the tiny checkpoint -----------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    cfg = CheckpointConfig.from_dir(tiny_checkpoint)
    return ReferenceModel.from_checkpoint(tiny_checkpoint), cfg


PROMPT = [475, 84, 82, 269, 198, 432, 295, 266, 392, 281, 380, 30, 476, 198, 475, 444, 361, 83, 64, 261, 198]


def test_trace_is_consistent_and_greedy_output_deterministic(tiny):
    model, cfg = tiny
    s = DecodingSettings.from_defaults(
        cfg.generation, cfg.model.mask_token_id, block_size=8, max_new_tokens=40
    )
    passes, blocks, result = run(NumpyBackend(model), PROMPT, s)
    assert len(passes) > len(blocks)  # some block needed more than one pass
    for b, block in enumerate(blocks):
        mine = [e for e in passes if e.block == b]
        assert (
            [e.pass_index for e in mine] == list(range(len(mine))) == list(range(result.passes_per_block[b]))
        )
        assert mine[-1].tokens[: len(block.tokens)] == block.tokens
        assert all(e.position == len(PROMPT) + 8 * b for e in mine)
    assert result.tokens_per_pass == tuple(len(e.filled) for e in passes)
    assert result.tokens == tuple(t for b in blocks for t in b.tokens)
    assert complete(NumpyBackend(model), PROMPT, s).tokens == result.tokens


def test_one_pass_at_threshold_zero_is_greedy_filling(tiny):
    model, cfg = tiny
    s = DecodingSettings(mask_token_id=cfg.model.mask_token_id, block_size=8, threshold=0.0, max_new_tokens=8)
    passes, _, result = run(NumpyBackend(model), PROMPT, s)
    assert result.passes_per_block == (1,) and passes[0].filled == tuple(range(8))
    state = model.new_state()
    first = int(model.commit(PROMPT, state)[-1].argmax())
    rows = model.preview([cfg.model.mask_token_id] * 8, state).argmax(axis=-1)
    assert result.tokens == (first, *rows[:-1].tolist())


def test_backend_state_after_a_request_is_prompt_plus_tokens(tiny):
    model, cfg = tiny
    s = DecodingSettings.from_defaults(
        cfg.generation, cfg.model.mask_token_id, block_size=8, max_new_tokens=20
    )
    backend = NumpyBackend(model)
    result = complete(backend, PROMPT, s)
    fresh = model.new_state()
    model.commit(PROMPT + list(result.tokens), fresh)
    assert backend.state.n_past == fresh.n_past == len(PROMPT) + len(result.tokens)
    for layer, rec in fresh.recurrent.items():
        np.testing.assert_allclose(backend.state.recurrent[layer], rec, atol=1e-10)


def test_numpy_backend_picks_after_the_adjustment(tiny):
    model, _ = tiny
    backend = NumpyBackend(model)
    plain = LogitAdjustment.identity(backend.vocab_size)
    token, _ = backend.prefill(PROMPT, plain)
    banned = LogitAdjustment(
        np.array([token]), np.array([[1.0, 1.0, -1e9]], dtype=np.float32), backend.vocab_size
    )
    state = model.new_state()
    expected = pick(model.commit(PROMPT, state)[-1:], banned)
    assert backend.prefill(PROMPT, banned) == (int(expected[0][0]), float(expected[1][0]))
    assert expected[0][0] != token
