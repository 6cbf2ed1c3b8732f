"""Metrics a paper reports for kernel generation: geometric means, fast_p, pass@k and fast_p@k.

Guarantees: pure functions of the numbers given; `pass_at_k` and `fast_p_at_k` use the unbiased
estimator 1 - C(n - c, k) / C(n, k) (n samples of which c succeed), averaged over tasks.
Does not read any database or measure anything.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def geometric_mean(values: list[float]) -> float | None:
    """Geometric mean of positive numbers; None for an empty list."""
    if not values:
        return None
    if any(v <= 0 for v in values):
        raise ValueError("geometric mean of non-positive values")
    return math.exp(sum(math.log(v) for v in values) / len(values))


def fast_p(speedups: Sequence[float | None], p: float) -> float:
    """Share of tasks whose best speedup (None: nothing correct) is above p; fast_0 = share solved."""
    if not speedups:
        return 0.0
    return sum(1 for s in speedups if s is not None and s > p) / len(speedups)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that k of n samples, c of which succeed, hold at least one success (unbiased)."""
    if not 0 <= c <= n or k < 1:
        raise ValueError(f"need 0 <= c <= n and k >= 1, got n={n}, c={c}, k={k}")
    if c == 0:
        return 0.0  # also when n < k: no success was seen, whatever k
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def fast_p_at_k(speedups: Sequence[float | None], p: float, k: int) -> float:
    """The chance that k of these samples hold a correct one faster than p (unbiased).

    `speedups` has one entry per sample: the speedup of a correct sample, None for any other;
    fast_0@k is pass@k.
    """
    return pass_at_k(len(speedups), sum(1 for s in speedups if s is not None and s > p), k)
