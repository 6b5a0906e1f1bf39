"""Sparse MoE feed-forward: softmax router, top-k renormalised, shared expert (docs/model.md 1),
and the block expert coreset of previews (2.4)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..backend import Routing
from ..model.config import CloverConfig
from .ops import sigmoid, silu, softmax

Weights = Callable[[str], np.ndarray]
Recorder = Callable[[str, np.ndarray], None]


def top_k_routing(
    probs: np.ndarray, k: int, allowed: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Each row's top-k experts (among `allowed` ones, all of them if fewer than k) and weights.

    Ties go to the lower expert index. Weights are the router probabilities renormalised over the
    chosen experts. Returns (ids [T, k'], weights [T, k']).
    """
    if allowed is not None:
        k = min(k, int(allowed.sum()))
        probs = np.where(allowed[None, :], probs, -np.inf)
    ids = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
    top = np.take_along_axis(probs, ids, axis=-1)
    return ids, top / top.sum(axis=-1, keepdims=True)


def block_expert_coreset(probs: np.ndarray, k: int, top_p: float, size: int = 0) -> np.ndarray:
    """The experts a preview block may use (docs/model.md 2.4 [vendor wording; details ours]).

    probs [B, E] are the block rows' router softmax. Each row's top-k candidates add their
    probabilities to their experts' aggregate; experts ranked by aggregate (ties: lower index
    first) are kept while the mass before them is below top_p of the total, i.e. the smallest
    prefix reaching top_p. `size` > 0 keeps the first `size` of the ranking instead (a forced
    coreset size, for benchmarks). Returns a bool mask [E].
    """
    ids, _ = top_k_routing(probs, k)
    agg = np.zeros(probs.shape[1], dtype=probs.dtype)
    np.add.at(agg, ids, np.take_along_axis(probs, ids, axis=-1))
    order = np.argsort(-agg, kind="stable")
    kept = np.zeros(probs.shape[1], dtype=bool)
    if size > 0:
        kept[order[:size]] = True
        return kept
    mass = np.cumsum(agg[order])
    before = mass - agg[order]
    kept[order[(agg[order] > 0) & (before < top_p * mass[-1])]] = True
    return kept


def coreset_applies(routing: Routing | None) -> bool:
    """Whether a pass routes within the block coreset: previews when their routing says so (a commit
    has no routing); commits never [ours, 2.2]."""
    return routing is not None and routing.coreset


def moe(x: np.ndarray, w: Weights, cfg: CloverConfig, routing: Routing | None, rec: Recorder) -> np.ndarray:
    """The MoE block on normed rows x [T, H]: routed experts plus the sigmoid-gated shared expert.

    `routing`: a preview's (None for a causal pass)."""
    probs = softmax(x @ w("mlp.gate.weight").T)
    allowed = None
    if coreset_applies(routing):
        assert routing is not None
        allowed = block_expert_coreset(probs, cfg.num_experts_per_tok, routing.top_p, cfg.coreset_size)
        rec("ffn_moe_coreset", allowed)
    ids, weights = top_k_routing(probs, cfg.num_experts_per_tok, allowed)
    rec("ffn_moe_topk", ids)
    rec("ffn_moe_weights", weights)
    gate_up, down = w("mlp.experts.gate_up_proj"), w("mlp.experts.down_proj")
    inter = cfg.moe_intermediate_size
    routed = np.zeros_like(x)
    for e in np.unique(ids):
        rows, slot = np.nonzero(ids == e)
        h = x[rows] @ gate_up[e].T
        y = (silu(h[:, :inter]) * h[:, inter:]) @ down[e].T
        np.add.at(routed, rows, y * weights[rows, slot][:, None])
    rec("ffn_moe_out", routed)
    shared = silu(x @ w("mlp.shared_expert.gate_proj.weight").T) * (
        x @ w("mlp.shared_expert.up_proj.weight").T
    )
    shared = shared @ w("mlp.shared_expert.down_proj.weight").T
    shared = shared * sigmoid(x @ w("mlp.shared_expert_gate.weight").T)
    rec("ffn_shexp_gated", shared)
    return routed + shared
