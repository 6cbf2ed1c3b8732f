"""The degeneracy filter run through the evaluator: a task's reference on many input sets.

`check_degeneracy(task, evaluator=...)` runs the task's reference (its own `Model`,
`get_init_inputs`, `get_inputs`) in a sandboxed reference worker of an evaluator, never in this
process, on `n_inputs` input sets from different seeds and on as many sets again whose
floating-point inputs got a random offset and scale; what the outputs mean is decided by
`kernelrl.tasks.degeneracy.judge_outputs` (pure). `check_tasks` does it for many tasks with one
evaluator.

Guarantees: input sets are reproducible from `seed`; a task that cannot be loaded or whose
reference fails raises (or, from `check_tasks`, yields) its `TaskError`.

Does not decide anything about candidates: the evaluator flags every candidate of a task whose
reference outputs are degenerate on its own secret sets (`kernelrl.judge.group`).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator

from kernelrl.judge.evaluator import EvalConfig, Evaluator
from kernelrl.judge.timing.inputs import perturbed_plan, plain_plan
from kernelrl.tasks.degeneracy import MIN_SENSITIVITY, DegeneracyReport, judge_outputs
from kernelrl.tasks.task import Size, Task, TaskError

__all__ = ["check_degeneracy", "check_tasks"]


def check_degeneracy(task: Task, *, size: str = "small", n_inputs: int = 4, seed: int = 0,
                     min_sensitivity: float = MIN_SENSITIVITY,
                     tolerance: dict[str, tuple[float, float]] | None = None,
                     evaluator: Evaluator | None = None) -> DegeneracyReport:
    """Run the task's reference on several input sets and judge whether its output is degenerate.

    The reference runs in a reference worker of `evaluator` (one is made for the call when None).
    Raises TaskError when the task cannot be loaded or its reference fails to run.
    """
    if n_inputs < 2:
        raise ValueError(f"n_inputs must be at least 2 to compare outputs, got {n_inputs}")
    rng = random.Random(seed)
    plans = [plain_plan(rng) for _ in range(n_inputs)]
    # wider than the evaluator's perturbation: a filter should look where a candidate would not
    plans += [perturbed_plan(rng, scale_range=(0.25, 4.0), offset_range=2.0) for _ in range(n_inputs)]
    if evaluator is None:
        with Evaluator(EvalConfig(size=Size(size), roofline=False, concurrency=1)) as own:
            _, outputs = own.reference_outputs(task, plans)
    else:
        _, outputs = evaluator.reference_outputs(task, plans)
    return judge_outputs(task.name, size, outputs, n_inputs=n_inputs, min_sensitivity=min_sensitivity,
                         tolerance=tolerance)


def check_tasks(tasks: Iterable[Task], *, size: str = "small", n_inputs: int = 4, seed: int = 0,
                min_sensitivity: float = MIN_SENSITIVITY,
                tolerance: dict[str, tuple[float, float]] | None = None) -> Iterator[DegeneracyReport | TaskError]:
    """`check_degeneracy` over many tasks (one evaluator for all); a task that cannot run yields its
    TaskError instead."""
    with Evaluator(EvalConfig(size=Size(size), roofline=False, concurrency=1)) as evaluator:
        for task in tasks:
            try:
                yield check_degeneracy(task, size=size, n_inputs=n_inputs, seed=seed, min_sensitivity=min_sensitivity,
                                       tolerance=tolerance, evaluator=evaluator)
            except TaskError as e:
                yield e
