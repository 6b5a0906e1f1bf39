"""The Clover trunk in numpy: causal commit passes and block preview passes over a `State`.

`commit` is exactly transformers' `qwen3_5_moe` text model run with a cache; `preview` is the
block-diffusion denoising pass of docs/model.md 2.2 that reads the committed state and writes nothing.
Layers live in `attention.py`, `gdn.py` and `moe.py`; this module wires them and owns the state.

Passing `record={}` collects intermediates under llama.cpp's graph names, `name-layer`:
`attn_norm`, `attn_output` / `linear_attn_out`, `attn_residual`, `attn_post_norm`, `ffn_moe_out`,
`ffn_shexp_gated`, `ffn_out`, `l_out`, inside the mixers `Qcur`, `Kcur`, `attn_pregate`,
`linear_attn_qkv_mixed`, `conv_output_silu`, `final_output`, routing `ffn_moe_topk`,
`ffn_moe_weights`, `ffn_moe_coreset`; and once `inp_embd`, `result_norm`, `result_output`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from ..backend import Routing
from ..model.checkpoint import Checkpoint
from ..model.config import CloverConfig
from .attention import attention
from .gdn import gdn
from .moe import moe
from .ops import rms_norm


class WeightSource(Protocol):
    """Anything that serves canonical HF-order tensors by name: a `Checkpoint` or a GGUF reader."""

    def get(self, name: str) -> np.ndarray: ...


@dataclass
class State:
    """Everything a commit leaves behind: K/V per attention layer, conv + recurrent state per GDN layer.

    Arrays are never written in place (a commit replaces them), so `copy()` is a cheap shallow copy
    that stays valid whatever happens to the original.
    """

    keys: dict[int, np.ndarray] = field(default_factory=dict)  # [n_past, n_kv_heads, head_dim]
    values: dict[int, np.ndarray] = field(default_factory=dict)
    conv: dict[int, np.ndarray] = field(default_factory=dict)  # last kernel-1 pre-conv rows [K-1, conv_dim]
    recurrent: dict[int, np.ndarray] = field(default_factory=dict)  # [n_v_heads, d_k, d_v]
    n_past: int = 0

    def copy(self) -> State:
        return State(dict(self.keys), dict(self.values), dict(self.conv), dict(self.recurrent), self.n_past)


Record = dict[str, np.ndarray]


def _recorder(record: Record | None, layer: int) -> Callable[[str, np.ndarray], None]:
    """Store intermediates as `name-layer`, llama.cpp's naming of graph tensors (`cb(cur, name, il)`)."""
    if record is None:
        return lambda name, value: None
    suffix = "" if layer < 0 else f"-{layer}"
    return lambda name, value: record.__setitem__(name + suffix, np.array(value))


