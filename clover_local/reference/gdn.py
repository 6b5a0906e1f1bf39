"""Gated DeltaNet layer: the causal path (docs/model.md 1) and Clover's preview operator (2.3).

Both paths share the projections, the q/k/v split and the output path (gated RMSNorm, out_proj);
they differ in the conv (`causal_conv` / `preview_conv`) and the mixer (`gated_delta_rule` /
`block_softmax_history_mix`). Value heads are in the checkpoint's grouped order: value head h
reads key head h // (n_v / n_k).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..model.checkpoint import conv_right_taps
from ..model.config import CloverConfig
from .ops import gated_rms_norm, l2norm, sigmoid, silu, softmax, softplus

Weights = Callable[[str], np.ndarray]
Recorder = Callable[[str, np.ndarray], None]


def _left_taps(conv_state: np.ndarray, x: np.ndarray, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Depthwise causal conv (no activation) of x [T, C] after the state's kernel-1 rows.

    weight is [C, kernel]; tap kernel-1 multiplies the row itself. Returns (conv, state + x rows).
    """
    xs = np.concatenate([conv_state, x])
    return sum(weight[:, i] * xs[i : i + x.shape[0]] for i in range(weight.shape[1])), xs


def causal_conv(conv_state: np.ndarray, x: np.ndarray, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Causal conv + SiLU; returns (y [T, C], the new conv state: the last kernel-1 pre-conv rows)."""
    y, xs = _left_taps(conv_state, x, weight)
    return silu(y), xs[-(weight.shape[1] - 1) :]


def preview_conv(
    conv_state: np.ndarray, block: np.ndarray, weight: np.ndarray, right: np.ndarray
) -> np.ndarray:
    """Conv with right taps of a preview (docs/model.md 2.3 (a) [public]; zero past the block [ours]).

    y[t,c] = silu(sum_i w[c,i] X[t+i,c] + sum_{d=1..K-1} r[c,d-1] block[t+d,c]) with X the
    committed conv state (read only) followed by the block rows.
    """
    n_rows, kernel = block.shape[0], weight.shape[1]
    y, _ = _left_taps(conv_state, block, weight)
    ahead = np.concatenate([block, np.zeros((kernel - 1, block.shape[1]), dtype=block.dtype)])
    y = y + sum(right[:, d - 1] * ahead[d : d + n_rows] for d in range(1, kernel))
    return silu(y)


def split_qkv(y: np.ndarray, cfg: CloverConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Conv output [T, conv_dim] -> q, k [T, n_v, d_k] (key head repeated per value head), v [T, n_v, d_v]."""
    n_rows, kd = y.shape[0], cfg.key_dim
    heads = (n_rows, cfg.linear_num_key_heads, cfg.linear_key_head_dim)
    q = y[:, :kd].reshape(heads).repeat(cfg.v_per_k, axis=1)
    k = y[:, kd : 2 * kd].reshape(heads).repeat(cfg.v_per_k, axis=1)
    v = y[:, 2 * kd :].reshape(n_rows, cfg.linear_num_value_heads, cfg.linear_value_head_dim)
    return q, k, v


def gated_delta_rule(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray, state: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The causal delta rule, one row at a time (docs/model.md 1).

    q, k unit vectors [T, n_v, d_k] (q already scaled by 1/sqrt(d_k)), v [T, n_v, d_v], g, beta
    [T, n_v], state [n_v, d_k, d_v]. Returns (o [T, n_v, d_v], the new state); the input state is
    not modified.
    """
    out = np.empty_like(v)
    for t in range(q.shape[0]):
        state = state * np.exp(g[t])[:, None, None]
        delta = beta[t][:, None] * (v[t] - np.einsum("hkv,hk->hv", state, k[t]))
        state = state + k[t][:, :, None] * delta[:, None, :]
        out[t] = np.einsum("hkv,hk->hv", state, q[t])
    return out, state


def block_softmax_history_mix(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    state: np.ndarray,
    logit_scale: np.ndarray,
    history_bias: np.ndarray,
    history_c: np.ndarray,
) -> np.ndarray:
    """Preview mixer: block softmax with a history slot from the clean state (docs/model.md 2.3 (b) [ours]).

    q, k unit vectors [B, n_v, d_k] (unscaled), v [B, n_v, d_v], state the committed recurrent
    state [n_v, d_k, d_v] (read only). Per value head h and row t:
    u_t = S_h^T (q_t / sqrt(d_k)); s_tj = lambda_h q_t.k_j over all block rows j; s_tH = beta_h;
    p_t = softmax([s_t0..s_t(B-1), s_tH]); o_t = sum_j p_tj v_j + p_tH c_h u_t.
    The causal gates (beta, decay) take no part.
    """
    u = np.einsum("hkv,thk->thv", state, q / math.sqrt(q.shape[-1]))
    scores = logit_scale[None, :, None] * np.einsum("thk,jhk->thj", q, k)  # [B, n_v, B]
    hist = np.broadcast_to(history_bias[None, :, None], (*scores.shape[:2], 1)).astype(scores.dtype)
    p = softmax(np.concatenate([scores, hist], axis=-1))
    return np.einsum("thj,jhv->thv", p[..., :-1], v) + p[..., -1:] * history_c[None, :, None] * u


def gdn(
    x: np.ndarray,
    w: Weights,
    cfg: CloverConfig,
    conv_state: np.ndarray,
    rec_state: np.ndarray,
    preview: bool,
    rec: Recorder,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One GDN layer on normed rows x [T, H].

    Returns (output [T, H], new conv state, new recurrent state); a preview returns the given
    states unchanged (same objects).
    """
    n_rows, nv, dv = x.shape[0], cfg.linear_num_value_heads, cfg.linear_value_head_dim
    qkv = x @ w("linear_attn.in_proj_qkv.weight").T
    z = (x @ w("linear_attn.in_proj_z.weight").T).reshape(n_rows, nv, dv)
    conv_w = w("linear_attn.conv1d.weight").reshape(cfg.conv_dim, cfg.linear_conv_kernel_dim)
    rec("linear_attn_qkv_mixed", qkv)
    if preview:
        right = conv_right_taps(w("linear_attn.conv_right_weight"), cfg.linear_conv_kernel_dim)
        y = preview_conv(conv_state, qkv, conv_w, right)
    else:
        y, conv_state = causal_conv(conv_state, qkv, conv_w)
    rec("conv_output_silu", y)
    q, k, v = split_qkv(y, cfg)
    q, k = l2norm(q), l2norm(k)
    if preview:
        o = block_softmax_history_mix(
            q,
            k,
            v,
            rec_state,
            w("linear_attn.bd_softmax_logit_scale"),
            w("linear_attn.bd_softmax_history_bias"),
            w("linear_attn.bd_softmax_history_c"),
        )
    else:
        beta = sigmoid(x @ w("linear_attn.in_proj_b.weight").T)
        a = x @ w("linear_attn.in_proj_a.weight").T
        g = -np.exp(w("linear_attn.A_log")) * softplus(a + w("linear_attn.dt_bias"))
        o, rec_state = gated_delta_rule(q / math.sqrt(q.shape[-1]), k, v, g, beta, rec_state)
    o = gated_rms_norm(o, z, w("linear_attn.norm.weight"), cfg.rms_norm_eps).reshape(n_rows, nv * dv)
    rec("final_output", o)
    return o @ w("linear_attn.out_proj.weight").T, conv_state, rec_state
