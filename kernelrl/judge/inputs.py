"""Input plans: which input sets the judge asks for, drawn from its secret random generator.

The judge never runs task code: it draws a secret seed per input set (and, for perturbed sets, a
scale and an offset) and a reference worker makes the set with the task's own `get_inputs()`
under that seed (`kernelrl.judge.worker`), applying the perturbation there.

Guarantees:
- seeds come from the judge's generator, itself seeded from `secrets`, and are drawn after the
  candidate is loaded, so no program can know its inputs in advance; no seed is ever sent to a
  candidate's worker;
- perturbed sets scale and shift each floating-point input (scale in [0.5, 2], offset of up to
  one mean-absolute-value), so an output that happens to be near-constant for standard-normal
  inputs (a mean of a wide tensor, say) stops being constant; integer and boolean inputs are
  never perturbed (they are indices, lengths or masks).

Does not guarantee the perturbed inputs stay inside a task's valid domain (a log of a shifted
input can be NaN): the evaluator replaces a perturbed set that makes the reference non-finite
by a plain one.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class InputPlan:
    seed: int
    perturbed: bool
    scale: float = 1.0
    offset_frac: float = 0.0

    @property
    def perturb(self) -> list[float] | None:
        """The worker's perturbation field: [scale, offset_frac], or None for a plain set."""
        return [self.scale, self.offset_frac] if self.perturbed else None

    @property
    def label(self) -> str:
        if not self.perturbed:
            return "plain"
        return f"scaled x{self.scale:.2f} and shifted {self.offset_frac:+.2f} mean-abs"


def plain_plan(rng: random.Random) -> InputPlan:
    return InputPlan(seed=rng.getrandbits(63), perturbed=False)


def perturbed_plan(rng: random.Random, *, scale_range: tuple[float, float] = (0.5, 2.0),
                   offset_range: float = 1.0) -> InputPlan:
    scale = math.exp(rng.uniform(math.log(scale_range[0]), math.log(scale_range[1])))
    return InputPlan(seed=rng.getrandbits(63), perturbed=True, scale=scale,
                     offset_frac=rng.uniform(-offset_range, offset_range))


def correctness_plans(n: int, rng: random.Random) -> list[InputPlan]:
    """The first set plain, the others perturbed."""
    return [plain_plan(rng)] + [perturbed_plan(rng) for _ in range(n - 1)]


def timing_scale(rng: random.Random) -> float:
    """Per-call factor applied to floating inputs of a timed call (keeps signs and zeros)."""
    return math.exp(rng.uniform(math.log(0.75), math.log(1.25)))
