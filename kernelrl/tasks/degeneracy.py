"""Degeneracy filter: find tasks whose output barely depends on their inputs.

A task is *degenerate* when a candidate could pass the evaluator's correctness check without
computing anything: its output is all zeros, or nearly the same for every input set, or so small
that zeros fall within tolerance (for example a mean over 10^6 standard-normal values, which is
about 1e-3, scaled down further). Such a task rewards a kernel that returns a constant, so it
must not be used for scoring.

`outputs_degenerate(outputs)` judges outputs a reference already gave on several input sets (the
evaluator calls it on its own secret sets, so a degenerate task never pays). `judge_outputs`
judges a reference's outputs on `n_inputs` plain input sets and as many offset and scaled ones;
the reference runs elsewhere (`kernelrl.judge.degeneracy.check_degeneracy` runs it in a
sandboxed reference worker, never in the judging process). It reports:

- `output_rel_std`: per-element standard deviation across input sets, averaged, divided by the
  mean absolute output (0 for an output that never changes);
- `sensitivity`: mean relative L2 change of the output between consecutive input sets
  (||y_i - y_j|| / max(||y_i||, ||y_j||); 0 when both are zero);
- `perturbed_sensitivity`: the same over the offset/scaled input sets;
- `zero_passes`: an all-zero answer is within tolerance of every output on the task's own
  (unperturbed) inputs;
- `constant_passes`: the output of the first set, reused as a fixed answer, is within tolerance
  of every other set's output (for both families of input sets);
- `nonfinite`: some output holds NaN or inf on unperturbed inputs.

Guarantees: `degenerate` is True iff at least one reason is listed, and each reason is a
sentence naming the measurement that fired. A task flagged here really does admit a constant
(or zero) answer within the given tolerance on the inputs tried, or does not change its output
by `min_sensitivity` between different inputs. Tolerance defaults follow the evaluator's
protocol (float32 atol = rtol = 1e-4, float16/bfloat16 1e-2, integers and bools exact).

Does not guarantee the converse: a task that passes may still be degenerate on input
distributions not tried (a few seeds and one kind of offset/scale), and partial degeneracy
(most output elements constant, a few varying) is not flagged. Non-finite outputs on the
perturbed inputs are a note, not a reason, since some tasks are only defined on their own input
range (e.g. logs of positive inputs).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kernelrl.tasks.task import TaskError, leaves

if TYPE_CHECKING:
    from torch import Tensor

# Per dtype (atol, rtol), as in the evaluator's protocol.
DEFAULT_TOLERANCE = {"float32": (1e-4, 1e-4), "float64": (1e-4, 1e-4), "float16": (1e-2, 1e-2),
                     "bfloat16": (1e-2, 1e-2)}
# An output that moves by less than this fraction of its norm when the inputs are redrawn
# barely depends on them.
MIN_SENSITIVITY = 1e-3
# Elements compared at once (`_within`, `_finite`): float64 temporaries of 512 KiB stay in the CPU's
# caches; chunks of 4 Mi elements were mapped and faulted in for every temporary (5x the time).
_CHUNK = 1 << 16


@dataclass(frozen=True, kw_only=True)
class DegeneracyReport:
    """What the degeneracy filter measured for one task at one size."""

    task: str
    size: str
    degenerate: bool
    reasons: list[str]
    n_inputs: int
    output_rel_std: float  # across-input std / mean |output|, dimensionless
    sensitivity: float  # relative L2 change between input sets, dimensionless
    perturbed_sensitivity: float  # same, over offset/scaled inputs
    zero_passes: bool
    constant_passes: bool
    nonfinite: bool
    mean_abs_output: float
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        verdict = "DEGENERATE" if self.degenerate else "ok"
        line = (f"{self.task} [{self.size}]: {verdict}  rel_std={self.output_rel_std:.3g} "
                f"sensitivity={self.sensitivity:.3g} perturbed={self.perturbed_sensitivity:.3g}")
        if self.reasons:
            line += "  (" + "; ".join(self.reasons) + ")"
        return line


def outputs_degenerate(outputs: Sequence[object], tolerance: dict[str, tuple[float, float]] | None = None) -> list[str]:
    """Reasons a reference's outputs on several input sets do not depend on the inputs ([] if none).

    The evaluator calls this on the outputs it holds for its secret, scaled and shifted input
    sets: when a fixed answer (the first set's output) or an all-zero answer is within tolerance
    of every set's output, no candidate of the task can be told from a constant.
    """
    tol = dict(DEFAULT_TOLERANCE)
    tol.update(tolerance or {})
    found = [_tensors(o) for o in outputs]
    outs = [o for o in found if o]
    if len(outs) < 2 or len(outs) != len(found):
        return []
    if any(not _finite(t) for out in outs for t in out if t.is_floating_point()):
        return []
    reasons = []
    if all(_within(out, None, tol) for out in outs):
        reasons.append(f"an all-zero answer is within tolerance on all {len(outs)} input sets")
    elif all(_within(out, outs[0], tol) for out in outs[1:]):
        reasons.append(f"one fixed answer is within tolerance on all {len(outs)} input sets, scaled and shifted "
                       "ones included")
    return reasons


def judge_outputs(task: str, size: str, outputs: Sequence[object], *, n_inputs: int,
                  min_sensitivity: float = MIN_SENSITIVITY,
                  tolerance: dict[str, tuple[float, float]] | None = None) -> DegeneracyReport:
    """Judge a reference's outputs: the first `n_inputs` on the task's own (plain) input sets,
    the rest on offset and scaled ones (see the module docstring for what is measured)."""
    if n_inputs < 2:
        raise ValueError(f"n_inputs must be at least 2 to compare outputs, got {n_inputs}")
    if not 0.0 <= min_sensitivity < 1.0:
        raise ValueError(f"min_sensitivity must be in [0, 1), got {min_sensitivity}")
    tol = dict(DEFAULT_TOLERANCE)
    tol.update(tolerance or {})
    tensors = [_tensors(o) for o in outputs]
    if any(t is None or not t for t in tensors):
        raise TaskError(f"task {task}: the reference's output is not a tensor or a list of tensors")
    checked = [t for t in tensors if t is not None]
    plain, perturbed = checked[:n_inputs], checked[n_inputs:]

    reasons: list[str] = []
    notes: list[str] = []
    nonfinite = any(not _finite(t) for out in plain for t in out)
    if nonfinite:
        reasons.append("the output holds NaN or inf on the task's own inputs")
    if any(not _finite(t) for out in perturbed for t in out):
        notes.append("non-finite output on offset/scaled inputs; perturbed measurements skip those sets")
        perturbed = [out for out in perturbed if all(_finite(t) for t in out)]

    mean_abs = _mean_abs(plain)
    # Judged on the task's own inputs: a task whose own distribution lets zeros pass is degenerate
    # even if the evaluator's offsets would catch a zero answer.
    zero_passes = all(_within(out, None, tol) for out in plain)
    constant_passes = (all(_within(out, plain[0], tol) for out in plain[1:])
                       or (len(perturbed) >= 2 and all(_within(out, perturbed[0], tol) for out in perturbed[1:])))
    rel_std = _rel_std(plain)
    sensitivity = _sensitivity(plain)
    perturbed_sensitivity = _sensitivity(perturbed) if len(perturbed) >= 2 else math.nan

    if not nonfinite:
        if mean_abs == 0.0:
            reasons.append("the output is all zeros on every input set")
        elif zero_passes:
            reasons.append("an all-zero answer is within tolerance of every output on the task's own inputs "
                           f"(mean |output| {mean_abs:.3g})")
        if constant_passes:
            reasons.append("a fixed answer (the output of one input set) is within tolerance on the other sets")
        if sensitivity < min_sensitivity:
            reasons.append(f"the output changes by {sensitivity:.3g} (relative) between input sets, "
                           f"below {min_sensitivity:g}")
    return DegeneracyReport(task=task, size=size, degenerate=bool(reasons), reasons=reasons,
                            n_inputs=n_inputs, output_rel_std=rel_std, sensitivity=sensitivity,
                            perturbed_sensitivity=perturbed_sensitivity, zero_passes=zero_passes,
                            constant_passes=constant_passes, nonfinite=nonfinite, mean_abs_output=mean_abs,
                            notes=notes)


def _tensors(out: object) -> list[Tensor] | None:
    """The tensor leaves of an output as received from a worker (None: something else)."""
    import torch

    leaves_ = [x for x in leaves(out)]
    if not leaves_ or not all(isinstance(x, torch.Tensor) for x in leaves_):
        return None
    return [x.detach() for x in leaves_ if isinstance(x, torch.Tensor)]


def _as_float(t: Tensor) -> Tensor:
    import torch

    return t.to(torch.float64) if t.dtype != torch.float64 else t


def _finite(t: Tensor) -> bool:
    """No NaN or infinity in `t`, a chunk at a time (`torch.isfinite` of a whole output takes
    about twice its size in temporaries)."""
    import torch

    flat = t.reshape(-1)
    return all(bool(torch.isfinite(flat[i:i + _CHUNK]).all()) for i in range(0, flat.numel(), _CHUNK))


def _within(out: list[Tensor], expected: list[Tensor] | None, tol: dict[str, tuple[float, float]]) -> bool:
    """Would `out` pass an allclose-style check against `expected` (None: all zeros; shapes must
    match)? A chunk at a time: a few float64 chunks, not float64 copies of whole outputs (the judge
    runs this on its sets' outputs, 6 GiB each for a full-size KernelBench elementwise task)."""
    import torch

    if expected is not None and len(out) != len(expected):
        return False
    for i, a in enumerate(out):
        b = expected[i] if expected is not None else None
        if b is not None and a.shape != b.shape:
            return False
        if not (a.is_floating_point() or a.is_complex()):
            if not (torch.equal(a, b) if b is not None else not bool(a.any())):
                return False
            continue
        atol, rtol = tol.get(str(a.dtype).removeprefix("torch."), DEFAULT_TOLERANCE["float32"])
        flat_a, flat_b = a.reshape(-1), b.reshape(-1) if b is not None else None
        for start in range(0, flat_a.numel(), _CHUNK):
            part = _as_float(flat_a[start:start + _CHUNK])
            ref = _as_float(flat_b[start:start + _CHUNK]) if flat_b is not None else torch.zeros_like(part)
            if not torch.allclose(ref, part, atol=atol, rtol=rtol):
                return False
    return True


def _mean_abs(outs: list[list[Tensor]]) -> float:
    total, count = 0.0, 0
    for out in outs:
        for t in out:
            total += float(_as_float(t).abs().sum())
            count += t.numel()
    return total / max(count, 1)


def _rel_std(outs: list[list[Tensor]]) -> float:
    import torch

    mean_abs = _mean_abs(outs)
    if mean_abs == 0.0:
        return 0.0
    stds = []
    for j in range(len(outs[0])):
        stack = torch.stack([_as_float(out[j]).reshape(-1) for out in outs])
        stds.append(stack.std(dim=0).mean())
    return float(torch.stack(stds).mean()) / mean_abs


def _sensitivity(outs: list[list[Tensor]]) -> float:
    import torch

    changes = []
    for a, b in itertools.pairwise(outs):
        va = torch.cat([_as_float(t).reshape(-1) for t in a])
        vb = torch.cat([_as_float(t).reshape(-1) for t in b])
        denom = max(float(va.norm()), float(vb.norm()))
        changes.append(float((va - vb).norm()) / denom if denom > 0 else 0.0)
    return sum(changes) / len(changes)
