"""For tests: a converted GGUF read back under checkpoint names, every conversion transform undone.

The numpy reference runs on any weight source with `get(canonical_name)`; serving a GGUF this way
lets tests check a whole converted file end to end (reference logits from the GGUF equal those
from the safetensors) and shows what quantization costs. The name table is the converter's own
(`plan.tensor_specs`); each of its transforms (`transforms.TRANSFORMS`) has its inverse here.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from clover_convert.file_check import shard_files
from clover_convert.plan import ExpertSpec, TensorSpec, tensor_specs
from clover_convert.transforms import Fn, qkv_apply, reorder_v_heads, value_heads
from gguf import GGUFReader, ReaderTensor
from gguf.quants import dequantize

from clover_local.model.config import CloverConfig


# -- the inverse of every conversion transform ---------------------------------------------------
def restore_v_heads(a: np.ndarray, axis: int, n_k: int, v_per_k: int, head_dim: int) -> np.ndarray:
    """Tiled -> grouped value-head order: the inverse of `reorder_v_heads`."""
    return reorder_v_heads(a, axis, v_per_k, n_k, head_dim)


def norm_minus_one(a: np.ndarray, cfg: CloverConfig) -> np.ndarray:
    return a.astype(np.float32) - np.float32(1)


def ssm_a_to_a_log(a: np.ndarray, cfg: CloverConfig) -> np.ndarray:
    return np.log(-restore_v_heads(a.astype(np.float32), 0, *value_heads(cfg), 1))


def head_rows_back(a: np.ndarray, cfg: CloverConfig) -> np.ndarray:
    return restore_v_heads(a, 0, *value_heads(cfg), 1)


def channel_rows_back(a: np.ndarray, cfg: CloverConfig) -> np.ndarray:
    return restore_v_heads(a, 0, *value_heads(cfg), cfg.linear_value_head_dim)


def channel_cols_back(a: np.ndarray, cfg: CloverConfig) -> np.ndarray:
    return restore_v_heads(a, 1, *value_heads(cfg), cfg.linear_value_head_dim)


def qkv_rows_back(a: np.ndarray, cfg: CloverConfig) -> np.ndarray:
    return qkv_apply(a, cfg, restore_v_heads)


def conv_unsqueeze(a: np.ndarray, cfg: CloverConfig) -> np.ndarray:
    return qkv_rows_back(a, cfg)[:, None, :]


def conv_right_back(a: np.ndarray, cfg: CloverConfig) -> np.ndarray:
    return qkv_rows_back(a, cfg)


def gate_up_join(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    return np.concatenate([gate, up], axis=-2)


INVERSES: dict[str, Fn] = {
    "identity": lambda a, cfg: a,
    "norm_plus_one": norm_minus_one,
    "a_log": ssm_a_to_a_log,
    "head_rows": head_rows_back,
    "channel_rows": channel_rows_back,
    "channel_cols": channel_cols_back,
    "qkv_rows": qkv_rows_back,
    "conv_squeeze": conv_unsqueeze,
    "conv_right": conv_right_back,
}


class GGUFWeights:
    """Float32 checkpoint tensors (HF names, HF value-head order, fused experts) from a GGUF."""

    def __init__(self, path: str | Path, cfg: CloverConfig):
        self.cfg = cfg
        self.readers = [GGUFReader(p) for p in shard_files(Path(path))]
        self.tensors: dict[str, ReaderTensor] = {t.name: t for r in self.readers for t in r.tensors}
        diffusion = f"blk.{_first_gdn_layer(cfg)}.ssm_conv1d_right.weight" in self.tensors
        self.specs = {s.source: s for s in tensor_specs(cfg, diffusion) if isinstance(s, TensorSpec)}
        self.experts = {
            (s.layer, s.part): s for s in tensor_specs(cfg, diffusion) if isinstance(s, ExpertSpec)
        }

    def names(self) -> list[str]:
        fused = [
            f"layers.{i}.mlp.experts.{p}"
            for i in range(self.cfg.num_hidden_layers)
            for p in ("gate_up_proj", "down_proj")
        ]
        return list(self.specs) + fused

    def dequantized(self, gguf_name: str) -> np.ndarray:
        """A GGUF tensor as float32 in numpy order, exactly as stored (no inverse transform)."""
        t = self.tensors[gguf_name]
        return dequantize(t.data, t.tensor_type).reshape(tuple(int(d) for d in reversed(t.shape)))

    def get(self, name: str) -> np.ndarray:
        m = re.fullmatch(r"layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)", name)
        if m:
            layer = int(m.group(1))
            if m.group(2) == "down_proj":
                return self.dequantized(self.experts[layer, "down"].gguf)
            gate, up = (self.dequantized(self.experts[layer, p].gguf) for p in ("gate", "up"))
            return gate_up_join(gate, up)
        spec = self.specs.get(name)
        if spec is None:
            raise KeyError(f"{name}: not a tensor of this GGUF")
        return INVERSES[spec.transform.name](self.dequantized(spec.gguf), self.cfg).astype(
            np.float32, copy=False
        )


def _first_gdn_layer(cfg: CloverConfig) -> int:
    return next((i for i, a in enumerate(cfg.is_attention) if not a), 0)
