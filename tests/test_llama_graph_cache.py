"""Patch 0401 (graph slots) on the patched llama.cpp, F32 tiny GGUF: passes of alternating shapes
reuse their built graphs instead of rebuilding them, and every pass's picks and probabilities are
bit-identical to rebuilding the graph for each pass (`LLAMA_GRAPH_CACHE=0`)."""

from __future__ import annotations

import llama_cpp as ll
import numpy as np
import pytest
from test_llama_engine import N_GPU_LAYERS, engine

from clover_local.backend import LogitAdjustment, RowAdjustments
from clover_local.llama import unavailable
from clover_local.model.config import CheckpointConfig

SKIP = unavailable()
pytestmark = [pytest.mark.llama, pytest.mark.skipif(SKIP is not None, reason=SKIP or "")]

PROMPT = [475, 84, 82, 269, 198, 432, 295, 266, 392, 281, 380, 30, 476]
ROUNDS = 5


def mixed_passes(path, mask: int, slots: str, monkeypatch) -> tuple[list[np.ndarray], int]:
    """A speculative context's pass pattern, ROUNDS times: a one-row step, a verification of two
    rows with a three-row preview, a rollback of its last row, a four-row preview alone. Returns
    every pass's picks and probabilities, and how often llama.cpp reused a built graph."""
    monkeypatch.setenv("LLAMA_GRAPH_CACHE", slots)  # read when the context is created
    with engine(path, speculative=True) as eng:
        adj = LogitAdjustment.identity(eng.vocab_size)
        out: list[np.ndarray] = []
        tok, _ = eng.prefill(PROMPT, adj)
        for _ in range(ROUNDS):
            tok, prob = eng.commit([tok], adj)
            out.append(np.array([tok, prob]))
            rows = [tok, (tok + 1) % eng.vocab_size]
            v = eng.verify_and_draft(rows, RowAdjustments.constant(adj, 2), [mask] * 3)
            out += [v.tokens, v.probs, v.draft_tokens, v.draft_probs]
            eng.rollback(eng.n_past - 1)
            toks, probs = eng.preview([mask] * 4, adj)
            out += [toks, probs]
            tok = int(v.tokens[0])
        reused = ll.llama_perf_context(eng.ctx).n_reused
    return out, reused


@pytest.mark.skipif(N_GPU_LAYERS > 0, reason="bit-identity across graph builds holds on the CPU")
def test_slots_reuse_graphs_with_identical_results(gguf_factory, monkeypatch):
    ckpt, path = gguf_factory("tiny")
    mask = CheckpointConfig.from_dir(ckpt).model.mask_token_id
    rebuilt, reused_off = mixed_passes(path, mask, "0", monkeypatch)
    slotted, reused_on = mixed_passes(path, mask, "4", monkeypatch)
    assert len(rebuilt) == len(slotted)
    for a, b in zip(rebuilt, slotted, strict=True):
        np.testing.assert_array_equal(a, b)
    # no slots (one graph): every pass changes shape, nothing is reused; four: every shape stays built
    assert reused_off == 0
    assert reused_on >= 3 * (ROUNDS - 1)
