"""Metrics a paper reports for kernel generation: geometric means, fast_p, pass@k and fast_p@k.

One definition of faster: `counts_as_faster(speedup, p, within_noise=...)` decides, for every
"faster" figure kernelrl shows (fast_p and fast_p@k, "faster than eager" counts and chart titles,
in the terminal report, the HTML report, the run page and bench). A correct result counts as
faster than p times the reference when its speedup is above p and, for p >= 1, the speedup can
be told from 1.0x: a result within noise (`kernelrl.reward.within_noise`: its 95 % interval
holds 1.0, or it lies in the task's A/A band) is never counted as faster, whatever its median.
fast_0 (p = 0) counts every correct timed result.

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


def counts_as_faster(speedup: float | None, p: float = 1.0, *, within_noise: bool) -> bool:
    """Does a result (speedup None: not correct or not timed) count as faster than p times the
    reference? Above p, and for p >= 1 not within noise (see the module docstring)."""
    if speedup is None or speedup <= p:
        return False
    return p < 1.0 or not within_noise


# One noise mark and one colour for every surface (terminal report, HTML report, run page).
NOISE_MARK = "~"
NOISE_LEGEND = ("~ within the measurement's noise: the 95 % interval (or the task's A/A band) holds 1.0x, or, "
                "against torch.compile, either of its two measurements does; red: slower than the reference "
                "beyond noise")


def compile_within_noise(*, eager_within_noise: bool, compile_within_noise: bool) -> bool:
    """The speedup against torch.compile is the one against eager times the task's eager / compile
    ratio: it is within noise when either of those two measurements is."""
    return eager_within_noise or compile_within_noise


def slower_beyond_noise(speedup: float | None, *, within_noise: bool) -> bool:
    """Shown in red: slower than the reference, and not within noise."""
    return speedup is not None and speedup < 1.0 and not within_noise


def noise_marked(text: str, within_noise: bool) -> str:
    """A figure's text with the noise mark when it is within noise."""
    return text + NOISE_MARK if within_noise else text


def _check_lengths(speedups: Sequence[float | None], within_noise: Sequence[bool]) -> None:
    if len(speedups) != len(within_noise):
        raise ValueError(f"{len(speedups)} speedups but {len(within_noise)} within-noise flags")


def fast_p(speedups: Sequence[float | None], p: float, *, within_noise: Sequence[bool]) -> float:
    """Share of tasks whose best result (speedup None: nothing correct; `within_noise` per task)
    counts as faster than p (`counts_as_faster`); fast_0 = share solved."""
    _check_lengths(speedups, within_noise)
    if not speedups:
        return 0.0
    return sum(counts_as_faster(s, p, within_noise=n) for s, n in zip(speedups, within_noise)) / len(speedups)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that k of n samples, c of which succeed, hold at least one success (unbiased)."""
    if not 0 <= c <= n or k < 1:
        raise ValueError(f"need 0 <= c <= n and k >= 1, got n={n}, c={c}, k={k}")
    if c == 0:
        return 0.0  # also when n < k: no success was seen, whatever k
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def fast_p_at_k(speedups: Sequence[float | None], p: float, k: int, *, within_noise: Sequence[bool]) -> float:
    """The chance that k of these samples hold a correct one faster than p (unbiased).

    `speedups` has one entry per sample: the speedup of a correct sample, None for any other;
    `within_noise` one flag per sample; a sample counts as `counts_as_faster` says. fast_0@k is
    pass@k of the timed samples.
    """
    _check_lengths(speedups, within_noise)
    return pass_at_k(len(speedups), sum(counts_as_faster(s, p, within_noise=n)
                                        for s, n in zip(speedups, within_noise)), k)
