"""Training-set export: the code database as JSONL, one row per evaluated candidate.

Each row is `{"task", "prompt", "answer", "code", "result"}`: the prompt the model saw, its raw
answer, the code extracted from it, and the full `EvalResult` dict. Guarantees: rows come in
candidate order; only evaluated candidates are written (a proposal without a verdict is no
training signal); `only_correct` keeps rows whose status is `correct`. Does not deduplicate: the
same code proposed twice is two rows, since the prompts differ. A file written here is created
with mode 0600 (an existing one keeps its mode).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TextIO

from kernelrl.result import Status
from kernelrl.store import Database
from kernelrl.store.records import CandidateRecord, CandidateState


def export_jsonl(db_path: str | Path, out: str | Path | TextIO, *, only_correct: bool = False) -> int:
    """Write the rows to `out` (a path, "-" for stdout, or an open text stream); return the count."""
    with Database(db_path, readonly=True) as db:
        records = db.candidates(state=CandidateState.EVALUATED)
    if isinstance(out, (str, Path)) and str(out) != "-":
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        # prompts, answers and code: the file is its owner's alone (0600), however the umask is set
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as f:
            return _write(records, f, only_correct)
    return _write(records, sys.stdout if isinstance(out, (str, Path)) else out, only_correct)


def _write(records: list[CandidateRecord], f: TextIO, only_correct: bool) -> int:
    n = 0
    for rec in records:
        if rec.result is None or (only_correct and rec.result.status is not Status.CORRECT):
            continue
        row = {"task": rec.task, "prompt": rec.prompt, "answer": rec.answer, "code": rec.source,
               "result": rec.result.to_dict()}
        f.write(json.dumps(row, default=str) + "\n")
        n += 1
    return n
