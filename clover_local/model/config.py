"""Clover model and generation configuration, read once from a checkpoint directory.

One dataclass of hyperparameters serves the converter, the numpy reference and the test-checkpoint
generator, so the three can never disagree about what a key means. Values the publisher's files
may spell in several places (config, generation config, tokenizer config) are resolved here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from . import json_fields as jf
from .decoding_parameters import (
    BY_NAME,
    CONFIG,
    GENERATION_CONFIG,
    PARAMETERS,
    DecodingParameters,
    Parameter,
)
from .hparam_limits import (
    DIFFUSION_LIMITS,
    LLAMA_MAX_LAYERS,
    MODEL_LIMITS,
    Limit,
    check_values,
    rope_sections_violation,
)
from .json_fields import ConfigError

ARCHITECTURES = ("CloverMoeModelLM", "CloverMoeForCausalLM")
MODEL_TYPES = ("clover_moe", "clover_moe_text")
CONTEXT_LIMIT = 131072  # model card: prompt and response together [vendor]


LAYER_TYPES = ("full_attention", "linear_attention")
# generation_config.json sampling keys the converter writes as general.sampling.*: allowed range
SAMPLING_EXTRAS = {"top_k": (0, 2**31 - 1), "top_p": (0, 1), "min_p": (0, 1), "temperature": (0, 1e4)}
# the decoding parameters config.json holds (block size, the previews' coreset): `CloverConfig` fields
CONFIG_PARAMETERS = tuple(p for p in PARAMETERS if p.config_key is not None)


def check_limits(values: Any, limits: tuple[Limit, ...]) -> None:
    """Range-check the parsed values against what llama.cpp accepts (`hparam_limits`)."""
    present = tuple(lim for lim in limits if hasattr(values, lim.field))
    bad = check_values({lim.field: getattr(values, lim.field) for lim in present}, present, by_key=False)
    if bad:
        lim, value, why = bad
        raise ConfigError(f"{lim.source} is {value}: {why}")


@dataclass(frozen=True)
class CloverConfig:
    """Hyperparameters of the Clover (Qwen3.5-MoE trunk + block diffusion) text model."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    layer_types: tuple[str, ...]
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float
    partial_rotary_factor: float
    mrope_section: tuple[int, ...]
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    max_position_embeddings: int
    # block diffusion: the mask token, and the decoding parameters of `CONFIG_PARAMETERS`
    mask_token_id: int | None
    block_size: int
    coreset_enabled: bool
    coreset_top_p: float
    coreset_size: int = 0  # > 0: force the coreset to this many experts (benchmarks; never in a checkpoint)

    # derived sizes -------------------------------------------------------------------------
    @property
    def is_attention(self) -> tuple[bool, ...]:
        return tuple(t == "full_attention" for t in self.layer_types)

    @property
    def full_attention_interval(self) -> int:
        idx = [i for i, a in enumerate(self.is_attention) if a]
        return idx[0] + 1 if idx else self.num_hidden_layers + 1

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    @property
    def v_per_k(self) -> int:
        return self.linear_num_value_heads // self.linear_num_key_heads

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> CloverConfig:
        """Build from a `config.json` dict (flat, or with the trunk under `text_config`)."""
        c = "config.json"
        archs = cfg.get("architectures") or []
        archs = archs if isinstance(archs, list) else [archs]
        if not any(a in ARCHITECTURES for a in archs) and cfg.get("model_type") not in MODEL_TYPES:
            found = ", ".join(map(str, archs)) or str(cfg.get("model_type") or "none")
            raise ConfigError(f"not a Clover checkpoint: architectures {found} (expected CloverMoeModelLM)")
        text = {**cfg, **jf.get_object(cfg, "text_config", c)}
        rope = {**text, **jf.get_object(text, "rope_parameters", c)}
        n_layers = jf.get_int(text, "num_hidden_layers", c)
        if not 1 <= n_layers <= LLAMA_MAX_LAYERS:
            raise ConfigError(f"{c} num_hidden_layers is {n_layers}: must be in 1..{LLAMA_MAX_LAYERS}")
        interval = jf.get_int(text, "full_attention_interval", c, 4)
        layer_types = jf.get_list(text, "layer_types", c, str, []) or [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n_layers)
        ]
        if len(layer_types) != n_layers or not set(layer_types) <= set(LAYER_TYPES):
            raise ConfigError(
                f"{c}: layer_types must list num_hidden_layers ({n_layers}) of {' / '.join(LAYER_TYPES)}"
            )
        model = cls(
            vocab_size=jf.get_int(text, "vocab_size", c),
            hidden_size=jf.get_int(text, "hidden_size", c),
            num_hidden_layers=n_layers,
            layer_types=tuple(layer_types),
            num_attention_heads=jf.get_int(text, "num_attention_heads", c),
            num_key_value_heads=jf.get_int(text, "num_key_value_heads", c),
            head_dim=jf.get_int(text, "head_dim", c, 256),
            rope_theta=jf.get_float(rope, "rope_theta", c, 1e7),
            partial_rotary_factor=jf.get_float(rope, "partial_rotary_factor", c, 0.25),
            mrope_section=tuple(jf.get_list(rope, "mrope_section", c, int, [11, 11, 10])),
            linear_num_key_heads=jf.get_int(text, "linear_num_key_heads", c),
            linear_num_value_heads=jf.get_int(text, "linear_num_value_heads", c),
            linear_key_head_dim=jf.get_int(text, "linear_key_head_dim", c),
            linear_value_head_dim=jf.get_int(text, "linear_value_head_dim", c),
            linear_conv_kernel_dim=jf.get_int(text, "linear_conv_kernel_dim", c),
            num_experts=jf.get_int(text, "num_experts", c),
            num_experts_per_tok=jf.get_int(text, "num_experts_per_tok", c),
            moe_intermediate_size=jf.get_int(text, "moe_intermediate_size", c),
            shared_expert_intermediate_size=jf.get_int(text, "shared_expert_intermediate_size", c),
            rms_norm_eps=jf.get_float(text, "rms_norm_eps", c, 1e-6),
            tie_word_embeddings=jf.get_bool(
                cfg, "tie_word_embeddings", c, jf.get_bool(text, "tie_word_embeddings", c, False)
            ),
            max_position_embeddings=jf.get_int(text, "max_position_embeddings", c, CONTEXT_LIMIT),
            mask_token_id=jf.get_opt_int(text, "mask_token_id", c),
            **{p.name: p.default for p in CONFIG_PARAMETERS}
            | _parameters(text, CONFIG, {p.config_key: p for p in CONFIG_PARAMETERS}),
        )
        check_limits(model, MODEL_LIMITS)
        why = rope_sections_violation(model.mrope_section, model.head_dim)
        if why:
            raise ConfigError(f"{c} mrope_section is {list(model.mrope_section)}: {why}")
        return model

    def with_overrides(self, **kw: Any) -> CloverConfig:
        return CloverConfig(**{**{f.name: getattr(self, f.name) for f in fields(self)}, **kw})


