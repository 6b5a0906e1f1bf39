"""Clover model and generation configuration, read once from a checkpoint directory.

One dataclass of hyperparameters serves the converter, the numpy reference and the test-checkpoint
generator, so the three can never disagree about what a key means. Values the publisher's files
may spell in several places (config, generation config, tokenizer config) are resolved here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .decoding_parameters import PARAMETERS, DecodingParameters

ARCHITECTURES = ("CloverMoeModelLM", "CloverMoeForCausalLM")
MODEL_TYPES = ("clover_moe", "clover_moe_text")
CONTEXT_LIMIT = 131072  # model card: prompt and response together [vendor]


class ConfigError(ValueError):
    """A checkpoint's configuration is missing, malformed or not a Clover model."""


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
    # block diffusion
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
        archs = cfg.get("architectures") or []
        if not any(a in ARCHITECTURES for a in archs) and cfg.get("model_type") not in MODEL_TYPES:
            found = ", ".join(archs) or cfg.get("model_type") or "none"
            raise ConfigError(f"not a Clover checkpoint: architectures {found} (expected CloverMoeModelLM)")
        text = {**cfg, **cfg.get("text_config", {})}
        try:
            n_layers = int(text["num_hidden_layers"])
            rope = dict(text.get("rope_parameters") or {})
            interval = int(text.get("full_attention_interval", 4))
            layer_types = text.get("layer_types") or [
                "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n_layers)
            ]
            return cls(
                vocab_size=int(text["vocab_size"]),
                hidden_size=int(text["hidden_size"]),
                num_hidden_layers=n_layers,
                layer_types=tuple(layer_types),
                num_attention_heads=int(text["num_attention_heads"]),
                num_key_value_heads=int(text["num_key_value_heads"]),
                head_dim=int(text.get("head_dim", 256)),
                rope_theta=float(rope.get("rope_theta", text.get("rope_theta", 1e7))),
                partial_rotary_factor=float(
                    rope.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25))
                ),
                mrope_section=tuple(rope.get("mrope_section", (11, 11, 10))),
                linear_num_key_heads=int(text["linear_num_key_heads"]),
                linear_num_value_heads=int(text["linear_num_value_heads"]),
                linear_key_head_dim=int(text["linear_key_head_dim"]),
                linear_value_head_dim=int(text["linear_value_head_dim"]),
                linear_conv_kernel_dim=int(text["linear_conv_kernel_dim"]),
                num_experts=int(text["num_experts"]),
                num_experts_per_tok=int(text["num_experts_per_tok"]),
                moe_intermediate_size=int(text["moe_intermediate_size"]),
                shared_expert_intermediate_size=int(text["shared_expert_intermediate_size"]),
                rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
                tie_word_embeddings=bool(
                    cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
                ),
                max_position_embeddings=int(text.get("max_position_embeddings", CONTEXT_LIMIT)),
                mask_token_id=_opt_int(text.get("mask_token_id")),
                block_size=int(text.get("block_size", 32)),
                coreset_enabled=bool(text.get("moe_block_coreset_enabled", True)),
                coreset_top_p=float(text.get("moe_block_coreset_top_p", 0.9)),
            )
        except KeyError as e:
            raise ConfigError(f"config.json lacks the key {e.args[0]!r}") from None

    def with_overrides(self, **kw: Any) -> CloverConfig:
        return CloverConfig(**{**{f.name: getattr(self, f.name) for f in fields(self)}, **kw})


@dataclass(frozen=True, kw_only=True)
class GenerationDefaults(DecodingParameters):
    """Decoding defaults of `generation_config.json` (the table's defaults where a key is absent),
    its stop tokens, and its other keys (`extra`: sampling values and the like)."""

    eos_token_ids: tuple[int, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, gen: dict[str, Any]) -> GenerationDefaults:
        """From `generation_config.json`'s keys, or a GGUF's `clover-moe.diffusion.*` ones (same names)."""
        eos = gen.get("eos_token_id", ())
        eos_ids = (eos,) if isinstance(eos, int) else tuple(int(e) for e in eos or ())
        known = {p.name: p.type for p in PARAMETERS}
        kw = {k: kind(gen[k]) for k, kind in known.items() if k in gen}
        extra = {k: v for k, v in gen.items() if k not in known}
        return cls(eos_token_ids=eos_ids, extra=extra, **kw)


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
        model = model.with_overrides(
            mask_token_id=resolve_mask_token_id(raw, gen, tok_cfg),
            block_size=int(gen.get("block_size", model.block_size)),
        )
        generation = GenerationDefaults.from_dict({**gen, "block_size": model.block_size})
        if not generation.eos_token_ids and "eos_token_id" in raw:
            generation = GenerationDefaults.from_dict({**gen, "eos_token_id": raw["eos_token_id"]})
        return cls(model=model, generation=generation, raw=raw)


def resolve_mask_token_id(cfg: dict[str, Any], gen: dict[str, Any], tok_cfg: dict[str, Any]) -> int:
    """Find the mask token id [ours: key names]; never guess silently.

    Looked up in config, generation config and tokenizer config, then as a `<|mask|>` special
    token of the tokenizer config. Absent everywhere is an error.
    """
    text = {**cfg, **cfg.get("text_config", {})}
    for src in (text, gen, tok_cfg):
        if src.get("mask_token_id") is not None:
            return int(src["mask_token_id"])
    for tid, tok in (tok_cfg.get("added_tokens_decoder") or {}).items():
        if tok.get("content") == "<|mask|>":
            return int(tid)
    raise ConfigError(
        "no mask token id: none of config.json, generation_config.json or tokenizer_config.json "
        "gives mask_token_id, and the tokenizer has no <|mask|> token"
    )


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path}: cannot read JSON ({e})") from None
