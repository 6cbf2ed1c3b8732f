"""Input sets for correctness and timing, made in the judge from secret seeds.

Guarantees:
- every set comes from the task's own `get_inputs()` under a seed drawn from `secrets` in the
  judge, after the candidate is loaded, so no program can know its inputs in advance;
- perturbed sets scale and shift each floating-point input by a random factor and offset
  (scale in [0.5, 2], offset of up to one mean-absolute-value), so an output that happens to be
  near-constant for standard-normal inputs (a mean of a wide tensor, say) stops being constant;
- integer and boolean inputs are never perturbed (they are indices, lengths or masks);
- the judge's own global RNG state is left as it was.

Does not guarantee the perturbed inputs stay inside a task's valid domain (a log of a shifted
input can be NaN): the evaluator checks the reference's outputs and falls back to an unperturbed
set when the perturbed one makes the reference non-finite.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

import torch

from kernelrl.tasks.task import TaskModule


@dataclass(frozen=True, kw_only=True)
class InputSet:
    values: list[Any]
    perturbed: bool
    scale: float = 1.0
    offset_frac: float = 0.0


def make_input_set(tm: TaskModule, seed: int, *, perturb: bool, rng: random.Random) -> InputSet:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        values = tm.get_inputs()
    if not perturb:
        return InputSet(values=values, perturbed=False)
    scale = math.exp(rng.uniform(math.log(0.5), math.log(2.0)))
    offset_frac = rng.uniform(-1.0, 1.0)
    out = []
    for x in values:
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel():
            magnitude = float(x.abs().mean()) or 1.0
            out.append(x * scale + offset_frac * magnitude)
        else:
            out.append(x)
    return InputSet(values=out, perturbed=True, scale=scale, offset_frac=offset_frac)


def timing_scale(rng: random.Random) -> float:
    """Per-call factor applied to floating inputs of a timed call (keeps signs and zeros)."""
    return math.exp(rng.uniform(math.log(0.75), math.log(1.25)))


def all_finite(x: Any) -> bool:
    if isinstance(x, torch.Tensor):
        return not x.is_floating_point() or bool(torch.isfinite(x).all())
    if isinstance(x, (list, tuple)):
        return all(all_finite(v) for v in x)
    return True