@dataclass(frozen=True, kw_only=True)
class GenerationDefaults(DecodingParameters):
    """Decoding defaults of a checkpoint (`generation_config.json`, and config.json for
    `CONFIG_PARAMETERS`; the table's defaults where a key is absent) or of a GGUF, the stop tokens,
    and generation_config.json's other keys (`extra`: sampling values and the like)."""

    eos_token_ids: tuple[int, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, gen: dict[str, Any]) -> GenerationDefaults:
        """From `generation_config.json`'s keys, or a GGUF's `clover-moe.diffusion.*` ones (same names),
        each type- and range-checked."""
        g = GENERATION_CONFIG
        eos = gen.get("eos_token_id")
        eos_list = {"eos_token_id": [eos] if isinstance(eos, int) else eos or []}
        eos_ids = tuple(jf.get_list(eos_list, "eos_token_id", g, int))
        kw = _parameters(gen, g, BY_NAME)
        extra = {k: v for k, v in gen.items() if k not in BY_NAME}
        for key, (lo, hi) in SAMPLING_EXTRAS.items():  # written as general.sampling.* keys
            if extra.get(key) is not None and not lo <= jf.get_float(extra, key, g) <= hi:
                raise ConfigError(f"{g} {key} is {extra[key]}: must be in {lo}..{hi}")
        defaults = cls(eos_token_ids=eos_ids, extra=extra, **kw)
        check_limits(defaults, DIFFUSION_LIMITS)
        return defaults


