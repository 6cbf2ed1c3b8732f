"""`optimize --turns T`: each chain refines its own answers in episodes, every turn shown the
earlier turns' verdicts; the report says what each turn added."""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from judge_fixtures import OneAtATime
from kernelrl.candidate import Candidate
from kernelrl.cli import main
from kernelrl.episodes.episode import EpisodeConfig
from kernelrl.report.report import build_report
from kernelrl.result import EvalResult, Status, TimingStats
from kernelrl.search.loop import SearchConfig
from kernelrl.store import Database
from kernelrl.tasks.task import Task
from run_fixtures import searched

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TASK = Task(name="t", source="import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
                              "        return x + 1\ndef get_inputs():\n    return [torch.ones(8)]\n"
                              "def get_init_inputs():\n    return []\n")


@dataclass
class Answer:
    answer: str
    code: str | None
    prompt_tokens: int = 10
    completion_tokens: int = 20
    meta: dict[str, Any] = field(default_factory=dict)


class Script:
    """Answers in the order asked: a program that does not build, then faster ones."""

    def __init__(self, codes: list[str]) -> None:
        self.codes = codes
        self.prompts: list[str] = []
        self.lock = threading.Lock()

    def propose(self, req: Any) -> Answer:
        with self.lock:
            self.prompts.append(req.prompt)
            code = self.codes[len(self.prompts) - 1]
        return Answer(answer=f"```python\n{code}\n```", code=code)

    def close(self) -> None:
        pass


def judge(task: Task, cand: Candidate) -> EvalResult:
    if "BROKEN" in cand.source:
        return EvalResult(task=task.name, status=Status.COMPILE_ERROR, candidate_hash=cand.hash,
                          message="candidate does not build: main.cpp:3:7: error: 'flaot' was not declared",
                          errors=["main.cpp:3:7: error: 'flaot' was not declared in this scope"])
    speed = float(re.search(r"SPEED = (\S+)", cand.source).group(1))
    if speed < 0:
        return EvalResult(task=task.name, status=Status.INCORRECT, candidate_hash=cand.hash,
                          message="incorrect on input set 1 (scaled x1.30 and shifted +0.10 mean-abs): output: 8 of 8 "
                                  "values outside tolerance (max abs err 1, atol 0.0001, rtol 0.0001)")
    t = TimingStats(median_ms=1 / speed, mean_ms=1 / speed, min_ms=1 / speed, iqr_ms=0.0, n=3)
    return EvalResult(task=task.name, status=Status.CORRECT, speedup=speed, speedup_ci=(speed * 0.99, speed * 1.01),
                      cand_time=t, candidate_hash=cand.hash)


def prompt(task: Task, **_: Any) -> str:
    return f"improve {task.name}\n"


def program(tag: str) -> str:
    return f"# {tag}\nclass ModelNew:\n    pass\n"


def test_each_turn_is_shown_the_previous_turns_verdict_and_refines_it(tmp_path: Path) -> None:
    codes = [program("BROKEN 1"), program("SPEED = 2.0"), program("SPEED = -1"), program("SPEED = 3.0")]
    script = Script(codes)
    cfg = SearchConfig(tasks=("t",), db_path=tmp_path / "k.db", proposer="scripted", budget=4, chains=1,
                       episode=EpisodeConfig(turns=2), baselines=False)
    searched(cfg, tasks=[TASK], proposer=script, judge=OneAtATime(judge), build_prompt=prompt)
    first, second, third, fourth = script.prompts
    assert first == "improve t\n" and "Turn" not in first
    assert "'flaot' was not declared in this scope" in second and "## Turn 2 of 2" in second
    assert "BROKEN 1" in second  # the answer it refines
    assert "### Turn" not in third  # a fresh episode
    assert "values outside tolerance" in fourth and "Fix the computation" in fourth
    with Database(cfg.db_path, readonly=True) as db:
        cands = sorted(db.candidates(task="t"), key=lambda c: c.id)
    assert [(c.meta.episode, c.meta.turn) for c in cands] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert cands[1].parents == (cands[0].id,) and cands[3].parents == (cands[2].id,)
    turns = build_report(cfg.db_path).by_turn
    assert [(t.turn, t.candidates, t.correct) for t in turns] == [(1, 2, 0), (2, 2, 2)]
    assert [t.raised for t in turns] == [0, 2] and turns[1].best_speedup == 3.0


def test_single_turn_runs_record_no_turns(tmp_path: Path) -> None:
    script = Script([program("SPEED = 2.0"), program("SPEED = 3.0")])
    cfg = SearchConfig(tasks=("t",), db_path=tmp_path / "k.db", proposer="scripted", budget=2, chains=1,
                       baselines=False)
    searched(cfg, tasks=[TASK], proposer=script, judge=OneAtATime(judge), build_prompt=prompt)
    assert all("Turn" not in p for p in script.prompts)
    assert build_report(cfg.db_path).by_turn == ()


def test_optimize_turns_with_a_replay_proposer_prints_the_by_turn_table(tmp_path: Path, capsys,
                                                                          quick_config) -> None:
    task = FIXTURES / "tasks" / "elementwise_silu.py"
    silu = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return {}\n"
    rows = [{"task": "elementwise_silu", "code": silu.format("x * torch.sigmoid(x) +")},  # does not parse
            {"task": "elementwise_silu", "code": silu.format("x * torch.sigmoid(x) + 1")},  # incorrect
            {"task": "elementwise_silu", "code": silu.format("torch.nn.functional.silu(x)")}]  # correct
    replay = tmp_path / "answers.jsonl"
    replay.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code = main(["optimize", "--tasks", str(task), "--proposer", f"replay:{replay}", "--budget", "3", "--chains", "1",
                 "--turns", "3", "--db", str(tmp_path / "r.db"), "--no-baselines", "--timing-cap", "1",
                 "--cache-dir", str(quick_config.cache_dir)])
    out = capsys.readouterr().out
    assert code == 0
    assert "by refinement turn" in out
    turns = build_report(tmp_path / "r.db").by_turn
    assert [(t.turn, t.correct) for t in turns] == [(1, 0), (2, 0), (3, 1)]
