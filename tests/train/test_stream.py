"""The prompt stream's token budget: fewer versions shown when a prompt does not fit, a program
whole or not at all, and a clear error for a task whose prompt alone does not fit."""

from __future__ import annotations

import pytest

from kernelrl.candidate import source_hash
from kernelrl.result import EvalResult, Status
from kernelrl.store import Database
from kernelrl.store.records import ContrastDraw, NewCandidate
from kernelrl.tasks.task import Task
from kernelrl.train.curriculum import Curriculum, CurriculumConfig
from kernelrl.train.stream import ContrastConfig, PromptBudgetError, PromptContent, PromptForm, PromptStream
from train_fixtures import run_parts

TASK = Task(name="toy/relu", source="import torch\n\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
            "        return torch.relu(x)\n", level=1)


def version(i: int, lines: int) -> str:
    body = "".join(f"        y = y + {i} * 0  # step {j}\n" for j in range(lines))
    return (f"import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        y = torch.relu(x)\n"
            f"{body}        return y\n")


def stream_over(db: Database, budget: int | None, k: int = 4) -> PromptStream:
    curriculum = Curriculum([TASK], CurriculumConfig(by_level=False), seed=0)
    form = PromptForm(as_prompt=lambda text: text, count_tokens=lambda text: len(text) // 4, max_tokens=budget)
    return PromptStream(run_parts([TASK], db=db), curriculum, form=form, content=PromptContent(k=k), seed=0)


@pytest.fixture
def db(tmp_path):
    with Database(tmp_path / "code.db") as db:
        db.upsert_task(name=TASK.name, source=TASK.source, identity_hash=TASK.identity_hash, level=1, size="small")
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
    alone = stream_over(db, 10**6, k=0)
    with_best = alone.row()
    assert shown(with_best["prompt"]) == 1 and with_best["parents"]
    budget = len(with_best["prompt"]) // 4 - 1
    tight = stream_over(db, budget, k=0)
    row = tight.row()
    assert shown(row["prompt"]) == 0 and row["parents"] == []
    with pytest.raises(PromptBudgetError, match="toy/relu"):
        stream_over(db, 10).row()  # not even the task alone fits


def drawn_stream(db: Database, draw: str, k: int = 2) -> PromptStream:
    curriculum = Curriculum([TASK], CurriculumConfig(by_level=False), seed=0)
    content = PromptContent(k=k, contrast=ContrastConfig(draw=ContrastDraw(draw)))
    return PromptStream(run_parts([TASK], db=db), curriculum, form=PromptForm(as_prompt=lambda text: text), content=content,
                        seed=0)


def test_score_draws_show_the_best_often_not_always_and_mark_the_fastest_drawn(db):
    best = db.top_candidates(TASK.name, 1)[0]
    stream = drawn_stream(db, "score")
    rows = [stream.row() for _ in range(200)]
    with_best = sum(best.id in r["shown"] for r in rows)
    # five versions weighted 1.0 .. 1.4 and two drawn: the best is in about 2/5 + of the sets, never all
    assert 60 < with_best < 140 and stream.best_shown == with_best
    for r in rows:
        assert len(r["shown"]) == 2
        speeds = {c.id: c.speedup for c in db.candidates() if c.id in r["shown"]}
        # the version to improve on (the row's parent) is the fastest one the prompt shows
        assert r["parents"] == [max(speeds, key=lambda i: speeds[i])]
    # `best` shows the best every time
    always = drawn_stream(db, "best")
    assert all(best.id in always.row()["shown"] for _ in range(20)) and always.best_shown == 20


def test_plain_prompts_show_nothing_from_the_database(db):
    from kernelrl.episodes.prompt import first_attempt_prompt

    row = drawn_stream(db, "none", k=4).row()
    assert row["shown"] == [] and row["parents"] == [] and shown(row["prompt"]) == 0
    assert row["prompt"] == first_attempt_prompt(TASK, policy="open", device="cpu", size="small")


def test_a_share_of_prompts_is_the_first_attempt_prompt(db):
    from kernelrl.episodes.prompt import first_attempt_prompt

    curriculum = Curriculum([TASK], CurriculumConfig(by_level=False), seed=0)
    content = PromptContent(k=2, contrast=ContrastConfig(draw=ContrastDraw.SCORE, first_attempt_share=0.3))
    stream = PromptStream(run_parts([TASK], db=db), curriculum, form=PromptForm(as_prompt=lambda text: text),
                          content=content, seed=0)
    rows = [stream.row() for _ in range(300)]
    first = [r for r in rows if not r["shown"]]
    assert 60 < len(first) < 120
    assert all(r["prompt"] == first_attempt_prompt(TASK, policy="open", device="cpu", size="small") for r in first)
    assert all(len(r["shown"]) == 2 for r in rows if r["shown"])
