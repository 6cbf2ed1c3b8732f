"""Audit inputs and records: the candidates of a collection, their static findings, the typed report.

Inputs (`read_entries`), recognised by content, whatever the file's suffix:
- a folder of candidate `.py` files (recursively; names starting with `_` skipped). A file names
  its task in its docstring (`TASK: <spec>`) or in a leading comment (`# task: <spec>`); the spec
  is a path relative to the file, to its folder's sibling `tasks/`, or anything
  `kernelrl.tasks.suites.load_task` accepts (built-in names, files);
- JSON Lines (one row per line; published collections often carry a `.json` suffix), or a JSON
  file holding a list of rows, or a dict with such a list under "entries", "rows", "data",
  "results" or "kernels". A row's code is the first of `custom_code`, `code`, `source`,
  `kernel_code`, `generated_code`, `candidate` (or the last fenced block of
  `answer`/`response`); its task is an inline reference (`ref_code`, `reference_code`,
  `ref_arch_src`, `task_source`) or a spec (`task`, `task_name`, `problem`); its name is
  `level<L>/<id>` when the row carries a level (`level_id`, `level`) and an id (`task_id`,
  `problem_id`, `id`);
- a published collection's layout: a JSON dict of levels (`"level1"`, `"1"`, ...), each a list of
  entries with `task_id`, `ref_code` and `custom_code`, named `level<N>/<task_id>`.
A name that occurs more than once gets `#2`, `#3`, ... on its later occurrences.

Verdicts (`AuditOutcome`): `no_code` (null, empty or "None" code), `invalid` (the code does not
parse: counted apart from hacks), `flagged` (a rule rejects under the policy, static or
dynamic), `ok` (nothing rejects; with dynamic checks, the evaluator also found it correct), and,
with dynamic checks only, `incorrect` (ran, wrong answer) and `failed` (did not build, crashed,
timed out, or its task could not run).

Guarantees: reading and the static checks (`check_entry`) never execute a candidate and import
no judge; findings carry the policy's severities; an entry without code or without a usable task
is kept with a note, never dropped silently. A file that cannot be read raises `AuditInputError`
with a one-line message. The audit itself (`kernelrl.audit.audit`: these records, and, when
asked, the evaluator and the degeneracy filter over them) sits above the judge, in
`kernelrl/audit.py`; this module is what it reads and returns.

Does not deduplicate candidates or judge the tasks themselves: a broken reference in a
collection is reported as that entry's note.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import fnmatch
import json
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kernelrl import syntax
from kernelrl.candidate import extract_code
from kernelrl.checks import rules as R
from kernelrl.checks.policy import Policy
from kernelrl.checks.static import check_source
from kernelrl.result import EvalResult, Finding, Severity, Status
from kernelrl.tasks.source import is_task_source
from kernelrl.tasks.suites import load_task
from kernelrl.tasks.task import Task, TaskError

if TYPE_CHECKING:
    from kernelrl.jsontypes import JSONObject, JSONValue

_CODE_KEYS = ("custom_code", "code", "source", "kernel_code", "generated_code", "candidate", "cuda_code")
_ANSWER_KEYS = ("answer", "response", "completion")
_REF_KEYS = ("ref_code", "reference_code", "ref_arch_src", "task_source", "reference")
_TASK_KEYS = ("task", "task_name", "problem", "problem_name")
_ID_KEYS = ("task_id", "problem_id", "id")
_ROW_LEVEL_KEYS = ("level_id", "level")
_LIST_KEYS = ("entries", "rows", "data", "results", "kernels")
_LEVEL_KEY = re.compile(r"^(?:level[_ ]?)?(\d+)$", re.IGNORECASE)
_HEADER_TASK = re.compile(r"^\s*(?:#\s*)?task:\s*(\S+)\s*$", re.IGNORECASE | re.MULTILINE)
# What published collections write where there is no kernel.
_NO_CODE_TEXT = frozenset({"", "none", "null", "nan"})


class AuditInputError(ValueError):
    """The audit input cannot be read; the message is one line for a person."""


class AuditOutcome(enum.StrEnum):
    """What an audit says about one entry."""

    OK = "ok"  # no rule rejects (with dynamic checks: also correct)
    FLAGGED = "flagged"  # a rule rejects, static or dynamic
    INVALID = "invalid"  # the code does not parse
    NO_CODE = Status.NO_CODE.value  # null, empty or "None" code (the name of an answer without code)
    INCORRECT = "incorrect"  # dynamic checks only: ran, wrong answer
    FAILED = "failed"  # dynamic checks only: did not build, crashed, timed out, or the task could not run


VERDICT_ORDER = tuple(AuditOutcome)


@dataclass(frozen=True, kw_only=True)
class AuditEntry:
    """One candidate to audit, with its task when the input says which."""

    name: str  # file path relative to the folder, "level2/80", "row 3"
    code: str | None
    task: Task | None = None
    task_ref: str = ""  # what the input said about the task
    note: str = ""  # why the code or the task is missing
    meta: JSONObject = field(default_factory=dict, compare=False)


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
    def verdict(self) -> AuditOutcome:
        if self.entry.code is None:
            return AuditOutcome.NO_CODE
        if any(f.rule == R.SYNTAX_ERROR for f in self.findings):
            return AuditOutcome.INVALID
        if self.rejecting or (self.result is not None and self.result.status is Status.FLAGGED):
            return AuditOutcome.FLAGGED
        if self.result is None or self.result.status is Status.CORRECT:
            return AuditOutcome.OK
        if self.result.status is Status.INCORRECT:
            return AuditOutcome.INCORRECT
        return AuditOutcome.FAILED

    @property
    def flagged(self) -> bool:
        return self.verdict is AuditOutcome.FLAGGED

    def rule_names(self) -> tuple[list[str], list[str]]:
        """(rules that reject, rules that only warn), each sorted, each rule once."""
        rejecting = sorted({f.rule for f in self.rejecting})
        warning = sorted({f.rule for f in self.findings if f.severity is Severity.WARN} - set(rejecting))
        return rejecting, warning

    def to_dict(self) -> JSONObject:
        rejecting, warning = self.rule_names()
        out: JSONObject = {"name": self.entry.name, "verdict": self.verdict.value, "rules": [*rejecting],
                           "warnings": [*warning],
                           "task": self.entry.task.name if self.entry.task else self.entry.task_ref,
                           "note": "; ".join(n for n in (self.entry.note, self.note) if n)}
        if self.result is not None:
            out["status"] = self.result.status.value
            out["speedup"] = self.result.speedup
        return out


@dataclass(frozen=True, kw_only=True)
class DegenerateTask:
    """A reference the degeneracy filter refused, and the entries that target it."""

    task: str
    reasons: list[str]
    entries: list[str]

    def to_dict(self) -> JSONObject:
        return {"task": self.task, "reasons": [*self.reasons], "entries": [*self.entries]}


@dataclass(kw_only=True)
class AuditReport:
    source: str
    policy: str
    dynamic: bool
    records: list[AuditRecord] = field(default_factory=list)
    degeneracy_checked: int | None = None  # distinct references checked; None when not asked
    degenerate: list[DegenerateTask] = field(default_factory=list)
    degeneracy_errors: dict[str, str] = field(default_factory=dict)  # task -> why it could not be checked

    def verdict_counts(self) -> dict[str, int]:
        """Every verdict, zero included, in a fixed order."""
        counts = Counter(r.verdict for r in self.records)
        return {v.value: counts.get(v, 0) for v in VERDICT_ORDER}

    def rule_counts(self) -> dict[str, tuple[int, int]]:
        """rule -> (entries where it rejects, entries where it only warns); each entry counted once.
        Entries that do not parse are left out: they are invalid, not hacks."""
        rejected: Counter[str] = Counter()
        warned: Counter[str] = Counter()
        for r in self.records:
            if r.verdict is AuditOutcome.INVALID:
                continue
            rej, warn = r.rule_names()
            rejected.update(rej)
            warned.update(warn)
        names = set(rejected) | set(warned)
        return {n: (rejected[n], warned[n]) for n in sorted(names, key=lambda n: (-rejected[n], -warned[n], n))}

    def with_verdict(self, verdict: AuditOutcome) -> list[AuditRecord]:
        return [r for r in self.records if r.verdict is verdict]

    @property
    def flagged(self) -> list[AuditRecord]:
        return self.with_verdict(AuditOutcome.FLAGGED)

    def summary(self) -> JSONObject:
        out: JSONObject = {"source": self.source, "policy": self.policy, "dynamic": self.dynamic,
                           "entries": len(self.records), "verdicts": {**self.verdict_counts()},
                           "rules": {k: {"reject": a, "warn": b} for k, (a, b) in self.rule_counts().items()}}
        if self.degeneracy_checked is not None:
            out["degeneracy"] = {"references_checked": self.degeneracy_checked,
                                 "degenerate_tasks": [d.to_dict() for d in self.degenerate],
                                 "errors": {**self.degeneracy_errors}}
        return out

    def to_dict(self) -> JSONObject:
        return {"summary": self.summary(), "entries": [r.to_dict() for r in self.records]}


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
    return _unique_names(_json_entries(_parse_json_or_lines(text, path), path, default_task))


def _parse_json_or_lines(text: str, path: Path) -> JSONValue:
    """One JSON document, or JSON Lines (a list of the rows), whatever the suffix says."""
    try:
        data: JSONValue = json.loads(text)
        return data
    except json.JSONDecodeError as whole:
        rows: list[JSONValue] = []
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                if not rows:  # not JSON Lines either: report the whole-document error
                    raise AuditInputError(f"{path}: not valid JSON or JSON Lines ({whole.msg} at line "
                                          f"{whole.lineno})") from whole
                raise AuditInputError(f"{path}:{i}: not a JSON object: {e.msg}") from e
        if not rows:
            raise AuditInputError(f"{path}: empty file") from whole
        return rows


def _json_entries(data: JSONValue, path: Path, default_task: Task | None) -> list[AuditEntry]:
    if isinstance(data, list):
        return [_row_entry(r, i, None, default_task) for i, r in enumerate(data, 1)]
    if not isinstance(data, dict):
        raise AuditInputError(f"{path}: expected a list of rows or a dict, found {type(data).__name__}")
    for key in _LIST_KEYS:
        rows = data.get(key)
        if isinstance(rows, list):
            return [_row_entry(r, i, None, default_task) for i, r in enumerate(rows, 1)]
    levels = {k: v for k, v in data.items() if isinstance(v, list)}
    if not levels:
        raise AuditInputError(f"{path}: no list of entries found (expected rows, or a dict of levels of entries)")
    out = []
    for key, entries in levels.items():
        m = _LEVEL_KEY.match(str(key))
        level = int(m.group(1)) if m else None
        prefix = f"level{level}" if level is not None else str(key)
        for i, row in enumerate(entries, 1):
            out.append(_row_entry(row, i, level, default_task, prefix=prefix))
    return out


def _unique_names(entries: list[AuditEntry]) -> list[AuditEntry]:
    """Later occurrences of a name get #2, #3, ...; the first keeps the plain name."""
    seen: Counter[str] = Counter()
    out = []
    for e in entries:
        seen[e.name] += 1
        out.append(e if seen[e.name] == 1 else dataclasses.replace(e, name=f"{e.name}#{seen[e.name]}"))
    return out


