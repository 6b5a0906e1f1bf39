"""GGUF key/value metadata: upstream's `qwen35moe` hyperparameter keys under `clover-moe.`,
Clover's block-diffusion keys, and `general.*`.

The trunk key set mirrors upstream's `Qwen3_5MoeTextModel.set_gguf_parameters` (TextModel base
keys, expert sizes, GDN sizes, recurrent layer flags, partial-rotary dimension count and the
four mrope sections, padded with 0 as upstream does).
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf import GGML_QUANT_VERSION, GGUFWriter, size_label

from clover_local.model import gguf_names as gn
from clover_local.model.config import CONTEXT_LIMIT, CheckpointConfig

from .mix import OutType


@dataclass(frozen=True)
class General:
    """`general.*` values that come from outside config.json."""

    name: str
    license: str | None = None
    source_url: str | None = None  # Hugging Face repo URL when converted from the Hub


def add_model_keys(w: GGUFWriter, ck: CheckpointConfig) -> None:
    cfg = ck.model
    text = {**ck.raw, **ck.raw.get("text_config", {})}
    w.add_uint32(gn.BLOCK_COUNT, cfg.num_hidden_layers)
    w.add_uint32(gn.CONTEXT_LENGTH, min(cfg.max_position_embeddings, CONTEXT_LIMIT))
    w.add_uint32(gn.EMBEDDING_LENGTH, cfg.hidden_size)
    if "intermediate_size" in text:  # written by upstream only when the config has it
        w.add_uint32(gn.FEED_FORWARD_LENGTH, int(text["intermediate_size"]))
    w.add_uint32(gn.HEAD_COUNT, cfg.num_attention_heads)
    w.add_uint32(gn.HEAD_COUNT_KV, cfg.num_key_value_heads)
    w.add_float32(gn.ROPE_FREQ_BASE, cfg.rope_theta)
    w.add_array(gn.ROPE_DIMENSION_SECTIONS, (list(cfg.mrope_section) + [0, 0, 0, 0])[:4])
    w.add_float32(gn.RMS_EPS, cfg.rms_norm_eps)
    w.add_uint32(gn.EXPERT_COUNT, cfg.num_experts)
    w.add_uint32(gn.EXPERT_USED_COUNT, cfg.num_experts_per_tok)
    w.add_uint32(gn.KEY_LENGTH, cfg.head_dim)
    w.add_uint32(gn.VALUE_LENGTH, cfg.head_dim)
    w.add_uint32(gn.EXPERT_FEED_FORWARD_LENGTH, cfg.moe_intermediate_size)
    w.add_uint32(gn.EXPERT_SHARED_FEED_FORWARD_LENGTH, cfg.shared_expert_intermediate_size)
    w.add_uint32(gn.SSM_CONV_KERNEL, cfg.linear_conv_kernel_dim)
    w.add_uint32(gn.SSM_STATE_SIZE, cfg.linear_key_head_dim)
    w.add_uint32(gn.SSM_GROUP_COUNT, cfg.linear_num_key_heads)
    w.add_uint32(gn.SSM_TIME_STEP_RANK, cfg.linear_num_value_heads)
    w.add_uint32(gn.SSM_INNER_SIZE, cfg.value_dim)
    w.add_array(gn.RECURRENT_LAYERS, [not a for a in cfg.is_attention])
    w.add_uint32(gn.FULL_ATTENTION_INTERVAL, cfg.full_attention_interval)
    w.add_uint32(gn.ROPE_DIMENSION_COUNT, cfg.rotary_dim)


def add_diffusion_keys(w: GGUFWriter, ck: CheckpointConfig) -> None:
    cfg, gen = ck.model, ck.generation
    w.add_uint32(gn.DIFFUSION_BLOCK_SIZE, cfg.block_size)
    w.add_float32(gn.DIFFUSION_THRESHOLD, gen.threshold)
    w.add_int32(gn.DIFFUSION_LOGIT_SHIFT, gen.logit_shift)
    w.add_bool(gn.DIFFUSION_CORESET_ENABLED, cfg.coreset_enabled)
    w.add_float32(gn.DIFFUSION_CORESET_TOP_P, cfg.coreset_top_p)
    w.add_uint32(gn.DIFFUSION_MAX_NEW_TOKENS, gen.max_new_tokens)
    w.add_float32(gn.DIFFUSION_PRESENCE_PENALTY, gen.presence_penalty)
    w.add_float32(gn.DIFFUSION_FREQUENCY_PENALTY, gen.frequency_penalty)
    w.add_float32(gn.DIFFUSION_REPETITION_PENALTY, gen.repetition_penalty)
    w.add_float32(gn.DIFFUSION_STOP_RAMP_START, gen.stop_ramp_start)
    w.add_float32(gn.DIFFUSION_STOP_RAMP_MAX, gen.stop_ramp_max)
    w.add_float32(gn.DIFFUSION_THINK_RAMP_START, gen.think_ramp_start)
    w.add_float32(gn.DIFFUSION_THINK_RAMP_MAX, gen.think_ramp_max)
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
