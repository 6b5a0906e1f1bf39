"""The patched llama.cpp runtime against the float64 numpy reference, on F32 GGUFs of the tiny checkpoints."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import numpy as np
import pytest

from clover_local.backend import LogitAdjustment, pick
from clover_local.llama import unavailable
from clover_local.loops import complete
from clover_local.model.config import CheckpointConfig
from clover_local.policy import DecodingSettings
from clover_local.reference.backend import NumpyBackend
from clover_local.reference.model import ReferenceModel

SKIP = unavailable()
pytestmark = [pytest.mark.llama, pytest.mark.skipif(SKIP is not None, reason=SKIP or "")]

N_GPU_LAYERS = int(os.environ.get("CLOVER_TEST_N_GPU_LAYERS", "0"))  # run these tests on a GPU build
LOG = N_GPU_LAYERS > 0  # GPU runs: llama.cpp logs to stderr itself, no Python log callback (LlamaEngine)
# logits vs the float64 reference; ggml-cuda's F32 matmuls are ~1e-3 relative (the upstream causal path too)
TOL = 1e-3 if N_GPU_LAYERS == 0 else 0.1
# two graphs computing the same thing (on a GPU their kernels differ)
SAME = 1e-5 if N_GPU_LAYERS == 0 else TOL
PROB_RTOL = 1e-4 if N_GPU_LAYERS == 0 else 2e-2
PRESETS = ["tiny", "tiny-per-expert", "tiny-lm-prefix", "tiny-tied", "tiny-qwen-vocab"]


def engine(path: Path, **kw):
    from clover_local.llama.engine import LlamaEngine

    return LlamaEngine(
        path,
        n_ctx=256,
        n_threads=2,
        n_gpu_layers=N_GPU_LAYERS,
        flash_attn=False,
        f32_cache=True,
        log=LOG,
        **kw,
    )


def prompt_and_block(vocab: int, mask: int, seed: int = 0) -> tuple[list[int], list[int]]:
    """A random prompt and an 8-row block with every other position masked."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, vocab, 13).tolist()
    block = rng.integers(0, vocab, 8).tolist()
    block[1::2] = [mask] * 4
    return prompt, block


@pytest.mark.parametrize("preset", PRESETS)
def test_causal_preview_and_commit_logits_match_the_reference(gguf_factory, preset):
    ckpt, path = gguf_factory(preset)
    ref = ReferenceModel.from_checkpoint(ckpt)
    state = ref.new_state()
    with engine(path) as eng:
        prompt, block = prompt_and_block(eng.vocab_size, ref.cfg.mask_token_id)
        np.testing.assert_allclose(eng.causal_logits(prompt), ref.commit(prompt, state), rtol=0, atol=TOL)
        np.testing.assert_allclose(eng.preview_logits(block), ref.preview(block, state), rtol=0, atol=TOL)
        resolved = [t if t != ref.cfg.mask_token_id else 7 for t in block]
        np.testing.assert_allclose(eng.causal_logits(resolved), ref.commit(resolved, state), rtol=0, atol=TOL)


def test_head_picks_follow_the_logit_adjustment(gguf_factory):
    ckpt, path = gguf_factory("tiny")
    ref = ReferenceModel.from_checkpoint(ckpt)
    state = ref.new_state()
    rng = np.random.default_rng(1)
    with engine(path) as eng:
        prompt, block = prompt_and_block(eng.vocab_size, ref.cfg.mask_token_id)
        v = eng.vocab_size
        adj = LogitAdjustment.from_vectors(
            rng.uniform(0.5, 1.5, v).astype(np.float32),
            rng.uniform(0.5, 1.5, v).astype(np.float32),
            rng.normal(0, 3, v).astype(np.float32),
        )
        ref_logits = ref.commit(prompt, state)
        tok, prob = eng.prefill(prompt, adj)
        ref_tok, ref_prob = pick(ref_logits[-1:], adj)
        assert tok == ref_tok[0] and prob == pytest.approx(ref_prob[0], rel=PROB_RTOL)
        tok, prob = eng.preview(block, adj)
        ref_tok, ref_prob = pick(ref.preview(block, state), adj)
        np.testing.assert_array_equal(tok, ref_tok)
        np.testing.assert_allclose(prob, ref_prob, rtol=PROB_RTOL)


