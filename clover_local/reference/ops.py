"""Elementwise functions and norms shared by the reference layers (docs/model.md section 1).

Every function computes in the dtype of its input, so the model runs wholly in float32 or float64.
"""

from __future__ import annotations

import numpy as np

L2NORM_EPS = 1e-6  # transformers' / FLA's l2norm: x * rsqrt(sum(x^2) + eps)


def silu(x: np.ndarray) -> np.ndarray:
    return x * sigmoid(x)


def sigmoid(x: np.ndarray) -> np.ndarray:
    # exp of a non-positive number only: no overflow warnings for large |x|
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0, x).astype(x.dtype, copy=False)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """Zero-centred RMSNorm of the Qwen3.5 trunk: the stored weight is applied as (1 + w)."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (1 + weight)


def gated_rms_norm(x: np.ndarray, gate: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """GDN output norm: weight * rmsnorm(x) * silu(gate); its weight is *not* zero-centred."""
    return weight * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)) * silu(gate)


def l2norm(x: np.ndarray) -> np.ndarray:
    """Unit vectors along the last axis, exactly as the causal GDN path normalises q and k."""
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + L2NORM_EPS)