class ReferenceModel:
    """The numpy Clover model: the executable specification and oracle of every backend."""

    def __init__(
        self, source: WeightSource, cfg: CloverConfig, dtype: type = np.float64, cache_weights: bool = True
    ):
        self.source, self.cfg, self.dtype = source, cfg, np.dtype(dtype)
        self._cache: dict[str, np.ndarray] | None = {} if cache_weights else None

    @classmethod
    def from_checkpoint(
        cls, path: str | Path, dtype: type = np.float64, cache_weights: bool = True, **overrides: object
    ) -> ReferenceModel:
        """Load a checkpoint directory; `overrides` replace `CloverConfig` fields (e.g. coreset_top_p).

        `cache_weights=False` reads every tensor from the mmap'd shards when a layer needs it, for
        checkpoints too large to hold dequantized.
        """
        ckpt = Checkpoint(path)
        cfg = ckpt.model.with_overrides(**overrides) if overrides else ckpt.model
        return cls(ckpt, cfg, dtype, cache_weights)

    def weight(self, name: str) -> np.ndarray:
        """A tensor in the model's dtype, read once when caching is on."""
        if self._cache is not None and name in self._cache:
            return self._cache[name]
        w = np.asarray(self.source.get(name)).astype(self.dtype)
        if self._cache is not None:
            self._cache[name] = w
        return w

    def new_state(self) -> State:
        """The empty state: no K/V, zero conv and recurrent states."""
        cfg, st = self.cfg, State()
        for i, is_attn in enumerate(cfg.is_attention):
            if is_attn:
                st.keys[i] = st.values[i] = np.zeros((0, cfg.num_key_value_heads, cfg.head_dim), self.dtype)
            else:
                st.conv[i] = np.zeros((cfg.linear_conv_kernel_dim - 1, cfg.conv_dim), self.dtype)
                shape = (cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim)
                st.recurrent[i] = np.zeros(shape, self.dtype)
        return st

    def commit(self, tokens: Sequence[int], state: State, record: Record | None = None) -> np.ndarray:
        """Causal pass over tokens at positions n_past.. : returns logits [T, V] and advances `state`.

        Routing is unrestricted (`moe.coreset_applies`). Chunking is free: committing a sequence
        in pieces gives the same logits as committing it at once.
        """
        logits, new = self._forward(tokens, state, None, record=record)
        state.keys, state.values, state.conv, state.recurrent = new.keys, new.values, new.conv, new.recurrent
        state.n_past += len(tokens)
        return logits

    @property
    def default_routing(self) -> Routing:
        """The config's preview routing (`moe_block_coreset_enabled`, `moe_block_coreset_top_p`)."""
        return Routing(self.cfg.coreset_enabled, self.cfg.coreset_top_p)

    def preview(
        self, block: Sequence[int], state: State, record: Record | None = None, routing: Routing | None = None
    ) -> np.ndarray:
        """Denoising pass over a block (docs/model.md 2.2): logits [B, V]; `state` is left untouched.

        Row i holds the hidden state of position n_past + i; which position it predicts is the
        decoder's business (`loops.aligned_candidates`). `routing` None: `default_routing`.
        """
        logits, _ = self._forward(block, state, routing or self.default_routing, record=record)
        return logits

    def _forward(
        self, tokens: Sequence[int], state: State, routing: Routing | None, record: Record | None
    ) -> tuple[np.ndarray, State]:
        """A causal pass (`routing` None) or a preview (its routing)."""
        preview = routing is not None
        cfg, ids = self.cfg, np.asarray(tokens, dtype=np.int64)
        if ids.ndim != 1 or len(ids) == 0:
            raise ValueError("a pass needs a non-empty 1-D token sequence")
        new = state.copy()
        h = self.weight("embed_tokens.weight")[ids]
        _recorder(record, -1)("inp_embd", h)
        for i, is_attn in enumerate(cfg.is_attention):
            rec = _recorder(record, i)

            def w(name: str, _i: int = i) -> np.ndarray:
                return self.weight(f"layers.{_i}.{name}")

            x = rms_norm(h, w("input_layernorm.weight"), cfg.rms_norm_eps)
            rec("attn_norm", x)
            if is_attn:
                out, k, v = attention(x, w, cfg, state.keys[i], state.values[i], causal=not preview, rec=rec)
                if not preview:
                    new.keys[i] = np.concatenate([state.keys[i], k])
                    new.values[i] = np.concatenate([state.values[i], v])
                rec("attn_output", out)
            else:
                out, new.conv[i], new.recurrent[i] = gdn(
                    x, w, cfg, state.conv[i], state.recurrent[i], preview=preview, rec=rec
                )
                rec("linear_attn_out", out)
            h = h + out
            rec("attn_residual", h)
            x = rms_norm(h, w("post_attention_layernorm.weight"), cfg.rms_norm_eps)
            rec("attn_post_norm", x)
            f = moe(x, w, cfg, routing, rec=rec)
            rec("ffn_out", f)
            h = h + f
            rec("l_out", h)
        h = rms_norm(h, self.weight("norm.weight"), cfg.rms_norm_eps)
        _recorder(record, -1)("result_norm", h)
        head = self.weight("embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight")
        logits = h @ head.T
        _recorder(record, -1)("result_output", logits)
        return logits, new
