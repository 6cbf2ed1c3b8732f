"""Replay of generated code: stored programs handed out per task, each once.

A JSONL file of rows `{"task": NAME, "code": ...}` or `{"task": NAME, "answer": ...}` (optional
`prompt_tokens`, `completion_tokens`), or a folder of .py files. A file's task is named by a
`# task: NAME` line among its first 10 lines; failing that by its path relative to the folder
without `.py` and without a trailing `__N` or `.N` counter (`level1/matmul__2.py` ->
`level1/matmul`); a name matches a task whose full name or last path component equals it. Rows
are handed out per task in file order (folders: natural sort order), each once, across all
chains; `Exhausted` when none are left.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from kernelrl.candidate import extract_code
from kernelrl.proposers.base import (
    Exhausted,
    Proposal,
    ProposalRequest,
    Proposer,
    ProposerError,
)
from kernelrl.tasks.task import natural_key


@dataclass(frozen=True, kw_only=True)
class ReplayRow:
    task: str
    answer: str
    code: str | None
    origin: str  # "file.jsonl:LINE" or the .py path
    prompt_tokens: int = 0
    completion_tokens: int = 0


_TASK_HEADER = re.compile(r"^\s*#\s*task:\s*(\S+)\s*$", re.MULTILINE)
_COUNTER_SUFFIX = re.compile(r"(__\d+|\.\d+)$")


def read_replay(path: str | Path) -> list[ReplayRow]:
    """Rows of a replay JSONL file or folder of .py files (see the module docstring for naming)."""
    path = Path(path)
    if path.is_dir():
        return _read_replay_dir(path)
    if path.is_file():
        return _read_replay_jsonl(path)
    raise ProposerError(f"replay: no such file or folder {path}")


def _read_replay_jsonl(path: Path) -> list[ReplayRow]:
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ProposerError(f"replay: {path}:{n} is not JSON ({e.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("task"), str):
            raise ProposerError(f"replay: {path}:{n} needs a string field `task`")
        code, answer = row.get("code"), row.get("answer")
        if not isinstance(code, str) and not isinstance(answer, str):
            raise ProposerError(f"replay: {path}:{n} needs a string field `code` or `answer`")
        if not isinstance(answer, str):
            assert isinstance(code, str)
            answer = f"```python\n{code.rstrip()}\n```\n"
        if not isinstance(code, str):
            code = extract_code(answer)
        rows.append(ReplayRow(task=row["task"], answer=answer, code=code, origin=f"{path}:{n}",
                              prompt_tokens=int(row.get("prompt_tokens") or 0),
                              completion_tokens=int(row.get("completion_tokens") or 0)))
    return rows


def _read_replay_dir(root: Path) -> list[ReplayRow]:
    rows = []
    for path in sorted(root.rglob("*.py"), key=lambda p: natural_key(str(p.relative_to(root)))):
        source = path.read_text(errors="replace")
        head = "\n".join(source.splitlines()[:10])
        m = _TASK_HEADER.search(head)
        if m:
            task = m.group(1)
        else:
            task = _COUNTER_SUFFIX.sub("", path.relative_to(root).with_suffix("").as_posix())
        rows.append(ReplayRow(task=task, answer=f"```python\n{source.rstrip()}\n```\n", code=source,
                              origin=str(path)))
    return rows


def _matches(row_task: str, task_name: str) -> bool:
    return row_task == task_name or row_task == task_name.rsplit("/", 1)[-1]


class ReplayProposer(Proposer):
    """Hands out stored programs for a task in order; raises `Exhausted` when none are left."""

    def __init__(self, path: str | Path) -> None:
        self.spec = f"replay:{path}"
        self.rows = read_replay(path)
        self._next: dict[str, int] = {}
        self._lock = threading.Lock()

    @property
    def task_names(self) -> list[str]:
        return list(dict.fromkeys(r.task for r in self.rows))

    def _rows_for(self, task_name: str) -> list[ReplayRow]:
        return [r for r in self.rows if _matches(r.task, task_name)]

    def remaining(self, task_name: str) -> int:
        with self._lock:
            return len(self._rows_for(task_name)) - self._next.get(task_name, 0)

    def propose(self, request: ProposalRequest) -> Proposal:
        name = request.task.name
        with self._lock:
            rows = self._rows_for(name)
            i = self._next.get(name, 0)
            if i >= len(rows):
                raise Exhausted(f"replay: no more programs for task {name} ({len(rows)} given)")
            self._next[name] = i + 1
        row = rows[i]
        return Proposal(answer=row.answer, code=row.code, prompt_tokens=row.prompt_tokens,
                        completion_tokens=row.completion_tokens, meta={"origin": row.origin, "index": i})