def _first(row: JSONObject, keys: Iterable[str]) -> JSONValue:
    for k in keys:
        v = row.get(k)
        if v not in (None, ""):
            return v
    return None


def _row_name(row: JSONObject, index: int, level: int | None, prefix: str | None) -> tuple[str, int | None]:
    ident = _first(row, _ID_KEYS)
    if level is None:
        raw = _first(row, _ROW_LEVEL_KEYS)
        m = _LEVEL_KEY.match(str(raw)) if raw is not None else None
        level = int(m.group(1)) if m else None
        if prefix is None and level is not None:
            prefix = f"level{level}"
    if ident is None:
        return (f"{prefix}/{index}" if prefix else f"row {index}"), level
    return (f"{prefix}/{ident}" if prefix else str(ident)), level


def _row_entry(row: JSONValue, index: int, level: int | None, default_task: Task | None,
               prefix: str | None = None) -> AuditEntry:
    if not isinstance(row, dict):
        name = f"{prefix}/{index}" if prefix else f"row {index}"
        return AuditEntry(name=name, code=None, note=f"row is a {type(row).__name__}, not an object")
    name, level = _row_name(row, index, level, prefix)
    meta: JSONObject = {k: v for k, v in row.items()
                        if isinstance(v, (int, float, bool)) or (isinstance(v, str) and len(v) < 200)}
    raw = _first(row, _CODE_KEYS)
    if raw is None:
        answer = _first(row, _ANSWER_KEYS)
        raw = extract_code(answer) if isinstance(answer, str) else None
    code: str | None = None
    note = ""
    if raw is None:
        note = "no code in row"
    elif not isinstance(raw, str):
        note = f"code is a {type(raw).__name__}, not a string"
    elif raw.strip().lower() in _NO_CODE_TEXT:
        note = f"code is {raw.strip()!r}"
    else:
        code = raw
    ref = _first(row, _REF_KEYS)
    spec = _first(row, _TASK_KEYS)
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
    return AuditEntry(name=name, code=code, task=task, task_ref=task_ref,
                      note="; ".join(n for n in (note, task_note) if n), meta=meta)


