"""GGUF key/value metadata: upstream's `qwen35moe` hyperparameter keys under `clover-moe.`,
Clover's block-diffusion keys, and `general.*`.

The trunk key set mirrors upstream's `Qwen3_5MoeTextModel.set_gguf_parameters` (TextModel base
keys, expert sizes, GDN sizes, recurrent layer flags, partial-rotary dimension count and the
four mrope sections, padded with 0 as upstream does).
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf import GGML_QUANT_VERSION, GGUFValueType, GGUFWriter, size_label

from clover_local.model import gguf_names as gn
from clover_local.model.config import CONTEXT_LIMIT, CheckpointConfig
from clover_local.model.decoding_parameters import PARAMETERS

from .mix import OutType


@dataclass(frozen=True)
class General:
    """`general.*` values that come from outside config.json."""

    name: str
    license: str | None = None
    source_url: str | None = None  # Hugging Face repo URL when converted from the Hub


def add_model_keys(w: GGUFWriter, ck: CheckpointConfig) -> None:
    """The trunk's keys, through gguf-py's adders (its `Keys` under the writer's arch, `clover-moe`)."""
    cfg = ck.model
    text = {**ck.raw, **ck.raw.get("text_config", {})}
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(min(cfg.max_position_embeddings, CONTEXT_LIMIT))
    w.add_embedding_length(cfg.hidden_size)
    if "intermediate_size" in text:  # written by upstream only when the config has it
        w.add_feed_forward_length(int(text["intermediate_size"]))
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_rope_dimension_sections((list(cfg.mrope_section) + [0, 0, 0, 0])[:4])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_expert_count(cfg.num_experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    w.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
    w.add_ssm_conv_kernel(cfg.linear_conv_kernel_dim)
    w.add_ssm_state_size(cfg.linear_key_head_dim)
    w.add_ssm_group_count(cfg.linear_num_key_heads)
    w.add_ssm_time_step_rank(cfg.linear_num_value_heads)
    w.add_ssm_inner_size(cfg.value_dim)
    w.add_array(gn.RECURRENT_LAYERS, [not a for a in cfg.is_attention])
    w.add_full_attention_interval(cfg.full_attention_interval)
    w.add_rope_dimension_count(cfg.rotary_dim)


def add_diffusion_keys(w: GGUFWriter, ck: CheckpointConfig) -> None:
    """The decoding parameters (their table, under `clover-moe.diffusion.`: `CheckpointConfig.from_dir`
    resolves config.json's and generation_config.json's into one set) and the stop tokens."""
    gen = ck.generation
    for p in PARAMETERS:
        w.add_key_value(p.gguf_key, getattr(gen, p.name), GGUFValueType[p.gguf_type])
    if gen.eos_token_ids:
        w.add_array(gn.DIFFUSION_EOS_TOKEN_IDS, list(gen.eos_token_ids))


def add_general(w: GGUFWriter, general: General, out: OutType, ck: CheckpointConfig) -> None:
    """`general.*` as upstream writes it; call after the tensor infos (the size label counts them)."""
    w.add_type("model")
    w.add_name(general.name)
    w.add_size_label(size_label(*w.get_total_parameter_count()))
    if general.license:
        w.add_license(general.license)
    if general.source_url:
        w.add_source_url(general.source_url)
    w.add_quantization_version(GGML_QUANT_VERSION)
    w.add_file_type(out.file_type)
    gen = {**ck.generation.extra, "repetition_penalty": ck.generation.repetition_penalty}
    for key, add in (
        ("top_k", w.add_sampling_top_k),
        ("top_p", w.add_sampling_top_p),
        ("min_p", w.add_sampling_min_p),
        ("temperature", w.add_sampling_temp),
        ("repetition_penalty", w.add_sampling_penalty_repeat),
    ):
        if gen.get(key) is not None:
            add(gen[key])
