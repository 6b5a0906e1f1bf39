"""A converted GGUF read back under checkpoint names, every conversion transform undone.

The numpy reference runs on any weight source with `get(canonical_name)`; serving a GGUF this way
lets tests check a whole converted file end to end (reference logits from the GGUF equal those
from the safetensors) and shows what quantization costs. The name table and the inverse
transforms are the converter's own (`plan.tensor_specs`, `transforms`).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from gguf import GGUFReader, ReaderTensor
from gguf.quants import dequantize

from clover_local.model import gguf_names as gn
from clover_local.model.config import CloverConfig

from .plan import ExpertSpec, TensorSpec, tensor_specs
from .transforms import gate_up_join

_SHARD = re.compile(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$")


def shard_files(path: Path) -> list[Path]:
    """All shards of a split GGUF given any one of them (or just `path` when not split)."""
    m = _SHARD.match(path.name)
    if not m:
        return [path]
    n = int(m.group(3))
    return [path.with_name(f"{m.group(1)}-{i:05d}-of-{n:05d}.gguf") for i in range(1, n + 1)]


class GGUFWeights:
    """Float32 checkpoint tensors (HF names, HF value-head order, fused experts) from a GGUF."""

    def __init__(self, path: str | Path, cfg: CloverConfig):
        self.cfg = cfg
        self.readers = [GGUFReader(p) for p in shard_files(Path(path))]
        self.tensors: dict[str, ReaderTensor] = {t.name: t for r in self.readers for t in r.tensors}
        diffusion = gn.blk(_first_gdn_layer(cfg), gn.SSM_CONV1D_RIGHT) in self.tensors
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
        return spec.transform.inverse(self.dequantized(spec.gguf), self.cfg).astype(np.float32, copy=False)


def _first_gdn_layer(cfg: CloverConfig) -> int:
    return next((i for i, a in enumerate(cfg.is_attention) if not a), 0)
