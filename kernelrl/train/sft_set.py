"""The SFT set: accepted answers as rows (task, prompt, answer, verdict, speedup, proposer).

Written by `kernelrl collect` and by rejection-sampling rounds, read by the SFT stage. On disk it
is a JSONL file (one row per line, the format people read and edit) and, next to it, the same
rows as a `datasets.Dataset` saved with `save_to_disk` (`<file without .jsonl>.dataset/`).

Guarantees: `write_sft_set` replaces both atomically enough that a crash leaves either the old
or the new JSONL (written to a temporary file, then renamed); `read_sft_set` refuses a row
without a task, prompt or answer, naming the line.

Does not decide which answers are accepted: the evaluator's verdict does, in the callers.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from datasets import Features

    from kernelrl.jsontypes import JSONObject


class SFTSetError(ValueError):
    """An SFT set file is missing or malformed; the message names the file and line."""


@dataclass(frozen=True, kw_only=True)
class SFTRow:
    task: str
    prompt: str
    answer: str
    verdict: str  # the evaluator's status (always "correct" for accepted rows)
    speedup: float | None  # against eager, as measured
    proposer: str
    candidate_id: int | None = None  # its row in the code database

    def to_dict(self) -> JSONObject:
        return asdict(self)


def dataset_dir(path: str | Path) -> Path:
    path = Path(path)
    return path.with_name(path.name.removesuffix(".jsonl") + ".dataset")


def write_sft_set(path: str | Path, rows: Sequence[SFTRow], *, dataset: bool = True) -> Path:
    """Rows as JSONL at `path` and (with `dataset`) as a `datasets.Dataset` next to it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w") as f:
        for row in rows:
            f.write(json.dumps(row.to_dict()) + "\n")
    tmp.replace(path)
    if dataset:
        from datasets import Dataset

        target = dataset_dir(path)
        staging = target.with_name(target.name + ".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        Dataset.from_list([r.to_dict() for r in rows] or [], features=_features()).save_to_disk(str(staging))
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    return path


def _features() -> Features:
    from datasets import Features, Value

    return Features({"task": Value("string"), "prompt": Value("string"), "answer": Value("string"),
                     "verdict": Value("string"), "speedup": Value("float64"), "proposer": Value("string"),
                     "candidate_id": Value("int64")})


def read_sft_set(path: str | Path) -> list[SFTRow]:
    path = Path(path)
    if not path.is_file():
        raise SFTSetError(f"no SFT set at {path} (write one with `kernelrl collect --out {path}`)")
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            raise SFTSetError(f"{path}:{n}: not JSON ({e.msg})") from None
        missing = [k for k in ("task", "prompt", "answer") if not isinstance(d.get(k), str) or not d[k]]
        if missing:
            raise SFTSetError(f"{path}:{n}: needs string field(s) {', '.join(missing)}")
        speedup = d.get("speedup")
        rows.append(SFTRow(task=d["task"], prompt=d["prompt"], answer=d["answer"], verdict=str(d.get("verdict", "")),
                           speedup=float(speedup) if speedup is not None else None,
                           proposer=str(d.get("proposer", "")), candidate_id=d.get("candidate_id")))
    return rows


def unique_rows(rows: Iterable[SFTRow]) -> list[SFTRow]:
    """One row per (task, prompt, answer), first kept: the same program after another prompt is
    another row (collect pairs each kept answer with several prompts)."""
    seen: set[tuple[str, str, str]] = set()
    out = []
    for r in rows:
        if (r.task, r.prompt, r.answer) not in seen:
            seen.add((r.task, r.prompt, r.answer))
            out.append(r)
    return out
