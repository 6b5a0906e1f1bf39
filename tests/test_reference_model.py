"""The reference's own invariants: state handling of commits and previews, the coreset, dtypes."""

from __future__ import annotations

import numpy as np
import pytest

from clover_local.reference.model import ReferenceModel, State

TOKENS = [int(t) for t in np.random.default_rng(3).integers(0, 470, 19)]


@pytest.fixture(scope="module")
def model(tiny_checkpoint) -> ReferenceModel:
    return ReferenceModel.from_checkpoint(tiny_checkpoint)


@pytest.fixture(scope="module")
def mask_id(model) -> int:
    return model.cfg.mask_token_id


def block_of(model: ReferenceModel, resolved: dict[int, int]) -> list[int]:
    block = [model.cfg.mask_token_id] * model.cfg.block_size
    for i, t in resolved.items():
        block[i] = t
    return block


def states_identical(a: State, b: State) -> bool:
    groups = ("keys", "values", "conv", "recurrent")
    same = all(
        getattr(a, g).keys() == getattr(b, g).keys()
        and all(np.array_equal(getattr(a, g)[k], getattr(b, g)[k]) for k in getattr(a, g))
        for g in groups
    )
    return same and a.n_past == b.n_past


def test_one_prefill_equals_chunks_equals_steps(model):
    whole = model.commit(TOKENS, model.new_state())
    st = model.new_state()
    chunked = np.concatenate([model.commit(TOKENS[a:b], st) for a, b in ((0, 4), (4, 5), (5, 17), (17, 19))])
    st_steps = model.new_state()
    steps = np.concatenate([model.commit([t], st_steps) for t in TOKENS])
    np.testing.assert_allclose(chunked, whole, rtol=0, atol=1e-10)
    np.testing.assert_allclose(steps, whole, rtol=0, atol=1e-10)
    assert st.n_past == st_steps.n_past == len(TOKENS)


def test_preview_leaves_state_bit_identical(model, mask_id):
    st = model.new_state()
    model.commit(TOKENS, st)
    before = st.copy()
    snapshot = {
        g: {k: v.copy() for k, v in getattr(st, g).items()} for g in ("keys", "values", "conv", "recurrent")
    }
    model.preview(block_of(model, {0: 5, 3: 9}), st)
    assert states_identical(st, before)
    for g, arrays in snapshot.items():  # contents too, not only the same objects
        assert all(np.array_equal(getattr(st, g)[k], v) for k, v in arrays.items())


def test_commit_after_preview_equals_commit_alone(model):
    block = [int(t) for t in np.random.default_rng(4).integers(0, 470, model.cfg.block_size)]
    a, b = model.new_state(), model.new_state()
    model.commit(TOKENS, a)
    model.commit(TOKENS, b)
    model.preview(block, a)
    assert np.array_equal(model.commit(block, a), model.commit(block, b))
    assert states_identical(a, b)


def test_preview_is_bidirectional_inside_the_block_and_commit_is_not(model, mask_id):
    st = model.new_state()
    model.commit(TOKENS, st)
    b1 = block_of(model, {})
    b2 = block_of(model, {len(b1) - 1: 42})
    p1, p2 = model.preview(b1, st), model.preview(b2, st)
    assert np.abs(p1[0] - p2[0]).max() > 1e-3  # row 0 sees the last row
    c1, c2 = model.commit(b1, st.copy()), model.commit(b2, st.copy())
    np.testing.assert_allclose(c1[:-1], c2[:-1], rtol=0, atol=1e-12)  # causal: earlier rows blind to it


def test_preview_reads_the_committed_prefix(model, mask_id):
    a, b = model.new_state(), model.new_state()
    model.commit(TOKENS, a)
    model.commit(TOKENS[:-1] + [TOKENS[-1] + 1], b)
    block = block_of(model, {})
    assert np.abs(model.preview(block, a) - model.preview(block, b)).max() > 1e-3


def test_coreset_top_p_one_equals_no_coreset(tiny_checkpoint):
    full = ReferenceModel.from_checkpoint(tiny_checkpoint, coreset_top_p=1.0)
    off = ReferenceModel.from_checkpoint(tiny_checkpoint, coreset_enabled=False)
    st = full.new_state()
    full.commit(TOKENS, st)
    block = block_of(full, {0: 7, 5: 11})
    rec: dict[str, np.ndarray] = {}
    assert np.array_equal(full.preview(block, st, record=rec), off.preview(block, st))
    assert any(k.startswith("ffn_moe_coreset") for k in rec)  # the coreset did run