@pytest.mark.parametrize("preset", ["tiny", "tiny-per-expert"])
def test_greedy_block_diffusion_generation_is_token_identical(gguf_factory, preset):
    ckpt, path = gguf_factory(preset)
    cfg = CheckpointConfig.from_dir(ckpt)
    s = DecodingSettings.from_defaults(
        cfg.generation, cfg.model.mask_token_id, block_size=8, max_new_tokens=24
    )
    prompt = np.random.default_rng(2).integers(0, cfg.model.vocab_size, 11).tolist()
    expected = complete(NumpyBackend(ReferenceModel.from_checkpoint(ckpt)), prompt, s)
    with engine(path) as eng:
        got = complete(eng, prompt, s)
    assert got.tokens == expected.tokens
    assert got.passes_per_block == expected.passes_per_block


def test_previews_leave_the_memory_bit_identical(gguf_factory):
    ckpt, path = gguf_factory("tiny")
    mask = CheckpointConfig.from_dir(ckpt).model.mask_token_id
    with engine(path) as eng:
        prompt, block = prompt_and_block(eng.vocab_size, mask)
        eng.causal_logits(prompt)
        before, n_past = eng.state_bytes(), eng.n_past
        for i in range(3):
            eng.preview_logits(block[: 8 - i])
            assert eng.n_past == n_past
        assert eng.state_bytes() == before


def test_preview_then_commit_equals_commit_alone(gguf_factory):
    ckpt, path = gguf_factory("tiny")
    mask = CheckpointConfig.from_dir(ckpt).model.mask_token_id
    with engine(path) as a, engine(path) as b:
        prompt, block = prompt_and_block(a.vocab_size, mask)
        resolved = [t if t != mask else 3 for t in block]
        a.causal_logits(prompt)
        b.causal_logits(prompt)
        a.preview_logits(block)
        a.preview_logits(resolved)
        np.testing.assert_array_equal(a.causal_logits(resolved), b.causal_logits(resolved))
        assert a.state_bytes() == b.state_bytes()


