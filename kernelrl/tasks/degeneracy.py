"""Degeneracy filter: find tasks whose output barely depends on their inputs.

A task is *degenerate* when a candidate could pass the evaluator's correctness check without
computing anything: its output is all zeros, or nearly the same for every input set, or so small
that zeros fall within tolerance (for example a mean over 10^6 standard-normal values, which is
about 1e-3, scaled down further). Such a task rewards a kernel that returns a constant, so it
must not be used for scoring.

`check_degeneracy` runs the task's reference (its own `Model`, `get_init_inputs`, `get_inputs`)
on `n_inputs` input sets from different seeds, and on as many sets again whose floating-point
inputs got a random offset and scale (the evaluator perturbs inputs the same way). It reports:

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

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kernelrl.tasks.task import Task, TaskError, leaves

# Per dtype (atol, rtol), as in the evaluator's protocol.
DEFAULT_TOLERANCE = {"float32": (1e-4, 1e-4), "float64": (1e-4, 1e-4), "float16": (1e-2, 1e-2),
                     "bfloat16": (1e-2, 1e-2)}
# An output that moves by less than this fraction of its norm when the inputs are redrawn
# barely depends on them.
MIN_SENSITIVITY = 1e-3


@dataclass(frozen=True, kw_only=True)
class DegeneracyReport:
    """What `check_degeneracy` measured for one task at one size."""

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


def check_degeneracy(task: Task, *, size: str = "small", n_inputs: int = 4, seed: int = 0,
                     min_sensitivity: float = MIN_SENSITIVITY,
                     tolerance: dict[str, tuple[float, float]] | None = None) -> DegeneracyReport:
    """Run the task's reference on several input sets and judge whether its output is degenerate.

    Raises TaskError when the task cannot be instantiated or its reference fails to run.
    """
    import torch

    if n_inputs < 2:
        raise ValueError(f"n_inputs must be at least 2 to compare outputs, got {n_inputs}")
    if not 0.0 <= min_sensitivity < 1.0:
        raise ValueError(f"min_sensitivity must be in [0, 1), got {min_sensitivity}")
    tol = dict(DEFAULT_TOLERANCE)
    tol.update(tolerance or {})

    tm = task.instantiate(size)
    torch.manual_seed(seed)
    try:
        model = tm.Model(*tm.get_init_inputs())
    except Exception as e:  # noqa: BLE001 - report any construction failure as a task error
        raise TaskError(f"task {task.name}: Model(*get_init_inputs()) failed: {type(e).__name__}: {e}") from e
    if isinstance(model, torch.nn.Module):
        model.eval()

    plain, perturbed = [], []
    perturb_rng = torch.Generator().manual_seed(seed + 7919)
    for i in range(n_inputs):
        torch.manual_seed(seed + 1 + i)
        inputs = tm.get_inputs()
        plain.append(_run(task, model, inputs))
        torch.manual_seed(seed + 1 + n_inputs + i)
        inputs = [_offset_scale(x, perturb_rng) for x in tm.get_inputs()]
        perturbed.append(_run(task, model, inputs))

    reasons: list[str] = []
    notes: list[str] = []
    nonfinite = any(not bool(torch.isfinite(t).all()) for out in plain for t in out)
    if nonfinite:
        reasons.append("the output holds NaN or inf on the task's own inputs")
    if any(not bool(torch.isfinite(t).all()) for out in perturbed for t in out):
        notes.append("non-finite output on offset/scaled inputs; perturbed measurements skip those sets")
        perturbed = [out for out in perturbed if all(bool(torch.isfinite(t).all()) for t in out)]

    mean_abs = _mean_abs(plain)
    # Judged on the task's own inputs: a task whose own distribution lets zeros pass is degenerate
    # even if the evaluator's offsets would catch a zero answer.
    zero_passes = all(_within(out, [torch.zeros_like(t) for t in out], tol) for out in plain)
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
    return DegeneracyReport(task=task.name, size=size, degenerate=bool(reasons), reasons=reasons,
                            n_inputs=n_inputs, output_rel_std=rel_std, sensitivity=sensitivity,
                            perturbed_sensitivity=perturbed_sensitivity, zero_passes=zero_passes,
                            constant_passes=constant_passes, nonfinite=nonfinite, mean_abs_output=mean_abs,
                            notes=notes)


def check_tasks(tasks: Iterable[Task], **kwargs: Any) -> Iterator[DegeneracyReport | TaskError]:
    """`check_degeneracy` over many tasks; a task that cannot run yields its TaskError instead."""
    for task in tasks:
        try:
            yield check_degeneracy(task, **kwargs)
        except TaskError as e:
            yield e


def _run(task: Task, model: Any, inputs: list[Any]) -> list[Any]:
    import torch

    try:
        with torch.no_grad():
            out = model(*inputs)
    except Exception as e:  # noqa: BLE001
        raise TaskError(f"task {task.name}: reference forward failed: {type(e).__name__}: {e}") from e
    tensors = [t if isinstance(t, torch.Tensor) else torch.as_tensor(t) for t in leaves(out)]
    if not tensors:
        raise TaskError(f"task {task.name}: reference forward returned no tensor")
    return [t.detach() for t in tensors]


def _offset_scale(x: Any, gen: Any) -> Any:
    """Floating tensors become x * s + o with s in [0.25, 4] (log-uniform) and o ~ N(0, 1)."""
    import torch

    if not (isinstance(x, torch.Tensor) and x.is_floating_point()):
        return x
    s = math.exp((torch.rand((), generator=gen).item() * 2 - 1) * math.log(4.0))
    o = torch.randn((), generator=gen).item()
    return x * s + o


def _as_float(t: Any) -> Any:
    import torch

    return t.to(torch.float64) if t.dtype != torch.float64 else t


def _within(out: list[Any], expected: list[Any], tol: dict[str, tuple[float, float]]) -> bool:
    """Would `out` pass an allclose-style check against `expected` (shapes must match)?"""
    import torch

    if len(out) != len(expected):
        return False
    for a, b in zip(out, expected, strict=True):
        if a.shape != b.shape:
            return False
        if a.is_floating_point() or a.is_complex():
            atol, rtol = tol.get(str(a.dtype).removeprefix("torch."), DEFAULT_TOLERANCE["float32"])
            if not torch.allclose(_as_float(b), _as_float(a), atol=atol, rtol=rtol):
                return False
        elif not torch.equal(a, b):
            return False
    return True


def _mean_abs(outs: list[list[Any]]) -> float:
    total, count = 0.0, 0
    for out in outs:
        for t in out:
            total += float(_as_float(t).abs().sum())
            count += t.numel()
    return total / max(count, 1)


def _rel_std(outs: list[list[Any]]) -> float:
    import torch

    mean_abs = _mean_abs(outs)
    if mean_abs == 0.0:
        return 0.0
    stds = []
    for j in range(len(outs[0])):
        stack = torch.stack([_as_float(out[j]).reshape(-1) for out in outs])
        stds.append(stack.std(dim=0).mean())
    return float(torch.stack(stds).mean()) / mean_abs


def _sensitivity(outs: list[list[Any]]) -> float:
    import torch

    changes = []
    for a, b in zip(outs, outs[1:]):
        va = torch.cat([_as_float(t).reshape(-1) for t in a])
        vb = torch.cat([_as_float(t).reshape(-1) for t in b])
        denom = max(float(va.norm()), float(vb.norm()))
        changes.append(float((va - vb).norm()) / denom if denom > 0 else 0.0)
    return sum(changes) / len(changes)
