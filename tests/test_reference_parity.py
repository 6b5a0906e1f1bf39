"""The reference's causal trunk against transformers' `qwen3_5_moe`, the oracle of docs/model.md 1."""

from __future__ import annotations

import numpy as np
import pytest

from clover_local.model.checkpoint import Checkpoint
from clover_local.model.tensors import expected_shapes
from clover_local.reference.model import ReferenceModel

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.reference

TOL = 1e-4  # float32, max abs logit difference
# 70 tokens: crosses transformers' 64-row chunk of the delta rule
TOKENS = [int(t) for t in np.random.default_rng(7).integers(0, 470, 70)]


def hf_model(ckpt: Checkpoint):
    """transformers' model from our config with the checkpoint's trunk weights (Clover extras left out)."""
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    c = ckpt.model
    hc = Qwen3_5MoeTextConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        num_hidden_layers=c.num_hidden_layers,
        layer_types=list(c.layer_types),
        num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads,
        head_dim=c.head_dim,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": c.rope_theta,
            "partial_rotary_factor": c.partial_rotary_factor,
            "mrope_section": list(c.mrope_section),
        },
        linear_conv_kernel_dim=c.linear_conv_kernel_dim,
        linear_key_head_dim=c.linear_key_head_dim,
        linear_value_head_dim=c.linear_value_head_dim,
        linear_num_key_heads=c.linear_num_key_heads,
        linear_num_value_heads=c.linear_num_value_heads,
        num_experts=c.num_experts,
        num_experts_per_tok=c.num_experts_per_tok,
        moe_intermediate_size=c.moe_intermediate_size,
        shared_expert_intermediate_size=c.shared_expert_intermediate_size,
        rms_norm_eps=c.rms_norm_eps,
        tie_word_embeddings=c.tie_word_embeddings,
        max_position_embeddings=c.max_position_embeddings,
    )
    hc._attn_implementation = "eager"
    model = Qwen3_5MoeForCausalLM(hc).eval()
    names = expected_shapes(c, fused_experts=True, diffusion=False)  # fused arrays even for per-expert files
    state = {
        n if n == "lm_head.weight" else f"model.{n}": torch.from_numpy(np.array(ckpt.get(n))) for n in names
    }
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    if c.tie_word_embeddings:
        model.tie_weights()
    return model, hc


@pytest.fixture(scope="module", params=["tiny", "tiny-per-expert", "tiny-lm-prefix", "tiny-tied"])
def pair(request, checkpoint_factory):
    torch.set_num_threads(1)
    ckpt = Checkpoint(checkpoint_factory(request.param))
    model, hc = hf_model(ckpt)
    return ReferenceModel(ckpt, ckpt.model, np.float32), model, hc


def hf_logits(model, hc, chunks: list[list[int]]) -> np.ndarray:
    """transformers' logits of the chunks fed one after the other through its cache."""
    from transformers.cache_utils import DynamicCache

    cache = DynamicCache(config=hc)
    with torch.no_grad():
        out = [model(torch.tensor([c]), cache=cache, use_cache=True).logits[0].numpy() for c in chunks]
    return np.concatenate(out)


def ref_logits(ref: ReferenceModel, chunks: list[list[int]]) -> np.ndarray:
    state = ref.new_state()
    return np.concatenate([ref.commit(c, state) for c in chunks])


def test_prefill_matches_transformers(pair):
    ref, model, hc = pair
    with torch.no_grad():
        expected = model(torch.tensor([TOKENS])).logits[0].numpy()
    assert np.abs(ref_logits(ref, [TOKENS]) - expected).max() <= TOL
    assert np.abs(expected).max() > 1  # logits large enough for the tolerance to mean something


def test_chunked_prefill_matches_transformers(pair):
    ref, model, hc = pair
    chunks = [TOKENS[:5], TOKENS[5:37], TOKENS[37:38], TOKENS[38:]]
    assert np.abs(ref_logits(ref, chunks) - hf_logits(model, hc, chunks)).max() <= TOL


def test_one_token_steps_match_transformers(pair):
    ref, model, hc = pair
    steps = [[t] for t in TOKENS[:24]]
    assert np.abs(ref_logits(ref, steps) - hf_logits(model, hc, steps)).max() <= TOL
