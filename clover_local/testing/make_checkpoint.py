"""Generated Clover checkpoints: Hugging Face layout exactly as the publisher's, at small sizes.

`write_checkpoint(out_dir, preset, seed)` writes `config.json`, `generation_config.json`, the
tokenizer files and BF16 weights in several safetensors shards plus their index. Tensor names and
shapes come from `tensors.expected_shapes`, so generator and readers cannot drift apart.

Weights are random but deterministic and numerically tame: each tensor draws from its own
generator seeded by (seed, canonical name), so the layout variants of a preset (prefix, expert
layout, layer count) hold identical values for the tensors they share, and projections are scaled
by 1/sqrt(fan_in) (residual writers by a further gain < 1) so 40-layer runs keep O(1) activations.
The output head is scaled so that next-token distributions are peaked, and masked rows are made
to depend on context and position (small mask embedding, q/k norms favouring the rotary dims):
greedy block-diffusion passes at threshold 0.9 fill anywhere from one to many positions.

CLI: `python -m clover_local.testing.make_checkpoint OUT_DIR --preset tiny [--seed N] [--layers N]`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from clover_local.model.checkpoint import canonical_name
from clover_local.model.config import CONTEXT_LIMIT, CloverConfig
from clover_local.model.decoding_parameters import PARAMETERS
from clover_local.model.tensors import expected_shapes

from .safetensors_writer import chunked, write_sharded
from .tokenizer_files import Vocabulary, write_tokenizer

CHUNK = 1 << 22  # values generated per step: bounds memory at ~16 MB float32 per chunk
SHARD_BYTES = 2 << 30  # full-size shards stay under ~2 GiB


@dataclass(frozen=True)
class Preset:
    """Sizes, layout and value scales of one generated checkpoint."""

    hidden_size: int = 64
    num_layers: int = 4
    attention_interval: int = 4  # layer i is full attention iff (i + 1) % interval == 0
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    mrope_section: tuple[int, ...] = (2, 1, 1)  # sums to head_dim * 0.25 / 2
    linear_num_key_heads: int = 2
    linear_num_value_heads: int = 4
    linear_key_head_dim: int = 16
    linear_value_head_dim: int = 16
    conv_kernel: int = 4
    num_experts: int = 8
    experts_per_tok: int = 2
    moe_intermediate_size: int = 32
    shared_expert_intermediate_size: int = 32
    vocab_size: int = 512  # embedding rows; may exceed the tokenizer's size (the real model pads)
    tokenizer: str = "tiny"  # tiny | qwen
    # layout variants
    fused_experts: bool = True
    prefix: str = "model."
    tie_word_embeddings: bool = False
    diffusion: bool = True
    min_shards: int = 3
    # value scales
    head_gain: float = 8.0  # logit std: 8 over ~500 tokens -> ~30% of rows have p_max >= 0.9
    residual_gain: float = 0.5  # std of residual-writing projections' outputs
    router_gain: float = 2.0  # router logit std: peaked enough that coresets shrink
    # A random model sees a block of identical mask rows and would predict one token for all of
    # them in one pass. A small mask embedding lets context drive masked rows, and q/k norm
    # weights that favour the rotary dims make attention position-dependent, so passes fill
    # varying numbers of positions, as a trained model's do.
    mask_embed_scale: float = 0.1
    rope_qk_gain: float = 2.0  # q_norm/k_norm zero-centred weight added on the rotary dims


PRESETS: dict[str, Preset] = {
    "tiny": Preset(),
    "tiny-per-expert": Preset(fused_experts=False),
    "tiny-lm-prefix": Preset(prefix="model.language_model."),
    "tiny-tied": Preset(tie_word_embeddings=True),
    "tiny-ar-only": Preset(diffusion=False),
    "tiny-qwen-vocab": Preset(tokenizer="qwen", vocab_size=151936, head_gain=10.0),
    # logit std 1 over 512 tokens: no row is confident, so greedy picks flip under any quantization
    # (`clover verify` must judge such a model by its distributions, not by its argmax)
    "tiny-flat": Preset(head_gain=1.0),
    "small": Preset(num_layers=8),
    "full-width": Preset(
        hidden_size=2048,
        num_attention_heads=16,
        num_key_value_heads=2,
        head_dim=256,
        mrope_section=(11, 11, 10),
        linear_num_key_heads=16,
        linear_num_value_heads=32,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        num_experts=256,
        experts_per_tok=8,
        moe_intermediate_size=512,
        shared_expert_intermediate_size=512,
        vocab_size=248320,
        tokenizer="qwen",
        head_gain=10.0,
    ),
}

# generation_config.json: every parameter it holds, at the table's defaults but for a longer budget
# and ramps switched on (so that the tests exercise them)
GENERATION_DEFAULTS: dict[str, Any] = {
    **{p.name: p.default for p in PARAMETERS if p.generation},
    "max_new_tokens": 4096,
    "stop_ramp_start": 0.75,
    "stop_ramp_max": 4.0,
    "think_ramp_start": 0.5,
    "think_ramp_max": 4.0,
}


# -- config files -----------------------------------------------------------------------------
def config_json(p: Preset, v: Vocabulary) -> dict[str, Any]:
    """`config.json`: Qwen3.5-MoE text keys (transformers' names) plus Clover's diffusion keys."""
    layer_types = [
        "full_attention" if (i + 1) % p.attention_interval == 0 else "linear_attention"
        for i in range(p.num_layers)
    ]
    return {
        "architectures": ["CloverMoeModelLM"],
        "model_type": "clover_moe",
        "dtype": "bfloat16",
        "vocab_size": p.vocab_size,
        "hidden_size": p.hidden_size,
        "num_hidden_layers": p.num_layers,
        "layer_types": layer_types,
        "full_attention_interval": p.attention_interval,
        "num_attention_heads": p.num_attention_heads,
        "num_key_value_heads": p.num_key_value_heads,
        "head_dim": p.head_dim,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "linear_num_key_heads": p.linear_num_key_heads,
        "linear_num_value_heads": p.linear_num_value_heads,
        "linear_key_head_dim": p.linear_key_head_dim,
        "linear_value_head_dim": p.linear_value_head_dim,
        "linear_conv_kernel_dim": p.conv_kernel,
        "num_experts": p.num_experts,
        "num_experts_per_tok": p.experts_per_tok,
        "moe_intermediate_size": p.moe_intermediate_size,
        "shared_expert_intermediate_size": p.shared_expert_intermediate_size,
        "router_aux_loss_coef": 0.001,
        "output_router_logits": False,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": list(p.mrope_section),
            "mrope_interleaved": True,
        },
        "rms_norm_eps": 1e-06,
        "initializer_range": 0.02,
        "tie_word_embeddings": p.tie_word_embeddings,
        "max_position_embeddings": CONTEXT_LIMIT,
        "use_cache": True,
        "eos_token_id": v.added["<|im_end|>"],
        "pad_token_id": v.added["<|endoftext|>"],
        "bos_token_id": None,
        # block diffusion [ours: key names except moe_block_coreset_*]: the mask, and the decoding
        # parameters config.json holds, at their defaults
        "mask_token_id": v.added["<|mask|>"],
        **{p.config_key: p.default for p in PARAMETERS if p.config_key is not None},
    }


def generation_config_json(v: Vocabulary) -> dict[str, Any]:
    return {
        **GENERATION_DEFAULTS,
        "eos_token_id": [v.added["<|im_end|>"], v.added["<|endoftext|>"]],
        "pad_token_id": v.added["<|endoftext|>"],
        "do_sample": False,
    }


# -- weights ----------------------------------------------------------------------------------
def _rng(seed: int, name: str) -> np.random.Generator:
    """One independent stream per (seed, canonical tensor name)."""
    return np.random.Generator(np.random.SFC64(np.random.SeedSequence([seed, zlib.crc32(name.encode())])))


def _bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> BF16 bits by truncation: twice as fast as rounding, irrelevant for random data."""
    return np.ascontiguousarray(np.ascontiguousarray(x, dtype=np.float32).view(np.uint16)[1::2])


def _normal_chunks(
    rng: np.random.Generator, n: int, mean: float, std: float
) -> Iterator[tuple[int, np.ndarray]]:
    """(offset, float32 values) chunks; the buffer is reused, so consume each before the next."""
    buf = np.empty(min(n, CHUNK), dtype=np.float32)
    start = 0
    for size in chunked(n, CHUNK):
        x = buf[:size]
        rng.standard_normal(out=x, dtype=np.float32)
        x *= std
        if mean:
            x += mean
        yield start, x
        start += size


def _special_values(name: str, n: int, rng: np.random.Generator, p: Preset) -> np.ndarray | None:
    """Small tensors with their own distributions (None for plain normals)."""
    if name.endswith(("self_attn.q_norm.weight", "self_attn.k_norm.weight")):
        w = 0.05 * rng.standard_normal(n)
        w[: int(n * 0.25)] += p.rope_qk_gain  # the first head_dim * partial_rotary_factor rotate
        return w
    if name.endswith("A_log"):  # decay rates A in [1, 16]
        return np.log(rng.uniform(1.0, 16.0, n))
    if name.endswith("dt_bias"):  # Mamba-style: softplus(dt_bias) log-uniform in [1e-3, 1e-1]
        dt = np.exp(rng.uniform(math.log(1e-3), math.log(1e-1), n))
        return dt + np.log(-np.expm1(-dt))
    if name.endswith("bd_softmax_logit_scale"):
        return rng.uniform(1.0, 4.0, n)
    if name.endswith("bd_softmax_history_bias"):
        return rng.standard_normal(n)
    if name.endswith("bd_softmax_history_c"):
        return 1.0 + 0.1 * rng.standard_normal(n)
    return None


def normal_params(name: str, shape: tuple[int, ...], p: Preset) -> tuple[float, float]:
    """(mean, std) of a plain-normal tensor, from its role."""
    fan_in = shape[-1]
    if name == "embed_tokens.weight":
        return 0.0, (p.head_gain / math.sqrt(p.hidden_size) if p.tie_word_embeddings else 1.0)
    if name == "lm_head.weight":
        return 0.0, p.head_gain / math.sqrt(fan_in)
    if name.endswith("linear_attn.norm.weight"):  # applied as w (gated RMSNorm)
        return 1.0, 0.05
    if name.endswith("norm.weight"):  # zero-centred RMSNorms, applied as 1 + w
        return 0.0, 0.05
    if name.endswith("mlp.gate.weight"):
        return 0.0, p.router_gain / math.sqrt(fan_in)
    if name.endswith("conv_right_weight"):
        return 0.0, 0.5 / math.sqrt(fan_in)
    if name.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight", "experts.down_proj")):
        return 0.0, p.residual_gain / math.sqrt(fan_in)
    return 0.0, 1.0 / math.sqrt(fan_in)


class WeightSource:
    """Stored name, shape -> BF16 chunks; per-expert tensors are slices of the fused values (kept
    per thread: the shards are written concurrently)."""

    def __init__(self, p: Preset, seed: int, mask_token_id: int):
        self.p, self.seed, self.mask_token_id = p, seed, mask_token_id
        self._local = threading.local()

    def __call__(self, stored: str, shape: tuple[int, ...]) -> Iterator[np.ndarray]:
        name = canonical_name(stored)
        parts = name.split(".")
        if parts[2:4] == ["mlp", "experts"] and parts[4].isdigit():
            yield self._per_expert(int(parts[1]), int(parts[4]), parts[5])
            return
        yield from self._values(name, shape)

    def _values(self, name: str, shape: tuple[int, ...]) -> Iterator[np.ndarray]:
        rng, n = _rng(self.seed, name), math.prod(shape)
        special = _special_values(name, n, rng, self.p)
        if special is not None:
            yield _bf16(special)
            return
        for start, x in _normal_chunks(rng, n, *normal_params(name, shape, self.p)):
            if name == "embed_tokens.weight":
                self._scale_mask_row(x, start, shape[1])
            yield _bf16(x)

    def _scale_mask_row(self, x: np.ndarray, start: int, width: int) -> None:
        """Scale the part of the mask token's embedding row that falls in chunk x (at `start`)."""
        a = max(self.mask_token_id * width - start, 0)
        b = min((self.mask_token_id + 1) * width - start, x.size)
        if a < b:
            x[a:b] *= self.p.mask_embed_scale

    def _per_expert(self, layer: int, e: int, proj: str) -> np.ndarray:
        p = self.p
        inter, h = p.moe_intermediate_size, p.hidden_size
        fused = f"layers.{layer}.mlp.experts." + ("down_proj" if proj == "down_proj" else "gate_up_proj")
        shape = (p.num_experts, h, inter) if proj == "down_proj" else (p.num_experts, 2 * inter, h)
        cached = getattr(self._local, "fused", None)
        if cached is None or cached[0] != fused:
            values = np.concatenate(list(self._values(fused, shape))).reshape(shape)
            cached = self._local.fused = (fused, values)
        w = cached[1][e]
        return {"gate_proj": w[:inter], "up_proj": w[inter:], "down_proj": w}[proj].reshape(-1)


def stored_tensors(p: Preset, cfg: CloverConfig) -> list[tuple[str, tuple[int, ...]]]:
    """(stored name, shape) in file order: embedding, layers, final norm, head."""
    shapes = expected_shapes(cfg, fused_experts=p.fused_experts, diffusion=p.diffusion)
    order = ["embed_tokens.weight"] + [n for n in shapes if n.startswith("layers.")]
    order += [n for n in ("norm.weight", "lm_head.weight") if n in shapes]
    return [(n if n == "lm_head.weight" else p.prefix + n, tuple(shapes[n])) for n in order]


# -- writing ----------------------------------------------------------------------------------
def resolve_preset(preset: str, layers: int | None = None) -> Preset:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    p = PRESETS[preset]
    return p if layers is None else replace(p, num_layers=layers)


def write_checkpoint(
    out_dir: Path, preset: str, seed: int = 0, *, layers: int | None = None, workers: int | None = None
) -> Path:
    """Write a generated checkpoint into `out_dir` (absent or empty) and return its path; `workers`
    threads write the shards (default: one per core), the same bytes for any count.

    Everything is written into a hidden sibling directory first and renamed at the end, so an
    interrupted run never leaves a half-written checkpoint behind.
    """
    out_dir = Path(out_dir)
    p = resolve_preset(preset, layers)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise FileExistsError(f"{out_dir} exists and is not an empty directory")
    tmp = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}"
    tmp.mkdir(parents=True)
    try:
        _write_all(tmp, p, seed, workers)
        if out_dir.exists():
            out_dir.rmdir()
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _write_all(out: Path, p: Preset, seed: int, workers: int | None) -> None:
    v = write_tokenizer(out, p.tokenizer, CONTEXT_LIMIT)
    if v.size > p.vocab_size:
        raise ValueError(f"tokenizer has {v.size} tokens but the preset's vocab_size is {p.vocab_size}")
    cfg_dict = config_json(p, v)
    _write_json(out / "config.json", cfg_dict)
    _write_json(out / "generation_config.json", generation_config_json(v))
    cfg = CloverConfig.from_dict(cfg_dict)
    tensors = stored_tensors(p, cfg)
    total = sum(math.prod(s) * 2 for _, s in tensors)
    n_shards = max(p.min_shards, math.ceil(total / SHARD_BYTES))
    write_sharded(out, tensors, n_shards, WeightSource(p, seed, v.added["<|mask|>"]), workers)


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")


# -- CLI --------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m clover_local.testing.make_checkpoint",
        description="Write a generated Clover checkpoint (Hugging Face layout, BF16 safetensors shards, "
        "tokenizer and config files) for tests and benchmarks.",
    )
    ap.add_argument("out_dir", type=Path, help="output directory (must not exist, or be empty)")
    ap.add_argument(
        "--preset", default="tiny", choices=list(PRESETS), help="sizes and layout (default: tiny)"
    )
    ap.add_argument("--seed", type=int, default=0, help="random seed of the weights (default: 0)")
    ap.add_argument(
        "--layers", type=int, help="number of layers (default: the preset's; attention every 4th)"
    )
    args = ap.parse_args(argv)
    start = time.perf_counter()
    try:
        path = write_checkpoint(args.out_dir, args.preset, args.seed, layers=args.layers)
    except (FileExistsError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    size = sum(f.stat().st_size for f in path.iterdir())
    secs = time.perf_counter() - start
    print(f"wrote {path} ({args.preset}, {size / 1e6:.1f} MB in {secs:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