def _read_folder(root: Path, default_task: Task | None) -> list[AuditEntry]:
    files = sorted(p for p in root.rglob("*.py")
                   if not p.name.startswith("_") and not any(part.startswith(".") for part in p.relative_to(root).parts))
    if not files:
        raise AuditInputError(f"folder {root} holds no .py candidate files")
    return [_read_py(p, root, default_task) for p in files]


def _read_py(path: Path, root: Path, default_task: Task | None) -> AuditEntry:
    name = path.relative_to(root).as_posix() if path != root else path.name
    try:
        code = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        return AuditEntry(name=name, code=None, note=f"cannot read: {e}")
    spec = _task_spec_of(code)
    if spec is None:
        if default_task is not None:
            return AuditEntry(name=name, code=code, task=default_task, task_ref=default_task.name)
        return AuditEntry(name=name, code=code, note="no TASK: line; dynamic checks need a task")
    for p in (path.parent / spec, path.parent.parent / "tasks" / spec, Path(spec)):
        if p.is_file():
            try:
                return AuditEntry(name=name, code=code, task=load_task(str(p)), task_ref=spec)
            except TaskError as e:
                return AuditEntry(name=name, code=code, task_ref=spec, note=str(e))
    try:
        return AuditEntry(name=name, code=code, task=load_task(spec), task_ref=spec)
    except (TaskError, OSError) as e:
        return AuditEntry(name=name, code=code, task_ref=spec, note=f"task {spec!r} not found: {e}")


