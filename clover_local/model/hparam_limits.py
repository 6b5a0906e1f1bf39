"""What llama.cpp accepts for each Clover hyperparameter: one table for the converter and the runtime.

A valid-but-absurd value (`expert_used_count` 0, a negative or NaN norm epsilon, a rotary
dimension count of 0, a block size of 0) makes llama.cpp abort, hang or divide by zero. The
converter checks the values it is about to write (naming the `config.json` field) and the runtime
checks the values a GGUF holds (naming the key) before `llama_model_load`, against the same rows,
so anything the converter writes loads.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from . import gguf_names as gn

LLAMA_MAX_LAYERS = 512  # llama-hparams.h
LLAMA_MAX_EXPERTS = 1024  # llama-hparams.h
MAX_BLOCK = 512  # a block is one micro-batch of the context (n_ubatch 512)
MAX_SIZE = 1 << 24  # any width or count far beyond a real model: rejected before allocation
Bound = float | str  # a number, or the field of another row (`expert_used_count <= expert_count`)


@dataclass(frozen=True)
class Limit:
    """One hyperparameter: its GGUF key, where the converter reads it, and the allowed range.

    `kind` is "int" (an integer in [lo, hi]), "real" (finite, in [lo, hi]) or "positive"
    (finite, > 0).
    """

    key: str
    field: str  # CloverConfig / GenerationDefaults attribute
    source: str  # the checkpoint file (and field) it comes from, for messages
    kind: str
    lo: Bound = -math.inf
    hi: Bound = math.inf


_CFG, _GEN = "config.json", "generation_config.json"

MODEL_LIMITS: tuple[Limit, ...] = (
    Limit(
        gn.key("block_count"), "num_hidden_layers", f"{_CFG} num_hidden_layers", "int", 1, LLAMA_MAX_LAYERS
    ),
    Limit(
        gn.key("context_length"),
        "max_position_embeddings",
        f"{_CFG} max_position_embeddings",
        "int",
        1,
        2**31 - 1,
    ),
    Limit(gn.key("embedding_length"), "hidden_size", f"{_CFG} hidden_size", "int", 1, MAX_SIZE),
    Limit(
        gn.key("attention.head_count"), "num_attention_heads", f"{_CFG} num_attention_heads", "int", 1, 4096
    ),
    Limit(
        gn.key("attention.head_count_kv"),
        "num_key_value_heads",
        f"{_CFG} num_key_value_heads",
        "int",
        1,
        "num_attention_heads",
    ),
    Limit(gn.key("attention.key_length"), "head_dim", f"{_CFG} head_dim", "int", 1, 4096),
    Limit(gn.key("attention.value_length"), "head_dim", f"{_CFG} head_dim", "int", 1, 4096),
    Limit(gn.key("rope.freq_base"), "rope_theta", f"{_CFG} rope_theta", "positive"),
    Limit(
        gn.key("rope.dimension_count"),
        "rotary_dim",
        f"{_CFG} partial_rotary_factor x head_dim",
        "int",
        2,
        "head_dim",
    ),
    Limit(gn.key("attention.layer_norm_rms_epsilon"), "rms_norm_eps", f"{_CFG} rms_norm_eps", "positive"),
    Limit(gn.key("expert_count"), "num_experts", f"{_CFG} num_experts", "int", 1, LLAMA_MAX_EXPERTS),
    Limit(
        gn.key("expert_used_count"),
        "num_experts_per_tok",
        f"{_CFG} num_experts_per_tok",
        "int",
        1,
        "num_experts",
    ),
    Limit(
        gn.key("expert_feed_forward_length"),
        "moe_intermediate_size",
        f"{_CFG} moe_intermediate_size",
        "int",
        1,
        MAX_SIZE,
    ),
    Limit(
        gn.key("expert_shared_feed_forward_length"),
        "shared_expert_intermediate_size",
        f"{_CFG} shared_expert_intermediate_size",
        "int",
        1,
        MAX_SIZE,
    ),
    Limit(
        gn.key("ssm.conv_kernel"), "linear_conv_kernel_dim", f"{_CFG} linear_conv_kernel_dim", "int", 2, 64
    ),
    Limit(gn.key("ssm.state_size"), "linear_key_head_dim", f"{_CFG} linear_key_head_dim", "int", 1, 4096),
    Limit(gn.key("ssm.group_count"), "linear_num_key_heads", f"{_CFG} linear_num_key_heads", "int", 1, 4096),
    Limit(
        gn.key("ssm.time_step_rank"),
        "linear_num_value_heads",
        f"{_CFG} linear_num_value_heads",
        "int",
        "linear_num_key_heads",
        4096,
    ),
    Limit(gn.key("ssm.inner_size"), "value_dim", f"{_CFG} linear value heads x head dim", "int", 1, MAX_SIZE),
    Limit(
        gn.key("full_attention_interval"),
        "full_attention_interval",
        f"{_CFG} full_attention_interval",
        "int",
        1,
        LLAMA_MAX_LAYERS + 1,
    ),
)

DIFFUSION_LIMITS: tuple[Limit, ...] = (
    Limit(gn.key("diffusion.block_size"), "block_size", f"{_GEN} block_size", "int", 1, MAX_BLOCK),
    Limit(gn.key("diffusion.threshold"), "threshold", f"{_GEN} threshold", "real", 0, 1),
    Limit(gn.key("diffusion.logit_shift"), "logit_shift", f"{_GEN} logit_shift", "int", 0, 1),
    Limit(gn.DIFFUSION_CORESET_TOP_P, "coreset_top_p", f"{_CFG} moe_block_coreset_top_p", "real", 0, 1),
    Limit(
        gn.key("diffusion.max_new_tokens"), "max_new_tokens", f"{_GEN} max_new_tokens", "int", 1, 2**31 - 1
    ),
    Limit(gn.key("diffusion.presence_penalty"), "presence_penalty", f"{_GEN} presence_penalty", "real"),
    Limit(gn.key("diffusion.frequency_penalty"), "frequency_penalty", f"{_GEN} frequency_penalty", "real"),
    Limit(
        gn.key("diffusion.repetition_penalty"), "repetition_penalty", f"{_GEN} repetition_penalty", "positive"
    ),
    Limit(gn.key("diffusion.stop_ramp_start"), "stop_ramp_start", f"{_GEN} stop_ramp_start", "real", 0, 1),
    Limit(gn.key("diffusion.stop_ramp_max"), "stop_ramp_max", f"{_GEN} stop_ramp_max", "real"),
    Limit(gn.key("diffusion.think_ramp_start"), "think_ramp_start", f"{_GEN} think_ramp_start", "real", 0, 1),
    Limit(gn.key("diffusion.think_ramp_max"), "think_ramp_max", f"{_GEN} think_ramp_max", "real"),
)

LIMITS = MODEL_LIMITS + DIFFUSION_LIMITS


def violation(limit: Limit, value: Any, bound: Callable[[str], Any]) -> str | None:
    """Why `value` is outside `limit` ("must be ..."), or None; `bound` reads another row's value."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "must be a number"
    if not math.isfinite(value):
        return "must be finite"
    if limit.kind == "positive":
        return None if value > 0 else "must be > 0"
    if limit.kind == "int" and not float(value).is_integer():
        return "must be an integer"
    lo, hi = (bound(b) if isinstance(b, str) else b for b in (limit.lo, limit.hi))
    if isinstance(lo, int | float) and isinstance(hi, int | float) and not lo <= value <= hi:
        return f"must be in {_num(lo)}..{_num(hi)}"
    return None


def check_values(
    values: Mapping[str, Any], limits: tuple[Limit, ...], by_key: bool
) -> tuple[Limit, Any, str] | None:
    """The first (limit, value, reason) that fails among the rows present in `values`.

    `values` is keyed by GGUF key (`by_key`) or by config field; bounds naming another row are
    looked up the same way.
    """
    fields = {lim.field: lim.key for lim in LIMITS}

    def bound(name: str) -> Any:
        return values.get(fields[name] if by_key else name)

    for lim in limits:
        name = lim.key if by_key else lim.field
        if name in values and values[name] is not None:
            why = violation(lim, values[name], bound)
            if why:
                return lim, values[name], why
    return None


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)
