"""Shared helpers for the run page's tests (not a test module): databases with known runs.

`fill_search_run(path)` writes one search run with one candidate of every kind the pages show
(correct with its interval, timing and roofline; incorrect with its first mismatch; a compile
error with compiler output; refused by a rule; a child with a parent), and puts `HOSTILE`
(markup and script) into everything a model controls: source, answer, messages, errors,
finding messages, the proposer's name, even a task's name. `RunWriter` appends candidates to a
run from a thread, the way `kernelrl optimize` does, while a page watches.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from kernelrl.result import (
    Environment,
    EvalResult,
    Finding,
    RooflineRecord,
    Severity,
    Status,
    TimingRecord,
    TimingStats,
    TimingStop,
)
from kernelrl.store import Database, NewCandidate

HOSTILE = ("</pre></details></td></table><script>window.__pwned = 1</script>"
           "<img src=x onerror=\"window.__pwned = 2\">'\"&amp;<!--")
# a task whose name is markup: names come from task files, which users write
EVIL_TASK = "evil/<i>x</i>&'\""
REFERENCE = "import torch\n\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n"
MISMATCH = "output: 12 of 1024 values outside tolerance (max abs err 0.5, atol 0.0001, rtol 0.0001)"


def program(marker: str) -> str:
    return (f"import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
            f"        return torch.relu(x)  # {marker}\n")


def correct(task: str, speedup: float, *, roofline: float | None = 40.0) -> EvalResult:
    t_ref = TimingStats(median_ms=1.0, mean_ms=1.0, min_ms=0.9, iqr_ms=0.05, n=30)
    t_cand = TimingStats(median_ms=1.0 / speedup, mean_ms=1.0 / speedup, min_ms=0.9 / speedup, iqr_ms=0.01, n=30)
    return EvalResult(task=task, status=Status.CORRECT, message=f"correct, {speedup:.3g}x", speedup=speedup,
                      speedup_ci=(speedup * 0.97, speedup * 1.03), ref_time=t_ref, cand_time=t_cand,
                      roofline_pct=roofline, ref_roofline_pct=(roofline or 0) / speedup if roofline else None,
                      max_abs_err=1e-7, max_rel_err=1e-6,
                      environment=Environment(
                          timing=TimingRecord(rounds=17, calls_per_sample=4, stopped_by=TimingStop.CI, group_size=3,
                                              rel_ci_half_width=0.008, wall_s=2.1),
                          roofline=RooflineRecord(memory_floor_ms=0.2, compute_floor_ms=0.05)))


def incorrect(task: str) -> EvalResult:
    return EvalResult(task=task, status=Status.INCORRECT, message=f"incorrect on input set 0 (plain): {MISMATCH}",
                      errors=[MISMATCH], max_abs_err=0.5, max_rel_err=2.0)


def compile_error(task: str) -> EvalResult:
    return EvalResult(task=task, status=Status.COMPILE_ERROR,
                      message=f"candidate does not build: error: expected ';' {HOSTILE}",
                      errors=[f"c++ -O3 kernel.cpp\nkernel.cpp:3:1: error: expected ';' before '}}' {HOSTILE}"])


def refused(task: str, rule: str = "cached_output") -> EvalResult:
    return EvalResult(task=task, status=Status.FLAGGED, message=f"flagged: {rule}",
                      errors=[f"returns a stored tensor {HOSTILE}"],
                      findings=[Finding(rule=rule, message=f"returns a stored tensor {HOSTILE}", line=7),
                                Finding(rule="style_note", message="just a note", severity=Severity.WARN,
                                        stage="static")])


def start_run(db: Database, tasks: list[str], *, budget: int = 4, proposer: str = f"heuristic {HOSTILE}") -> int:
    for name in tasks:
        db.upsert_task(name=name, source=REFERENCE, identity_hash=name, level=1, size="small")
    return db.start_run({"budget": budget, "chains": 1, "proposer": proposer, "task_names": tasks})


def add(db: Database, run: int, task: str, marker: str, result: EvalResult | None, *,
        parents: tuple[int, ...] = (), step: int = 0) -> int:
    source = program(marker)
    rec = db.add_candidate(NewCandidate(task=task, hash=f"{task}:{marker}", source=source, parents=parents,
                                        step=step, run_id=run, proposer="heuristic", answer=f"{HOSTILE}\n{source}"))
    if result is not None:
        db.store_result(rec.id, result)
    return rec.id


def fill_search_run(path: Path) -> dict[str, int]:
    """A search run over tasks a, b and EVIL_TASK; returns the ids of the candidates by kind."""
    ids: dict[str, int] = {}
    with Database(path) as db:
        run = start_run(db, ["a", "b", EVIL_TASK])
        ids["run"] = run
        ids["slow"] = add(db, run, "a", "slow", correct("a", 0.8, roofline=10.0))
        ids["fast"] = add(db, run, "a", "fast", correct("a", 2.5), parents=(ids["slow"],), step=1)
        ids["incorrect"] = add(db, run, "a", "wrong", incorrect("a"), parents=(ids["fast"],), step=2)
        ids["refused"] = add(db, run, "a", f"hack {HOSTILE}", refused("a"), step=3)
        ids["compile"] = add(db, run, "b", "broken", compile_error("b"))
        ids["b_fast"] = add(db, run, "b", "fast", correct("b", 1.5, roofline=None), step=1)
        ids["evil"] = add(db, run, EVIL_TASK, "x", correct(EVIL_TASK, 1.2))
        ids["pending"] = add(db, run, "b", "pending", None, step=2)
        db.put_baseline(task="a", device="cpu", size="small", eager_ms=10.0, compile_ms=5.0)
        db.put_baseline(task="b", device="cpu", size="small", eager_ms=4.0, compile_ms=None)
    return ids


class RunWriter(threading.Thread):
    """Appends `n` judged candidates to task `task` of `run`, one every `every_s` seconds."""

    def __init__(self, path: Path, run: int, task: str, *, n: int, every_s: float) -> None:
        super().__init__(daemon=True)
        self.path, self.run_id, self.task, self.n, self.every_s = path, run, task, n, every_s
        self.written = 0
        self.stop = threading.Event()

    def run(self) -> None:
        with Database(self.path) as db:
            for i in range(self.n):
                if self.stop.wait(self.every_s):
                    return
                add(db, self.run_id, self.task, f"live{i}", correct(self.task, 1.0 + 0.5 * (i + 1)), step=10 + i)
                self.written += 1


def _holds(predicate) -> bool:
    """One try of a browser predicate. A page that polls redraws itself: an element found an
    instant ago can be replaced before its text is read, which means "not yet", not failure."""
    try:
        return bool(predicate())
    except Exception as error:  # selenium is an optional test dependency; match by name
        if type(error).__name__ in ("StaleElementReferenceException", "NoSuchElementException"):
            return False
        raise


def wait_for(predicate, timeout_s: float = 20.0, every_s: float = 0.1) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if _holds(predicate):
            return True
        time.sleep(every_s)
    return _holds(predicate)