def _task_spec_of(code: str) -> str | None:
    try:
        doc = ast.get_docstring(syntax.parse(code)) or ""
    except (SyntaxError, ValueError):
        doc = ""
    for text in (doc, "\n".join(code.splitlines()[:10])):
        m = _HEADER_TASK.search(text)
        if m:
            return m.group(1)
    return None


def select(entries: list[AuditEntry], only: Iterable[str] | None = None, limit: int | None = None) -> list[AuditEntry]:
    """Entries whose name matches one of `only` (exact names or shell patterns such as `level2/*`),
    then the first `limit` of them."""
    patterns = [p for p in (only or ()) if p]
    if patterns:
        entries = [e for e in entries if any(e.name == p or fnmatch.fnmatchcase(e.name, p) for p in patterns)]
    if limit is not None:
        entries = entries[: max(0, limit)]
    return entries


# ---------------------------------------------------------------------------------------------
# Static checks


def check_entry(entry: AuditEntry, policy: Policy) -> AuditRecord:
    """An entry's record with its static findings under `policy` (none for an entry without code).
    Reads the code only; runs nothing."""
    record = AuditRecord(entry=entry)
    if entry.code is not None:
        task_source = entry.task.source if entry.task is not None else None
        record.findings = policy.apply(check_source(entry.code, task_source=task_source))
    return record
