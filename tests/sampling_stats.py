"""Exact sampling distributions and the bounds sampled output is judged by (chi-square, total variation)."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from clover_local import policy
from clover_local.backend import distribution
from clover_local.policy import DecodingSettings


def exact_ar(step, prompt: list[int], s: DecodingSettings, vocab: int, n: int) -> dict:
    """The `ar` sampling distribution of the first n tokens under `s.sampler` (outcomes of mass >
    1e-6): `step(prefix)` gives the logits of the next token."""
    out: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(n):
        nxt: dict[tuple[int, ...], float] = {}
        for seq, mass in out.items():
            adj = policy.adjustment(s, vocab, prompt, list(seq))
            dist = distribution(step(prompt + list(seq)), adj, s.sampler)
            for t in np.flatnonzero(dist > 1e-6 / mass):
                nxt[(*seq, int(t))] = mass * float(dist[t])
        out = nxt
    return out


def chi_square_ok(observed: Counter, expected: dict, n_runs: int) -> tuple[float, float]:
    """Pearson's chi-square over outcomes with expected count >= 5 (the rest lumped together), and
    its 0.1% critical value (Wilson-Hilferty approximation of the chi-square quantile)."""
    big = [k for k, p in expected.items() if p * n_runs >= 5]
    obs = [observed[k] for k in big] + [n_runs - sum(observed[k] for k in big)]
    exp = [expected[k] * n_runs for k in big] + [n_runs * (1 - sum(expected[k] for k in big))]
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp, strict=True) if e > 0)
    dof = len(obs) - 1
    return stat, dof * (1 - 2 / (9 * dof) + 3.09 * math.sqrt(2 / (9 * dof))) ** 3


def total_variation(counts: Counter, expected: dict, n_runs: int) -> float:
    keys = set(counts) | set(expected)
    return 0.5 * sum(abs(counts[k] / n_runs - expected.get(k, 0.0)) for k in keys)


def total_variation_bound(expected: dict, n_runs: int) -> float:
    """The total variation that direct sampling of n_runs from `expected` stays under 99.9% of the
    time: the quantile over 2000 seeded multinomial draws."""
    p = np.array(list(expected.values()))
    draws = np.random.default_rng(0).multinomial(n_runs, p / p.sum(), size=2000) / n_runs
    return float(np.quantile(0.5 * np.abs(draws - p / p.sum()).sum(axis=1), 0.999))


def assert_samples_follow(counts: Counter, expected: dict, n_runs: int) -> None:
    """Sampled outcomes `counts` (n_runs of them) are draws from `expected`: chi-square at the 0.1%
    level, and a total variation that direct sampling would exceed only 0.1% of the time."""
    stat, critical = chi_square_ok(counts, expected, n_runs)
    assert stat < critical, f"chi-square {stat:.1f} >= {critical:.1f}"
    tv, bound = total_variation(counts, expected, n_runs), total_variation_bound(expected, n_runs)
    assert tv <= bound, f"total variation {tv:.3f} > {bound:.3f}"
