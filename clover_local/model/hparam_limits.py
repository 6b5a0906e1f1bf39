"""What llama.cpp accepts for each Clover hyperparameter: one table for the converter and the runtime.

A valid-but-absurd value (`expert_used_count` 0, a negative or NaN norm epsilon, a rotary
dimension count of 0, a block size of 0) makes llama.cpp abort, hang or divide by zero. The
converter checks the values it is about to write (naming the checkpoint field) and the runtime
checks the values a GGUF holds (naming the key) before `llama_model_load`, against the same rows,
so anything the converter writes loads. The trunk's rows are here; the decoding parameters' come
from their table (`decoding_parameters`, its range column).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from . import gguf_names as gn
from .decoding_parameters import CONFIG, PARAMETERS
from .ranges import POSITIVE, Range

LLAMA_MAX_LAYERS = 512  # llama-hparams.h
LLAMA_MAX_EXPERTS = 1024  # llama-hparams.h
MAX_SIZE = 1 << 24  # any width or count far beyond a real model: rejected before allocation


@dataclass(frozen=True)
class Limit:
    """One hyperparameter: its GGUF key, where the converter reads it, and the allowed range.

    `low_field` / `high_field` name another row whose value bounds this one
    (`expert_used_count <= expert_count`), when that value is known.
    """

    key: str
    field: str  # CloverConfig / GenerationDefaults attribute
    source: str  # the checkpoint file (and field) it comes from, for messages
    range: Range
    low_field: str | None = None
    high_field: str | None = None

    def bounded(self, bound: Callable[[str], Any]) -> Range:
        """The range with the other rows' values (`bound(field)`) as its ends, where they are numbers."""
        r = self.range
        for end, name in (("low", self.low_field), ("high", self.high_field)):
            value = bound(name) if name else None
            if isinstance(value, int | float) and not isinstance(value, bool):
                r = replace(r, **{end: value})
        return r


def _int(low: int | None, high: int | None = None) -> Range:
    return Range(low, high, integer=True)


def _trunk(suffix: str, field: str, r: Range, source: str | None = None, **bounds: str) -> Limit:
    return Limit(gn.key(suffix), field, f"{CONFIG} {source or field}", r, **bounds)


MODEL_LIMITS: tuple[Limit, ...] = (
    _trunk("block_count", "num_hidden_layers", _int(1, LLAMA_MAX_LAYERS)),
    _trunk("context_length", "max_position_embeddings", _int(1, 2**31 - 1)),
    _trunk("embedding_length", "hidden_size", _int(1, MAX_SIZE)),
    _trunk("attention.head_count", "num_attention_heads", _int(1, 4096)),
    _trunk("attention.head_count_kv", "num_key_value_heads", _int(1), high_field="num_attention_heads"),
    _trunk("attention.key_length", "head_dim", _int(1, 4096)),
    _trunk("attention.value_length", "head_dim", _int(1, 4096)),
    _trunk("rope.freq_base", "rope_theta", POSITIVE),
    _trunk(
        "rope.dimension_count",
        "rotary_dim",
        _int(2),
        "partial_rotary_factor x head_dim",
        high_field="head_dim",
    ),
    _trunk("attention.layer_norm_rms_epsilon", "rms_norm_eps", POSITIVE),
    _trunk("expert_count", "num_experts", _int(1, LLAMA_MAX_EXPERTS)),
    _trunk("expert_used_count", "num_experts_per_tok", _int(1), high_field="num_experts"),
    _trunk("expert_feed_forward_length", "moe_intermediate_size", _int(1, MAX_SIZE)),
    _trunk("expert_shared_feed_forward_length", "shared_expert_intermediate_size", _int(1, MAX_SIZE)),
    _trunk("ssm.conv_kernel", "linear_conv_kernel_dim", _int(2, 64)),
    _trunk("ssm.state_size", "linear_key_head_dim", _int(1, 4096)),
    _trunk("ssm.group_count", "linear_num_key_heads", _int(1, 4096)),
    _trunk("ssm.time_step_rank", "linear_num_value_heads", _int(1, 4096), low_field="linear_num_key_heads"),
    _trunk("ssm.inner_size", "value_dim", _int(1, MAX_SIZE), "linear value heads x head dim"),
    _trunk("full_attention_interval", "full_attention_interval", _int(1, LLAMA_MAX_LAYERS + 1)),
)

DIFFUSION_LIMITS: tuple[Limit, ...] = tuple(
    Limit(p.gguf_key, p.name, p.source, p.range) for p in PARAMETERS if p.range is not None
)

LIMITS = MODEL_LIMITS + DIFFUSION_LIMITS


ROPE_SECTIONS = gn.key("rope.dimension_sections")
_INT = Range(integer=True)


def rope_sections_violation(sections: Sequence[Any], head_dim: Any) -> str | None:
    """Why the rotary sections (config.json's `mrope_section`) are outside what ggml's multi-section
    rope runs, or None: up to 4 counts >= 0, one of the first three > 0 and their sum at most the
    head dimension (else `GGML_ASSERT(sections[0] > 0 || ...)` / `(sect_dims <= ne0)` abort)."""
    if len(sections) > 4 or not all(_INT.allows(s) and s >= 0 for s in sections):
        return "must be up to 4 integers >= 0"
    if not any(sections[:3]):
        return "must have one of its first three sections > 0"
    if _INT.allows(head_dim) and sum(sections) > head_dim:
        return f"must add up to at most the head dimension, {head_dim}"
    return None


def violation(limit: Limit, value: Any, bound: Callable[[str], Any]) -> str | None:
    """Why `value` is outside `limit` ("must be ..."), or None; `bound` reads another row's value."""
    r = limit.bounded(bound)
    return None if r.allows(value) else f"must be {r.describe()}"


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