def coreset_recorder(found: dict[str, np.ndarray]):
    """An eval callback that copies every `ffn_moe_coreset-<layer>` tensor out of the graph."""
    from clover_local.llama import capi

    def callback(t, ask: bool) -> bool:
        name = t.contents.name.decode()
        if not name.startswith("ffn_moe_coreset-"):
            return False if ask else True
        if not ask:
            buf = np.empty(capi.ggml_nbytes(t) // 4, dtype=np.float32)
            capi.ggml_backend_tensor_get(t, buf.ctypes.data_as(ctypes.c_void_p), 0, buf.nbytes)
            found[name] = buf
        return True

    return callback


def test_mask_token_id_is_the_checkpoints(gguf_factory):
    ckpt, path = gguf_factory("tiny")
    with engine(path) as eng:
        assert eng.mask_token_id == CheckpointConfig.from_dir(ckpt).model.mask_token_id >= 0


def test_a_library_of_another_version_of_the_series_is_refused(gguf_factory, monkeypatch):
    """The loaded library reports the pass API these bindings are written for (patch 0011's
    `LLAMA_CLOVER_API_VERSION`); one built from another version of the series (a `git pull`
    without `make install`) would take misplaced struct fields, so the engine refuses it."""
    from clover_local.llama import capi
    from clover_local.llama.engine import EngineError

    assert capi.INSTALLED_API_VERSION == capi.API_VERSION
    monkeypatch.setattr(capi, "INSTALLED_API_VERSION", 1)
    monkeypatch.setattr(capi, "PATCHED", False)
    with pytest.raises(
        EngineError, match=r"another version of the Clover patch series \(C API 1, this clover-local "
    ):
        engine(gguf_factory("tiny")[1])


def test_coreset_at_top_p_one_equals_no_coreset(gguf_factory):
    ckpt, path = gguf_factory("tiny")
    mask = CheckpointConfig.from_dir(ckpt).model.mask_token_id
    with engine(path, coreset=True, coreset_top_p=1.0) as a, engine(path, coreset=False) as b:
        prompt, block = prompt_and_block(a.vocab_size, mask)
        a.causal_logits(prompt)
        b.causal_logits(prompt)
        # top_p 1 drops the experts no row picked (no mass), so the router softmax renormalises over
        # the rest: the same picks and weights up to float32 rounding (1.7e-5 on an AVX-512 CPU)
        np.testing.assert_allclose(a.preview_logits(block), b.preview_logits(block), rtol=0, atol=1e-4)


@pytest.mark.parametrize(
    "setting, kept_ok",
    [
        ({"coreset_top_p": 0.5}, lambda n, size: 0 < n < size),  # top_p 0.5 excludes some experts
        ({"coreset_size": 3}, lambda n, size: n == 3),  # a forced size keeps exactly that many
    ],
    ids=["top_p", "forced-size"],
)
def test_coreset_experts_per_layer_match_the_reference(gguf_factory, setting, kept_ok):
    ckpt, path = gguf_factory("tiny")
    ref = ReferenceModel.from_checkpoint(ckpt, **setting)
    state = ref.new_state()
    found: dict[str, np.ndarray] = {}
    routing = {k: v for k, v in setting.items() if k != "coreset_size"}
    with engine(path, coreset=True, eval_callback=coreset_recorder(found), **routing) as eng:
        eng.bench_tuning(coreset_size=setting.get("coreset_size", 0))
        prompt, block = prompt_and_block(eng.vocab_size, ref.cfg.mask_token_id)
        eng.causal_logits(prompt)
        ref.commit(prompt, state)
        record: dict[str, np.ndarray] = {}
        logits, ref_logits = eng.preview_logits(block), ref.preview(block, state, record=record)
    expected = {k: v for k, v in record.items() if k.startswith("ffn_moe_coreset-")}
    assert expected and found.keys() == expected.keys()
    for name, kept in expected.items():
        np.testing.assert_array_equal(found[name] > 0.5, kept, err_msg=name)
        assert kept_ok(int(kept.sum()), kept.size), f"{name}: {int(kept.sum())} experts kept"
    np.testing.assert_allclose(logits, ref_logits, rtol=0, atol=TOL)


@pytest.mark.parametrize("chunk", [1, 3, 8])
def test_chunked_expert_dispatch_computes_the_same_passes(gguf_factory, chunk):
    """`moe_chunk` only splits the routed experts' dispatch: previews and commits give the logits
    of the unsplit graph (8 = the block: no split), up to float order (matmul paths differ by batch)."""
    ckpt, path = gguf_factory("tiny")
    mask = CheckpointConfig.from_dir(ckpt).model.mask_token_id
    with engine(path) as a, engine(path) as b:
        a.bench_tuning(moe_chunk=chunk)
        prompt, block = prompt_and_block(a.vocab_size, mask)
        for eng in (a, b):
            eng.causal_logits(prompt)
        for _ in range(2):  # the second preview reads the state the chunked commit wrote
            np.testing.assert_allclose(
                a.preview_logits(block), b.preview_logits(block), rtol=0, atol=10 * SAME
            )
            np.testing.assert_allclose(a.causal_logits(block), b.causal_logits(block), rtol=0, atol=10 * SAME)


def test_ar_only_file_runs_causally_and_refuses_previews(gguf_factory):
    from clover_local.llama.engine import EngineError

    ckpt, path = gguf_factory("tiny", ar_only=True)
    ref = ReferenceModel.from_checkpoint(ckpt)
    with engine(path) as eng:
        assert not eng.has_diffusion
        prompt, block = prompt_and_block(eng.vocab_size, ref.cfg.mask_token_id)
        np.testing.assert_allclose(
            eng.causal_logits(prompt), ref.commit(prompt, ref.new_state()), rtol=0, atol=TOL
        )
        with pytest.raises(EngineError, match="--ar-only"):
            eng.preview(block, LogitAdjustment.identity(eng.vocab_size))
        from llama_cpp import llama_cpp as ll

        from clover_local.llama import capi

        params = capi.llama_clover_pass_default_params()
        params.block, params.n_block = (ll.llama_token * len(block))(*block), len(block)
        assert capi.llama_clover_pass(eng.ctx, ctypes.byref(params)) < 0


def test_ar_steps_pick_what_plain_llama_cpp_greedy_decoding_picks(gguf_factory):
    """The clover head's two-stage argmax over the graph's logits equals llama.cpp's own greedy
    sampler on the same file (`llama.upstream`, the baseline of `clover bench`), token for token."""
    from clover_local.llama.upstream import greedy_decode

    _, path = gguf_factory("tiny")
    with engine(path) as eng:
        prompt = np.random.default_rng(3).integers(0, eng.vocab_size, 9).tolist()
        plain, tok_s = greedy_decode(eng, prompt, 12)
        ident = LogitAdjustment.identity(eng.vocab_size)
        ours = [eng.prefill(prompt, ident)[0]]
        for _ in range(11):
            ours.append(eng.commit([ours[-1]], ident)[0])
    assert ours == plain and tok_s > 0
