"""Shared helpers for the learner's tests (not a test module): a scripted judge, answers, and a
run's parts handed in whole (`run_parts`).

`ScriptedBackend` stands in for the evaluator where a test is about the plumbing around it (the
real evaluator is used by the tests that show the recipe end to end): it records every
`evaluate_batch` call and judges a program by markers in its text.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kernelrl.candidate import Candidate
from kernelrl.result import EvalResult, Finding, Severity, Status
from kernelrl.tasks.task import Task

if TYPE_CHECKING:
    from kernelrl.judge.contract import ProfilingJudge
    from kernelrl.run_parts import Reporter, RunParts
    from kernelrl.store import Database

CORRECT = "```python\nclass ModelNew:\n    pass  # fast\n```\n"


def answer(marker: str, *, prose: str = "Analysis first.") -> str:
    """An answer whose program carries `marker` (see `judge_by_marker`)."""
    # The marker is a string constant, not a comment: programs that differ only in comments are
    # the same program (kernelrl.train.copies), and these must be different programs.
    return f"{prose}\n\n```python\nclass ModelNew:\n    MARKER = {marker!r}\n```\n"


def judge_by_marker(task: Task, source: str) -> EvalResult:
    """`fast2.0` -> correct at 2.0x, `wrong` -> incorrect, `hack` -> flagged, `taskerror` ->
    task_error, `warn` -> correct 1.0x with a warning, anything else -> compile_error; the marker
    is `MARKER = '...'` (what `answer` writes) or a `# ...` comment."""
    if "MARKER = '" in source:
        marker = "# " + source.split("MARKER = '", 1)[1].split("'", 1)[0]
    else:
        marker = source
    if "# fast" in marker:
        speed = float(marker.split("# fast", 1)[1].split()[0] or 1.0)
        return EvalResult(task=task.name, status=Status.CORRECT, speedup=speed, message="correct")
    if "# warn" in marker:
        return EvalResult(task=task.name, status=Status.CORRECT, speedup=1.0, message="correct",
                          findings=[Finding(rule="odd_thing", message="odd", severity=Severity.WARN)])
    if "# wrong" in marker:
        return EvalResult(task=task.name, status=Status.INCORRECT,
                          message="incorrect on input set 1 (scaled x1.30 and shifted +0.10 mean-abs): output: 4 of 4 "
                                  "values outside tolerance (max abs err 1, atol 0.0001, rtol 0.0001)")
    if "# hack" in marker:
        return EvalResult(task=task.name, status=Status.FLAGGED, message="flagged: cached_output",
                          findings=[Finding(rule="cached_output", message="returns a stored tensor")])
    if "# taskerror" in marker:
        return EvalResult(task=task.name, status=Status.TASK_ERROR, message="the reference hangs")
    return EvalResult(task=task.name, status=Status.COMPILE_ERROR, message="does not build")


class ScriptedBackend:
    """An `evaluate_batch` backend that judges by `judge` and records its calls."""

    def __init__(self, judge: Callable[[Task, str], EvalResult] = judge_by_marker) -> None:
        self.judge = judge
        self.calls: list[list[tuple[str, str]]] = []
        self._lock = threading.Lock()

    def evaluate_batch(self, items: Sequence[tuple[Task, Candidate | str]]) -> list[EvalResult]:
        pairs = [(t, c.source if isinstance(c, Candidate) else c) for t, c in items]
        with self._lock:
            self.calls.append([(t.name, s) for t, s in pairs])
        return [self.judge(t, s) for t, s in pairs]

    def close(self) -> None:
        pass


class ThreadRanks:
    """`count` ranks as threads of one process, for tests of what ranks must agree on: the same
    collectives as `kernelrl.train.ranks.AccelerateRanks`, every object copied as a pickle would be."""

    def __init__(self, index: int, hub: _Hub) -> None:
        self.index, self._hub = index, hub

    @classmethod
    def group(cls, count: int) -> list[ThreadRanks]:
        hub = _Hub(count)
        return [cls(i, hub) for i in range(count)]

    @property
    def count(self) -> int:
        return self._hub.count

    @property
    def is_main(self) -> bool:
        return self.index == 0

    def broadcast(self, obj):
        import copy

        if self.is_main:
            self._hub.value = obj
        self._hub.barrier.wait()
        value = copy.deepcopy(self._hub.value)
        self._hub.barrier.wait()
        return value

    def gather(self, items):
        import copy

        self._hub.slots[self.index] = copy.deepcopy(list(items))
        self._hub.barrier.wait()
        out = [x for slot in self._hub.slots for x in copy.deepcopy(slot)]
        self._hub.barrier.wait()
        return out

    def barrier(self) -> None:
        self._hub.barrier.wait()


class _Hub:
    def __init__(self, count: int) -> None:
        self.count = count
        self.barrier = threading.Barrier(count, timeout=60)
        self.slots: list[object] = [None] * count
        self.value: object = None


def run_ranks(count: int, body: Callable[[ThreadRanks], object]) -> list[object]:
    """`body(ranks)` on `count` threads at once; each thread's result, or the exception it raised."""
    ranks = ThreadRanks.group(count)
    out: list[object] = [None] * count

    def one(i: int) -> None:
        try:
            out[i] = body(ranks[i])
        except BaseException as e:  # noqa: BLE001 - handed back to the test to inspect
            out[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


def launch_stage(stage: str, run: Path, cache_dir: Path, *more: str) -> subprocess.CompletedProcess[str]:
    """`kernelrl train STAGE --config tiny-cpu` on two processes (gloo on the CPU). accelerate's own
    `--cpu --num_processes 2` starts one process (its simple launcher); `--multi_gpu` starts two
    through torchrun, and with no CUDA they meet on the CPU."""
    cmd = ["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "kernelrl", "train", stage,
           "--config", "tiny-cpu", "--output-dir", str(run), "--model.path", str(run / "base"),
           "--cache-dir", str(cache_dir),
           *more]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run(cmd, cwd=Path(__file__).resolve().parents[1], env=env, capture_output=True, text=True,
                          timeout=900)


def run_parts(tasks: Sequence[Task], judge: ProfilingJudge | None = None, *, db: Database | None = None,
              reporter: Reporter | None = None) -> RunParts:
    """The parts of a run over `tasks` (the default `EvalConfig`: policy open, cpu, small), handed in
    whole: the judge, database and reporter given (none: no database, a quiet reporter), nothing
    opened, built or closed, no row (what `build_run` makes, for a part that takes a run)."""
    from kernelrl.backends.judges import BackendConfig
    from kernelrl.judge.eval_config import EvalConfig
    from kernelrl.run_parts import Reporter, RunParts

    return RunParts(tasks=list(tasks), eval_config=EvalConfig(), backend=BackendConfig(), db=db, judge=judge,
                    proposers={}, reporter=reporter or Reporter.quiet(), closing=contextlib.ExitStack())
