"""Full-attention layer: gated GQA attention with q/k norm and partial RoPE (docs/model.md 1, 2.2).

A commit pass is ordinary causal attention whose K/V the caller appends to the cache; a preview
pass lets the block rows see the cached prefix and every block row (`block_attention_mask`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..model.config import CloverConfig
from .ops import rms_norm, sigmoid, softmax

Weights = Callable[[str], np.ndarray]
Recorder = Callable[[str, np.ndarray], None]


def rope_tables(positions: np.ndarray, cfg: CloverConfig, dtype: type) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin [T, rotary_dim] of plain RoPE; for text-only positions mrope sections coincide."""
    dim = cfg.rotary_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    freqs = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb).astype(dtype), np.sin(emb).astype(dtype)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate-half RoPE over the first rotary_dim dims of x [T, heads, head_dim]; the rest pass."""
    dim = cos.shape[-1]
    rot, rest = x[..., :dim], x[..., dim:]
    half = dim // 2
    rotated = np.concatenate([-rot[..., half:], rot[..., :half]], axis=-1)
    c, s = cos[:, None, :], sin[:, None, :]
    return np.concatenate([rot * c + rotated * s, rest], axis=-1)


def block_attention_mask(n_past: int, n_rows: int, causal: bool) -> np.ndarray:
    """Which keys each row sees [n_rows, n_past + n_rows] (docs/model.md 2.2 [vendor]).

    Every row sees the whole cached prefix. A commit row sees the block rows up to itself; a
    preview row sees all block rows (bidirectional inside the block).
    """
    mask = np.ones((n_rows, n_past + n_rows), dtype=bool)
    if causal:
        mask[:, n_past:] = np.tril(np.ones((n_rows, n_rows), dtype=bool))
    return mask


def attention(
    x: np.ndarray,
    w: Weights,
    cfg: CloverConfig,
    past_k: np.ndarray,
    past_v: np.ndarray,
    causal: bool,
    rec: Recorder,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One attention layer on normed rows x [T, H] at positions n_past..n_past+T-1.

    Returns (output [T, H], this pass's keys, values) with K/V as cached: normed and rotated,
    [T, n_kv_heads, head_dim]. The caller appends them on a commit and drops them on a preview.
    """
    n_rows, hd, nh, nkv = x.shape[0], cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    n_past = past_k.shape[0]
    qg = (x @ w("self_attn.q_proj.weight").T).reshape(n_rows, nh, 2 * hd)
    q, gate = qg[..., :hd], qg[..., hd:].reshape(n_rows, nh * hd)
    q = rms_norm(q, w("self_attn.q_norm.weight"), cfg.rms_norm_eps)
    k = rms_norm(
        (x @ w("self_attn.k_proj.weight").T).reshape(n_rows, nkv, hd),
        w("self_attn.k_norm.weight"),
        cfg.rms_norm_eps,
    )
    v = (x @ w("self_attn.v_proj.weight").T).reshape(n_rows, nkv, hd)
    cos, sin = rope_tables(np.arange(n_past, n_past + n_rows), cfg, x.dtype)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    rec("Qcur", q)
    rec("Kcur", k)
    keys = np.concatenate([past_k, k]).repeat(nh // nkv, axis=1)  # [S, nh, hd], kv head h // groups
    vals = np.concatenate([past_v, v]).repeat(nh // nkv, axis=1)
    scores = np.einsum("thd,shd->hts", q, keys) / math.sqrt(hd)
    scores = np.where(block_attention_mask(n_past, n_rows, causal)[None], scores, -np.inf)
    out = np.einsum("hts,shd->thd", softmax(scores), vals).reshape(n_rows, nh * hd)
    rec("attn_pregate", out)
    out = out * sigmoid(gate)
    return out @ w("self_attn.o_proj.weight").T, k, v
