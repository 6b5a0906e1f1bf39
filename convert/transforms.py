"""Every checkpoint -> GGUF tensor transform (docs/model.md section 1).

The forward direction mirrors upstream llama.cpp's `Qwen3_5MoeTextModel` conversion (value heads
reordered from grouped-by-key-head to tiled order, `A_log -> -exp(A_log)`, zero-centred norms
`+1`, conv weight squeezed) and applies the same value-head reorder to Clover's own tensors (the
tests undo each one, `tests/gguf_weights.py`, to run the reference on a converted file).
Permutations work on any dtype (BF16 bit patterns pass through untouched); only the value
transforms (`a_log`, `norm_plus_one`) need floats, and their tensors are always F32.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from clover_local.model.checkpoint import conv_right_taps
from clover_local.model.config import CloverConfig

Fn = Callable[[np.ndarray, CloverConfig], np.ndarray]


@dataclass(frozen=True)
class Transform:
    """A named checkpoint -> GGUF transform.

    `row_local` transforms map any slice of rows to the same rows of the output, so a large tensor
    can be streamed in row chunks; the others need the whole tensor. `numeric` ones change values
    and take floats; the others only move entries and take any dtype (BF16 bits included).
    """

    name: str
    forward: Fn
    row_local: bool
    numeric: bool = False


# -- the value-head permutation ------------------------------------------------------------------
def reorder_v_heads(a: np.ndarray, axis: int, n_k: int, v_per_k: int, head_dim: int) -> np.ndarray:
    """Grouped-by-key-head -> tiled value-head order along `axis` (upstream `_reorder_v_heads`).

    GGUF head `p = j*n_k + k` is checkpoint head `k*v_per_k + j`, so ggml can broadcast key heads
    with a plain repeat.
    """
    axis %= a.ndim
    shape = a.shape
    split = a.reshape(shape[:axis] + (n_k, v_per_k, head_dim) + shape[axis + 1 :])
    return np.ascontiguousarray(np.swapaxes(split, axis, axis + 1)).reshape(shape)


def value_heads(cfg: CloverConfig) -> tuple[int, int]:
    return cfg.linear_num_key_heads, cfg.v_per_k


# -- per-tensor transforms ------------------------------------------------------------------
def identity(a: np.ndarray, cfg: CloverConfig) -> np.ndarray:
    return a


def norm_plus_one(a: np.ndarray, cfg: CloverConfig) -> np.ndarray:
    """Zero-centred RMSNorm weight -> the multiplier llama.cpp applies (1 + w)."""
    return a.astype(np.float32) + np.float32(1)


def a_log_to_ssm_a(a: np.ndarray, cfg: CloverConfig) -> np.ndarray:
    """`A_log` -> `ssm_a = -exp(A_log)`, value heads tiled."""
    return reorder_v_heads(-np.exp(a.astype(np.float32)), 0, *value_heads(cfg), 1)


def head_rows(a: np.ndarray, cfg: CloverConfig) -> np.ndarray:
    """Rows (or entries) indexed by value head: `in_proj_a/b`, `dt_bias`, the `bd_softmax_*`."""
    return reorder_v_heads(a, 0, *value_heads(cfg), 1)


def channel_rows(a: np.ndarray, cfg: CloverConfig) -> np.ndarray:
    """Rows indexed by value channel (head x head_dim): `in_proj_z`."""
    return reorder_v_heads(a, 0, *value_heads(cfg), cfg.linear_value_head_dim)


def channel_cols(a: np.ndarray, cfg: CloverConfig) -> np.ndarray:
    """Columns indexed by value channel: `out_proj` (row-local: each output row permuted alone)."""
    return reorder_v_heads(a, 1, *value_heads(cfg), cfg.linear_value_head_dim)


def qkv_apply(a: np.ndarray, cfg: CloverConfig, fn: Callable[..., np.ndarray]) -> np.ndarray:
    qk = 2 * cfg.key_dim
    v = fn(a[qk:], 0, *value_heads(cfg), cfg.linear_value_head_dim)
    return np.concatenate([a[:qk], v], axis=0)


def qkv_rows(a: np.ndarray, cfg: CloverConfig) -> np.ndarray:
    """q|k|v rows or channels (`in_proj_qkv`, conv taps): only the v part is reordered."""
    return qkv_apply(a, cfg, reorder_v_heads)


def conv_squeeze(a: np.ndarray, cfg: CloverConfig) -> np.ndarray:
    """`conv1d.weight` [conv_dim, 1, K] -> [conv_dim, K], v channels tiled."""
    return qkv_rows(a.reshape(a.shape[0], a.shape[-1]), cfg)


def conv_right(a: np.ndarray, cfg: CloverConfig) -> np.ndarray:
    """`conv_right_weight` [conv_dim, K-1] (or [conv_dim, 1, K-1]) -> [conv_dim, K-1], v tiled."""
    return qkv_rows(conv_right_taps(a, cfg.linear_conv_kernel_dim), cfg)


TRANSFORMS: dict[str, Transform] = {
    t.name: t
    for t in (
        Transform("identity", identity, row_local=True),
        Transform("norm_plus_one", norm_plus_one, row_local=True, numeric=True),
        Transform("a_log", a_log_to_ssm_a, row_local=False, numeric=True),
        Transform("head_rows", head_rows, row_local=False),
        Transform("channel_rows", channel_rows, row_local=False),
        Transform("channel_cols", channel_cols, row_local=True),
        Transform("qkv_rows", qkv_rows, row_local=False),
        Transform("conv_squeeze", conv_squeeze, row_local=False),
        Transform("conv_right", conv_right, row_local=False),
    )
}


# -- routed experts: one fused [E, 2I, H] checkpoint tensor -> GGUF gate and up stacks ----------
def gate_up_split(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fused `gate_up_proj` rows (one expert [2I, H] or all [E, 2I, H]) -> (gate, up) views."""
    inter = a.shape[-2] // 2
    return a[..., :inter, :], a[..., inter:, :]