@dataclass(frozen=True)
class CheckpointConfig:
    """Everything a checkpoint directory says about the model, resolved from its three files."""

    model: CloverConfig
    generation: GenerationDefaults
    raw: dict[str, Any]

    @classmethod
    def from_dir(cls, path: str | Path) -> CheckpointConfig:
        path = Path(path)
        cfg_path = path / "config.json"
        if not cfg_path.is_file():
            raise ConfigError(f"{path}: no config.json (is this a Hugging Face checkpoint directory?)")
        raw = _read_json(cfg_path)
        gen = (
            _read_json(path / "generation_config.json") if (path / "generation_config.json").is_file() else {}
        )
        tok_cfg = (
            _read_json(path / "tokenizer_config.json") if (path / "tokenizer_config.json").is_file() else {}
        )
        model = CloverConfig.from_dict(raw)
        in_both = {p.name: p for p in CONFIG_PARAMETERS if p.generation}  # generation_config.json wins
        model = model.with_overrides(
            mask_token_id=resolve_mask_token_id(raw, gen, tok_cfg),
            **_parameters(gen, GENERATION_CONFIG, in_both),
        )
        check_limits(model, DIFFUSION_LIMITS)
        config_only = {p.name for p in CONFIG_PARAMETERS if not p.generation}
        values = {k: v for k, v in gen.items() if k not in config_only}
        values.update({p.name: getattr(model, p.name) for p in CONFIG_PARAMETERS})
        generation = GenerationDefaults.from_dict(values)
        if not generation.eos_token_ids and "eos_token_id" in raw:
            generation = GenerationDefaults.from_dict({**values, "eos_token_id": raw["eos_token_id"]})
        ids = [("mask_token_id", model.mask_token_id)]
        ids += [("eos_token_id", i) for i in generation.eos_token_ids]
        for key, tid in ids:
            if tid is not None and not 0 <= tid < model.vocab_size:
                raise ConfigError(f"{key} {tid} is not a token of the {model.vocab_size}-row vocabulary")
        return cls(model=model, generation=generation, raw=raw)


def _parameters(d: dict[str, Any], source: str, by_key: dict[str, Parameter]) -> dict[str, Any]:
    """The decoding parameters `d` sets (`by_key`: its key -> the table's row), typed, by field name."""
    return {p.name: jf.coerce(d[k], p.default, k, source) for k, p in by_key.items() if d.get(k) is not None}


def resolve_mask_token_id(cfg: dict[str, Any], gen: dict[str, Any], tok_cfg: dict[str, Any]) -> int:
    """Find the mask token id [ours: key names]; never guess silently.

    Looked up in config, generation config and tokenizer config, then as a `<|mask|>` special
    token of the tokenizer config. Absent everywhere is an error.
    """
    text = {**cfg, **jf.get_object(cfg, "text_config", "config.json")}
    sources = ("config.json", "generation_config.json", "tokenizer_config.json")
    for src, name in zip((text, gen, tok_cfg), sources, strict=True):
        if src.get("mask_token_id") is not None:
            return jf.get_int(src, "mask_token_id", name)
    for tid, tok in jf.get_object(tok_cfg, "added_tokens_decoder", "tokenizer_config.json").items():
        if isinstance(tok, dict) and tok.get("content") == "<|mask|>" and tid.isdigit():
            return int(tid)
    raise ConfigError(
        "no mask token id: none of config.json, generation_config.json or tokenizer_config.json "
        "gives mask_token_id, and the tokenizer has no <|mask|> token"
    )


def _read_json(path: Path) -> dict[str, Any]:
    return jf.read_object(path)
