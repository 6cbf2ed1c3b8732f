"""The audit: a collection of existing candidates through the checks and, when asked, the judge.

`kernelrl.checks.audit` reads the collection (a folder, JSON, JSON Lines, a published dict of
levels) and holds the typed records; this module runs them: the static checks always, the
evaluator (`--dynamic`) and the degeneracy filter (`--degeneracy`) only when asked. It sits above
the judge, as the search and the trainer do: the checks never import the evaluator they feed.

Guarantees: `audit()` is the one entry point; static checks always run and never execute a
candidate; dynamic checks run only when asked, through `kernelrl.judge.evaluator.evaluate`
(imported lazily, so a static audit imports no torch), once per selected entry that has a task
and parses; the degeneracy filter runs only when asked, once per distinct reference
(`kernelrl.judge.degeneracy.check_tasks`, which runs references in the judge's sandboxed
workers); an entry without code or without a usable task is kept in the report with a note,
never dropped silently.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from kernelrl.candidate import Candidate
from kernelrl.checks.audit import (
    AuditInputError,
    AuditOutcome,
    AuditRecord,
    AuditReport,
    DegenerateTask,
    check_entry,
    read_entries,
    select,
)
from kernelrl.checks.policy import Policy, PolicyName, get_policy
from kernelrl.tasks.suites import load_task
from kernelrl.tasks.task import Task, TaskError

if TYPE_CHECKING:
    from rich.console import Console

    from kernelrl.judge.evaluator import EvalConfig
    from kernelrl.tasks.degeneracy import DegeneracyReport


def audit(path: Path | str, *, policy: str | Policy = "open", run_dynamic: bool = False,
          eval_config: EvalConfig | None = None, task_spec: str | None = None, only: Iterable[str] | None = None,
          limit: int | None = None, degeneracy: bool = False, console: Console | None = None,
          on_record: Callable[[AuditRecord], None] | None = None) -> AuditReport:
    """Static checks (and, when asked, the evaluator and the degeneracy filter) over every candidate in `path`.

    `task_spec` is a default task for entries that name none. `only` keeps entries whose name
    matches (names or shell patterns), `limit` the first N of those. With `console`, dynamic
    audits and the degeneracy filter print one progress line per step.
    """
    pol = get_policy(policy)
    default_task = None
    if task_spec is not None:
        try:
            default_task = load_task(task_spec)
        except (TaskError, OSError) as e:
            raise AuditInputError(f"task {task_spec!r}: {e}") from e
    entries = select(read_entries(path, default_task=default_task), only, limit)
    report = AuditReport(source=str(path), policy=pol.name, dynamic=run_dynamic)
    config = _dynamic_config(eval_config, pol.name) if run_dynamic else None
    if config is not None and console is not None:
        console.print(f"evaluating {sum(1 for e in entries if e.code is not None)} of {len(entries)} entries")
    for i, entry in enumerate(entries, 1):
        record = check_entry(entry, pol)
        if entry.code is not None and config is not None and record.verdict is not AuditOutcome.INVALID:
            _run_dynamic(record, config)
            if console is not None:
                rules = ", ".join(record.rule_names()[0])
                console.print(f"[{i}/{len(entries)}] {entry.name}: {record.verdict.value}"
                              + (f" ({rules})" if rules else ""), markup=False, highlight=False)
        report.records.append(record)
        if on_record is not None:
            on_record(record)
    if degeneracy:
        _check_degeneracy(report, console)
    return report


def _dynamic_config(eval_config: EvalConfig | None, policy: str) -> EvalConfig:
    from kernelrl.judge.evaluator import (
        EvalConfig,  # the evaluator is heavy; only dynamic audits need it
    )

    base = eval_config or EvalConfig()
    return dataclasses.replace(base, policy=PolicyName(policy))


def _run_dynamic(record: AuditRecord, config: EvalConfig) -> None:
    from kernelrl.judge.evaluator import evaluate

    entry = record.entry
    if entry.task is None:
        record.note = "dynamic checks skipped: no task"
        return
    try:
        result = evaluate(entry.task, Candidate(source=entry.code or "", origin=entry.name), config)
    except TaskError as e:
        record.note = f"dynamic checks skipped: {e}"
        return
    record.result = result
    # The evaluator runs the static checks too; keep ours once and add what only it could see.
    seen = {(f.rule, f.line) for f in record.findings}
    record.findings += [f for f in result.findings if f.stage != "static" and (f.rule, f.line) not in seen]


def _reference_key(task: Task) -> str:
    return hashlib.sha256(task.source.encode()).hexdigest()


def _degeneracy_reports(tasks: list[Task]) -> list[DegeneracyReport | TaskError]:
    """The degeneracy filter over distinct references (one sandboxed evaluator for all)."""
    from kernelrl.judge.degeneracy import check_tasks

    return list(check_tasks(tasks))


def _check_degeneracy(report: AuditReport, console: Console | None) -> None:
    """Run the degeneracy filter once per distinct reference; record degenerate tasks and their entries."""
    by_ref: dict[str, tuple[Task, list[str]]] = {}
    for r in report.records:
        task = r.entry.task
        if task is None:
            continue
        key = _reference_key(task)
        if key not in by_ref:
            by_ref[key] = (task, [])
        by_ref[key][1].append(r.entry.name)
    tasks = [t for t, _ in by_ref.values()]
    if console is not None:
        console.print(f"degeneracy filter: {len(tasks)} distinct references")
    results = _degeneracy_reports(tasks) if tasks else []
    report.degeneracy_checked = len(tasks)
    for (task, names), result in zip(by_ref.values(), results, strict=True):
        if isinstance(result, Exception):
            report.degeneracy_errors[task.name] = str(result)
        elif result.degenerate:
            report.degenerate.append(DegenerateTask(task=task.name, reasons=list(result.reasons), entries=names))
            note = f"task {task.name} is degenerate: {'; '.join(result.reasons)}"
            for r in report.records:
                if r.entry.name in names:
                    r.note = "; ".join(n for n in (r.note, note) if n)
