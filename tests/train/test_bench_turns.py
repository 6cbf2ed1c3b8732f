"""`kernelrl bench --turns T`: pass@k and fast_p@k by turn (best so far), T turns against T
samples, the plot; turn t's prompt holds the earlier verdicts; the single-turn bench unchanged."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

import pytest

from judge_fixtures import QUICK_TIMING
from kernelrl.candidate import Candidate
from kernelrl.cli import main
from kernelrl.episodes.episode import EpisodeConfig
from kernelrl.result import EvalResult, Status
from kernelrl.tasks.task import Task
from kernelrl.train.bench import BenchConfig, run_bench
from kernelrl.train.bench_turns import best_so_far, run_turn_bench, summarise_turns
from kernelrl.train.rollouts import Judged, Rollout
from openai_server import MODEL, Reply

COMPILER_LINE = "main.cpp:4:9: error: 'fused_relu' was not declared in this scope"


def judged(status: Status, speedup: float | None = None, task: str = "a") -> Judged:
    return Judged(rollout=Rollout(task=task, prompt="p", answer="a"), code="x",
                  result=EvalResult(task=task, status=status, speedup=speedup))


def test_by_turn_is_the_best_so_far_and_the_equal_budget_by_hand() -> None:
    tasks = [Task(name="a", source="")]
    per_sample = {("a", 0): [judged(Status.INCORRECT), judged(Status.CORRECT, 1.5), judged(Status.INCORRECT)],
                  ("a", 1): [judged(Status.COMPILE_ERROR), judged(Status.COMPILE_ERROR), judged(Status.CORRECT, 2.5)]}
    config = BenchConfig(tasks=("a",), proposer="x", k=2, ps=(2.0,), episode=EpisodeConfig(turns=3))
    report = summarise_turns(config, tasks, per_sample, {})
    assert [r.pass_at[1] for r in report.by_turn] == pytest.approx([0.0, 0.5, 1.0])
    assert [r.pass_at[2] for r in report.by_turn] == pytest.approx([0.0, 1.0, 1.0])
    # sample 0's turn 3 broke its kernel: the best so far keeps turn 2's 1.5x; at turn 3 itself 1 of 2 is correct
    assert [r.fast_at[2.0][1] for r in report.by_turn] == pytest.approx([0.0, 0.0, 0.5])
    assert report.correct_at_turn == pytest.approx((0.0, 0.5, 0.5))
    assert report.by_turn[2].tasks[0].best_speedup == 2.5
    assert [(b.calls, b.serial_pass, b.parallel_pass) for b in report.budget] == [(1, 0.0, 0.0), (2, 0.5, 0.0),
                                                                                 (3, 1.0, None)]
    assert report.to_dict()["result_at_turn"] == "best so far"


def test_best_so_far_prefers_the_fastest_correct_then_the_latest() -> None:
    turns = [judged(Status.CORRECT, 1.2), judged(Status.CORRECT, 1.8), judged(Status.RUNTIME_ERROR)]
    assert best_so_far(turns) is turns[1]
    failures = [judged(Status.COMPILE_ERROR), judged(Status.INCORRECT)]
    assert best_so_far(failures) is failures[1]
    untimed = [judged(Status.CORRECT, None), judged(Status.CORRECT, 0.5)]
    assert best_so_far(untimed) is untimed[1]


class ScriptedJudge:
    """Verdicts from markers in the code: BUILD_FAILS does not build, WRONG is incorrect, FAST<n> is
    correct at n x, anything else correct at 1.1x."""

    def __init__(self) -> None:
        self.batches: list[int] = []

    def evaluate_batch(self, items: Sequence[tuple[Task, Candidate]], **_: Any) -> list[EvalResult]:
        self.batches.append(len(items))
        out = []
        for task, cand in items:
            src = cand.source
            if "BUILD_FAILS" in src:
                out.append(EvalResult(task=task.name, status=Status.COMPILE_ERROR, message="candidate does not build",
                                      errors=[COMPILER_LINE]))
            elif "WRONG" in src:
                out.append(EvalResult(task=task.name, status=Status.INCORRECT, message="output 0 differs"))
            else:
                fast = [float(w[4:]) for w in src.split() if w.startswith("FAST")]
                out.append(EvalResult(task=task.name, status=Status.CORRECT, speedup=fast[0] if fast else 1.1))
        return out

    def profile(self, task: Task) -> None:
        return None


def program(marker: str) -> str:
    return f"```python\nimport torch\nclass ModelNew(torch.nn.Module):\n    pass  # {marker}\n```\n"


def test_turn_two_of_a_scripted_model_sees_turn_ones_compiler_error(openai_server, tiny_task) -> None:
    from kernelrl.proposers import make_proposer

    openai_server.add(Reply.ok(program("BUILD_FAILS")), Reply.ok(program("FAST2.0")))
    proposer = make_proposer(f"openai:{MODEL}", base_url=openai_server.base_url, api_key="test-key")
    config = BenchConfig(tasks=(tiny_task.name,), proposer="scripted", k=1, ps=(1.5,), episode=EpisodeConfig(turns=2),
                         split="all", compile_baseline=False)
    judge = ScriptedJudge()
    try:
        report = run_turn_bench(config, proposer=proposer, backend=judge, tasks=[tiny_task])
    finally:
        proposer.close()
    first, second = openai_server.prompts()
    assert COMPILER_LINE not in first and COMPILER_LINE in second and "BUILD_FAILS" in second
    assert second.startswith(first.rstrip("\n"))  # turn 2 = the same base prompt + the history
    assert judge.batches == [1, 1]  # one batch per turn
    assert [r.pass_at[1] for r in report.by_turn] == [0.0, 1.0]
    assert [r.fast_at[1.5][1] for r in report.by_turn] == [0.0, 1.0]


def test_kernelrl_bench_turns_prints_the_by_turn_table(tmp_path, tiny_task, cache_dir, capsys, monkeypatch) -> None:
    """A replay file through the real evaluator: two samples, three turns."""
    monkeypatch.setenv("KERNELRL_CACHE", str(cache_dir))
    right = tiny_task.source.replace("class Model(", "class ModelNew(")
    wrong = right.replace("* 2.0", "* 3.0")
    # rows are handed out turn by turn: turn 1 of samples 0 and 1, then turn 2, then turn 3
    rows = [wrong, wrong.replace("* 3.0", "* 4.0"),  # turn 1: both wrong
            right, "no code in this answer",  # turn 2: sample 0 right; sample 1 answers without code
            wrong, right + "\n# again\n"]  # turn 3: sample 0 breaks it (its best stays), sample 1 right
    replay = tmp_path / "replay.jsonl"
    replay.write_text("\n".join(json.dumps({"task": tiny_task.name, "code": c} if "ModelNew" in c else
                                           {"task": tiny_task.name, "answer": c}) for c in rows) + "\n")
    plot, db = tmp_path / "turns.png", tmp_path / "bench.db"
    args = ["bench", "--proposer", f"replay:{replay}", "--tasks", str(tiny_task.path), "--k", "2", "--turns", "3",
            "--fast", "0", "--no-compile", "--model-concurrency", "1", "--db", str(db), *QUICK_TIMING]
    assert main([*args, "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "by turn: each sample's best of its first t turns" in out and "equal budget" in out
    by_turn, budget = out.split("by turn: each sample's best of its first t turns")[1].split("equal budget")

    def rows(text: str) -> dict[str, list[str]]:
        return {cells[0]: cells[1:] for line in text.splitlines() if line.startswith("│")
                for cells in [[c.strip() for c in line.strip("│").split("│")]]}

    # turn: pass@1, pass@2, fast_0@1, fast_0@2, correct at the turn itself (then the geomean)
    assert {t: r[:5] for t, r in rows(by_turn).items()} == {"1": ["0%", "0%", "0%", "0%", "0%"],
                                                           "2": ["50%", "100%", "50%", "100%", "50%"],
                                                           "3": ["100%", "100%", "100%", "100%", "50%"]}
    # t: one sample refined t turns against t single-turn samples (pass, then fast_0); t = 3 needs k >= 3
    assert rows(budget) == {"1": ["0%", "0%", "0%", "0%"], "2": ["50%", "0%", "50%", "0%"],
                            "3": ["100%", "-", "100%", "-"]}
    assert "ask --k 3 or more" in out
    assert plot.is_file() and plot.stat().st_size > 1000
    with sqlite3.connect(db) as conn:
        stored = conn.execute("SELECT prompt, meta FROM candidates ORDER BY id").fetchall()
        runs = conn.execute("SELECT id, status, json_extract(config, '$.stage') FROM runs").fetchall()
        under = conn.execute("SELECT DISTINCT run_id FROM candidates").fetchall()
    assert runs == [(1, "finished", "bench")] and under == [(1,)]  # a run the run page shows
    metas = [json.loads(m) for _, m in stored]
    assert [(m["turn"], m["sample"]) for m in metas] == [(1, 0), (1, 1), (2, 0), (2, 1), (3, 0), (3, 1)]
    turn2_sample0 = stored[2][0]
    assert "Incorrect:" in turn2_sample0 and "* 3.0" in turn2_sample0  # turn 1's code and its verdict
    assert "no complete fenced code block" in stored[5][0]  # sample 1's turn 3 read its no-code verdict

    capsys.readouterr()
    assert main([*args, "--json"]) == 0  # the verdicts are reused from the database
    report = json.loads(capsys.readouterr().out)
    assert [t["pass_at"]["1"] for t in report["by_turn"]] == [0.0, 0.5, 1.0]
    assert [t["correct_at_turn"] for t in report["by_turn"]] == [0.0, 0.5, 0.5]
    assert [(b["calls"], b["serial_pass"], b["parallel_pass"]) for b in report["equal_budget"]] == [
        (1, 0.0, 0.0), (2, 0.5, 0.0), (3, 1.0, None)]


def test_the_single_turn_bench_refuses_turns_and_bad_settings_are_usage_errors(tiny_task) -> None:
    with pytest.raises(ValueError, match="single-turn"):
        run_bench(BenchConfig(tasks=("x",), proposer="x", episode=EpisodeConfig(turns=2)), tasks=[tiny_task])
    with pytest.raises(ValueError, match="turns"):
        BenchConfig(tasks=("x",), proposer="x", episode=EpisodeConfig(turns=0))
    assert main(["bench", "--proposer", "heuristic", "--turns", "0"]) == 2