def test_coreset_half_keeps_a_strict_subset_and_routes_only_to_it(tiny_checkpoint):
    half = ReferenceModel.from_checkpoint(tiny_checkpoint, coreset_top_p=0.5)
    off = ReferenceModel.from_checkpoint(tiny_checkpoint, coreset_enabled=False)
    st = half.new_state()
    half.commit(TOKENS, st)
    block = block_of(half, {0: 7, 5: 11})
    rec_half: dict[str, np.ndarray] = {}
    rec_off: dict[str, np.ndarray] = {}
    logits_half = half.preview(block, st, record=rec_half)
    logits_off = off.preview(block, st, record=rec_off)
    # Layer 0's MoE input is the same in both runs, so its kept set must come from the
    # unrestricted candidates; later layers see hidden states the coreset already changed.
    assert set(np.flatnonzero(rec_half["ffn_moe_coreset-0"])) < set(np.unique(rec_off["ffn_moe_topk-0"]))
    for layer in range(half.cfg.num_hidden_layers):
        kept = rec_half[f"ffn_moe_coreset-{layer}"]
        assert set(np.unique(rec_half[f"ffn_moe_topk-{layer}"])) <= set(np.flatnonzero(kept))
    assert not np.array_equal(logits_half, logits_off)


def test_commit_routes_unrestricted(tiny_checkpoint):
    half = ReferenceModel.from_checkpoint(tiny_checkpoint, coreset_top_p=0.5)
    off = ReferenceModel.from_checkpoint(tiny_checkpoint, coreset_enabled=False)
    rec: dict[str, np.ndarray] = {}
    assert np.array_equal(
        half.commit(TOKENS, half.new_state(), record=rec), off.commit(TOKENS, off.new_state())
    )
    assert not any(k.startswith("ffn_moe_coreset") for k in rec)


def test_float32_agrees_with_float64(tiny_checkpoint, mask_id):
    m64 = ReferenceModel.from_checkpoint(tiny_checkpoint)
    m32 = ReferenceModel.from_checkpoint(tiny_checkpoint, dtype=np.float32)
    s64, s32 = m64.new_state(), m32.new_state()
    c64, c32 = m64.commit(TOKENS, s64), m32.commit(TOKENS, s32)
    assert c32.dtype == np.float32 and c64.dtype == np.float64
    np.testing.assert_allclose(c32, c64, rtol=0, atol=1e-3)
    block = block_of(m64, {2: 8})
    np.testing.assert_allclose(m32.preview(block, s32), m64.preview(block, s64), rtol=0, atol=1e-3)


def test_record_names_every_layer(model):
    rec: dict[str, np.ndarray] = {}
    logits = model.commit(TOKENS[:3], model.new_state(), record=rec)
    for layer, is_attn in enumerate(model.cfg.is_attention):
        mixer = "attn_output" if is_attn else "linear_attn_out"
        for name in ("attn_norm", mixer, "attn_post_norm", "ffn_out", "l_out"):
            assert rec[f"{name}-{layer}"].shape == (3, model.cfg.hidden_size)
    assert np.array_equal(rec["result_output"], logits)


def test_any_weight_source_with_get_serves_the_model(tiny_checkpoint):
    """A GGUF reader only needs `get(name)`; lazy reading gives the same logits as caching."""
    from clover_local.model.checkpoint import Checkpoint

    ckpt = Checkpoint(tiny_checkpoint)

    class DictSource:
        def __init__(self):
            self.arrays = {n: ckpt.get(n) for n in ckpt.names()}
            self.reads = 0

        def get(self, name: str) -> np.ndarray:
            self.reads += 1
            return self.arrays[name]

    source = DictSource()
    lazy = ReferenceModel(source, ckpt.model, cache_weights=False)
    cached = ReferenceModel(ckpt, ckpt.model)
    assert np.array_equal(lazy.commit(TOKENS, lazy.new_state()), cached.commit(TOKENS, cached.new_state()))
    reads = source.reads
    lazy.commit(TOKENS[:2], lazy.new_state())
    assert source.reads == 2 * reads  # read again: nothing cached
