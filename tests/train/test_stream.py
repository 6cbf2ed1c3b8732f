"""The prompt stream's token budget: fewer versions shown when a prompt does not fit, a program
whole or not at all, and a clear error for a task whose prompt alone does not fit."""

from __future__ import annotations

import pytest

from kernelrl.candidate import source_hash
from kernelrl.result import EvalResult, Status
from kernelrl.search.database import Database
from kernelrl.search.records import NewCandidate
from kernelrl.tasks.task import Task
from kernelrl.train.curriculum import Curriculum, CurriculumConfig
from kernelrl.train.stream import PromptBudgetError, PromptStream

TASK = Task(name="toy/relu", source="import torch\n\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
            "        return torch.relu(x)\n", level=1)


def version(i: int, lines: int) -> str:
    body = "".join(f"        y = y + {i} * 0  # step {j}\n" for j in range(lines))
    return (f"import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        y = torch.relu(x)\n"
            f"{body}        return y\n")


def stream_over(db: Database, budget: int | None) -> PromptStream:
    curriculum = Curriculum([TASK], CurriculumConfig(by_level=False), seed=0)
    return PromptStream(curriculum, db, as_prompt=lambda text: text, policy="open", device="cpu", size="small", k=4,
                        seed=0, count_tokens=lambda text: len(text) // 4, max_tokens=budget)


@pytest.fixture
def db(tmp_path):
    with Database(tmp_path / "code.db") as db:
        db.upsert_task(name=TASK.name, source=TASK.source, source_hash=TASK.source_hash, level=1, size="small")
        for i in range(5):
            code = version(i, 60)
            rec = db.add_candidate(NewCandidate(task=TASK.name, hash=source_hash(code), source=code, parents=(),
                                                chain=0, step=0, proposer="seed", prompt="", answer=code,
                                                prompt_tokens=0, completion_tokens=0, run_id=None))
            db.store_result(rec.id, EvalResult(task=TASK.name, status=Status.CORRECT, speedup=1.0 + i / 10))
        yield db


def shown(prompt: str) -> int:
    return sum(f"        y = y + {i} * 0  # step 59\n" in prompt for i in range(5))


def test_a_prompt_over_budget_shows_fewer_whole_versions(db):
    full = stream_over(db, None).row()["prompt"]
    assert shown(full) == 4  # k versions, the best among them
    tokens = len(full) // 4
    trimmed_stream = stream_over(db, tokens - 1)
    row = trimmed_stream.row()
    assert len(row["prompt"]) // 4 <= tokens - 1 and 0 < shown(row["prompt"]) < 4
    assert trimmed_stream.trimmed == 1
    # every version shown is shown whole: its first and last lines both there
    for i in range(5):
        assert (f"y = y + {i} * 0  # step 0\n" in row["prompt"]) == (f"y = y + {i} * 0  # step 59\n" in row["prompt"])


def test_the_best_goes_last_and_a_task_that_cannot_fit_is_named(db):
    alone = stream_over(db, 10**6)
    alone.k = 0
    with_best = alone.row()
    assert shown(with_best["prompt"]) == 1 and with_best["parents"]
    budget = len(with_best["prompt"]) // 4 - 1
    tight = stream_over(db, budget)
    tight.k = 0
    row = tight.row()
    assert shown(row["prompt"]) == 0 and row["parents"] == []
    with pytest.raises(PromptBudgetError, match="toy/relu"):
        stream_over(db, 10).row()  # not even the task alone fits
