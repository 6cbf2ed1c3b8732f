"""Audits: run the checks over many existing candidates and count which rules fire.

Inputs (`read_entries`):
- a folder of candidate `.py` files (recursively; names starting with `_` skipped). A file names
  its task in its docstring (`TASK: <spec>`) or in a leading comment (`# task: <spec>`); the spec
  is a path relative to the file, to its folder's sibling `tasks/`, or anything
  `kernelrl.tasks.task.load_task` accepts (built-in names, files);
- a JSONL file, one row per line, or a JSON file holding a list of rows or a dict with such a
  list under "entries", "rows", "data", "results" or "kernels". A row's code is the first of
  `custom_code`, `code`, `source`, `kernel_code`, `generated_code`, `candidate` (or the last
  fenced block of `answer`/`response`); its task is an inline reference (`ref_code`,
  `reference_code`, `ref_arch_src`, `task_source`) or a spec (`task`, `task_name`, `problem`);
- a published collection's layout: a JSON dict of levels (`"level1"`, `"1"`, ...), each a list of
  entries with `task_id`, `ref_code` and `custom_code`; the task is built from `ref_code` and named
  `level<N>/<task_id>`.

Guarantees: static checks always run and never execute a candidate; dynamic checks run only when
asked, through `kernelrl.judge.evaluator.evaluate` (imported lazily), once per entry that has a task;
findings carry the policy's severities; an entry without code or without a usable task is kept
in the report with a note, never dropped silently. A file that cannot be read raises
`AuditInputError` with a one-line message.

Does not deduplicate candidates or judge tasks: a broken reference in a collection is reported as
that entry's note.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelrl.candidate import Candidate, extract_code
from kernelrl.checks.policy import Policy, get_policy
from kernelrl.checks.static import check_source
from kernelrl.result import EvalResult, Finding, Severity, Status
from kernelrl.tasks.suites import load_task
from kernelrl.tasks.task import Task, TaskError, is_task_source

if TYPE_CHECKING:
    from rich.console import Console

    from kernelrl.judge.evaluator import EvalConfig

_CODE_KEYS = ("custom_code", "code", "source", "kernel_code", "generated_code", "candidate", "cuda_code")
_ANSWER_KEYS = ("answer", "response", "completion")
_REF_KEYS = ("ref_code", "reference_code", "ref_arch_src", "task_source", "reference")
_TASK_KEYS = ("task", "task_name", "problem", "problem_name")
_ID_KEYS = ("task_id", "problem_id", "id")
_LIST_KEYS = ("entries", "rows", "data", "results", "kernels")
_LEVEL_KEY = re.compile(r"^(?:level[_ ]?)?(\d+)$", re.IGNORECASE)
_HEADER_TASK = re.compile(r"^\s*(?:#\s*)?task:\s*(\S+)\s*$", re.IGNORECASE | re.MULTILINE)


class AuditInputError(ValueError):
    """The audit input cannot be read; the message is one line for a person."""


@dataclass(frozen=True, kw_only=True)
class AuditEntry:
    """One candidate to audit, with its task when the input says which."""

    id: str  # file path relative to the folder, "row 3", or "level1/12#0"
    code: str | None
    task: Task | None = None
    task_ref: str = ""  # what the input said about the task
    note: str = ""  # why the code or the task is missing
    meta: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(kw_only=True)
class AuditRecord:
    entry: AuditEntry
    findings: list[Finding] = field(default_factory=list)
    result: EvalResult | None = None
    note: str = ""

    @property
    def rejecting(self) -> list[Finding]:
        return [f for f in self.findings if f.severity is Severity.REJECT]

    @property
    def flagged(self) -> bool:
        return bool(self.rejecting) or (self.result is not None and self.result.status is Status.FLAGGED)

    @property
    def status(self) -> str:
        """The dynamic verdict, or what static checks alone say."""
        if self.entry.code is None:
            return "skipped"
        if self.result is not None:
            return self.result.status.value
        return "flagged" if self.rejecting else "static_ok"

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.entry.id, "task": self.entry.task.name if self.entry.task else self.entry.task_ref,
                "status": self.status, "flagged": self.flagged, "findings": [f.to_dict() for f in self.findings],
                "result": self.result.to_dict() if self.result else None,
                "note": "; ".join(n for n in (self.entry.note, self.note) if n)}


@dataclass(kw_only=True)
class AuditReport:
    source: str
    policy: str
    dynamic: bool
    records: list[AuditRecord] = field(default_factory=list)

    def rule_counts(self) -> dict[str, tuple[int, int]]:
        """rule -> (entries where it rejects, entries where it only warns); each entry counted once."""
        rejected: Counter[str] = Counter()
        warned: Counter[str] = Counter()
        for r in self.records:
            rej = {f.rule for f in r.findings if f.severity is Severity.REJECT}
            warn = {f.rule for f in r.findings if f.severity is Severity.WARN} - rej
            rejected.update(rej)
            warned.update(warn)
        names = set(rejected) | set(warned)
        return {n: (rejected[n], warned[n]) for n in sorted(names, key=lambda n: (-rejected[n], -warned[n], n))}

    def status_counts(self) -> dict[str, int]:
        return dict(Counter(r.status for r in self.records).most_common())

    @property
    def flagged(self) -> list[AuditRecord]:
        return [r for r in self.records if r.flagged]

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "policy": self.policy, "dynamic": self.dynamic,
                "rule_counts": {k: {"reject": a, "warn": b} for k, (a, b) in self.rule_counts().items()},
                "status_counts": self.status_counts(), "records": [r.to_dict() for r in self.records]}


# ---------------------------------------------------------------------------------------------
# Reading inputs


def read_entries(path: Path | str, *, default_task: Task | None = None) -> list[AuditEntry]:
    path = Path(path)
    if path.is_dir():
        return _read_folder(path, default_task)
    if not path.is_file():
        raise AuditInputError(f"no such file or folder: {path}")
    if path.suffix == ".py":
        return [_read_py(path, path.parent, default_task)]
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise AuditInputError(f"cannot read {path}: {e}") from e
    if path.suffix == ".jsonl":
        rows = []
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise AuditInputError(f"{path}:{i}: not a JSON object: {e.msg}") from e
        return [_row_entry(r, f"row {i}", None, default_task) for i, r in enumerate(rows, 1)]
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise AuditInputError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from e
    return _json_entries(data, path, default_task)


def _json_entries(data: Any, path: Path, default_task: Task | None) -> list[AuditEntry]:
    if isinstance(data, list):
        return [_row_entry(r, f"row {i}", None, default_task) for i, r in enumerate(data, 1)]
    if not isinstance(data, dict):
        raise AuditInputError(f"{path}: expected a list of rows or a dict, found {type(data).__name__}")
    for key in _LIST_KEYS:
        if isinstance(data.get(key), list):
            return [_row_entry(r, f"row {i}", None, default_task) for i, r in enumerate(data[key], 1)]
    levels = {k: v for k, v in data.items() if isinstance(v, list)}
    if not levels:
        raise AuditInputError(f"{path}: no list of entries found (expected rows, or a dict of levels of entries)")
    out = []
    for key, entries in levels.items():
        m = _LEVEL_KEY.match(str(key))
        level = int(m.group(1)) if m else None
        prefix = f"level{level}" if level is not None else str(key)
        seen: Counter[str] = Counter()
        for i, row in enumerate(entries):
            ident = str(_first(row, _ID_KEYS) or i) if isinstance(row, dict) else str(i)
            n = seen[ident]
            seen[ident] += 1
            out.append(_row_entry(row, f"{prefix}/{ident}#{n}", level, default_task, task_name=f"{prefix}/{ident}"))
    return out


def _first(row: dict[str, Any], keys: Iterable[str]) -> Any:
    for k in keys:
        v = row.get(k)
        if v not in (None, ""):
            return v
    return None


def _row_entry(row: Any, ident: str, level: int | None, default_task: Task | None,
               task_name: str | None = None) -> AuditEntry:
    if not isinstance(row, dict):
        return AuditEntry(id=ident, code=None, note=f"row is a {type(row).__name__}, not an object")
    meta = {k: v for k, v in row.items() if isinstance(v, (int, float, bool)) or (isinstance(v, str) and len(v) < 200)}
    code = _first(row, _CODE_KEYS)
    note = ""
    if code is None:
        answer = _first(row, _ANSWER_KEYS)
        code = extract_code(answer) if isinstance(answer, str) else None
    if code is not None and not isinstance(code, str):
        code, note = None, "code is not a string"
    elif code is None:
        note = "no code in row"
    ref = _first(row, _REF_KEYS)
    spec = _first(row, _TASK_KEYS)
    name = task_name or str(spec or _first(row, _ID_KEYS) or ident)
    task, task_ref, task_note = None, str(spec or name), ""
    if isinstance(ref, str):
        if is_task_source(ref):
            task = Task(name=name, source=ref, level=level, suite="audit")
        else:
            task_note = "ref_code is not a KernelBench-format program (Model, get_inputs, get_init_inputs)"
    elif isinstance(spec, str):
        try:
            task = load_task(spec)
        except (TaskError, OSError) as e:
            task_note = f"task {spec!r} not found: {e}"
    elif default_task is not None:
        task, task_ref = default_task, default_task.name
    return AuditEntry(id=ident, code=code, task=task, task_ref=task_ref,
                      note="; ".join(n for n in (note, task_note) if n), meta=meta)


def _read_folder(root: Path, default_task: Task | None) -> list[AuditEntry]:
    files = sorted(p for p in root.rglob("*.py")
                   if not p.name.startswith("_") and not any(part.startswith(".") for part in p.relative_to(root).parts))
    if not files:
        raise AuditInputError(f"folder {root} holds no .py candidate files")
    return [_read_py(p, root, default_task) for p in files]


def _read_py(path: Path, root: Path, default_task: Task | None) -> AuditEntry:
    ident = path.relative_to(root).as_posix() if path != root else path.name
    try:
        code = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        return AuditEntry(id=ident, code=None, note=f"cannot read: {e}")
    spec = _task_spec_of(code)
    if spec is None:
        if default_task is not None:
            return AuditEntry(id=ident, code=code, task=default_task, task_ref=default_task.name)
        return AuditEntry(id=ident, code=code, note="no TASK: line; dynamic checks need a task")
    for p in (path.parent / spec, path.parent.parent / "tasks" / spec, Path(spec)):
        if p.is_file():
            try:
                return AuditEntry(id=ident, code=code, task=load_task(str(p)), task_ref=spec)
            except TaskError as e:
                return AuditEntry(id=ident, code=code, task_ref=spec, note=str(e))
    try:
        return AuditEntry(id=ident, code=code, task=load_task(spec), task_ref=spec)
    except (TaskError, OSError) as e:
        return AuditEntry(id=ident, code=code, task_ref=spec, note=f"task {spec!r} not found: {e}")


def _task_spec_of(code: str) -> str | None:
    try:
        doc = ast.get_docstring(ast.parse(code)) or ""
    except SyntaxError:
        doc = ""
    for text in (doc, "\n".join(code.splitlines()[:10])):
        m = _HEADER_TASK.search(text)
        if m:
            return m.group(1)
    return None


# ---------------------------------------------------------------------------------------------
# Auditing


def audit(path: Path | str, *, policy: str | Policy = "open", run_dynamic: bool = False,
          eval_config: EvalConfig | None = None, task_spec: str | None = None, limit: int | None = None,
          console: Console | None = None, on_record: Callable[[AuditRecord], None] | None = None) -> AuditReport:
    """Static checks (and, when asked, the evaluator) over every candidate in `path`.

    `task_spec` is a default task for entries that name none. `limit` keeps the first N entries.
    With `console`, dynamic audits print one progress line per evaluated entry.
    """
    pol = get_policy(policy)
    default_task = None
    if task_spec is not None:
        try:
            default_task = load_task(task_spec)
        except (TaskError, OSError) as e:
            raise AuditInputError(f"task {task_spec!r}: {e}") from e
    entries = read_entries(path, default_task=default_task)
    if limit is not None:
        entries = entries[: max(0, limit)]
    report = AuditReport(source=str(path), policy=pol.name, dynamic=run_dynamic)
    config = None
    if run_dynamic:
        config = _dynamic_config(eval_config, pol.name)
    for i, entry in enumerate(entries, 1):
        record = AuditRecord(entry=entry)
        if entry.code is not None:
            record.findings = pol.apply(check_source(entry.code))
            if config is not None:
                _run_dynamic(record, config)
                if console is not None:
                    rules = ", ".join(sorted({f.rule for f in record.rejecting}))
                    console.print(f"[{i}/{len(entries)}] {entry.id}: {record.status}" + (f" ({rules})" if rules else ""))
        report.records.append(record)
        if on_record is not None:
            on_record(record)
    return report


def _dynamic_config(eval_config: EvalConfig | None, policy: str) -> EvalConfig:
    from kernelrl.judge.evaluator import (
        EvalConfig,  # the evaluator is heavy; only dynamic audits need it
    )

    base = eval_config or EvalConfig()
    return dataclasses.replace(base, policy=policy)


def _run_dynamic(record: AuditRecord, config: EvalConfig) -> None:
    from kernelrl.judge.evaluator import evaluate

    entry = record.entry
    if entry.task is None:
        record.note = "dynamic checks skipped: no task"
        return
    try:
        result = evaluate(entry.task, Candidate(source=entry.code or "", origin=entry.id), config)
    except TaskError as e:
        record.note = f"dynamic checks skipped: {e}"
        return
    record.result = result
    # The evaluator runs the static checks too; keep ours once and add what only it could see.
    seen = {(f.rule, f.line) for f in record.findings}
    record.findings += [f for f in result.findings if f.stage != "static" and (f.rule, f.line) not in seen]
