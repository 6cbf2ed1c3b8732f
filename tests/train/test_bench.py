"""`kernelrl bench`: pass@k, fast_p@k and speedups for a replay file and for the tiny model."""

from __future__ import annotations

import json
import re

import pytest

from judge_fixtures import QUICK_TIMING
from kernelrl.cli import main
from kernelrl.result import EvalResult, Status
from kernelrl.tasks.task import Task
from kernelrl.train.bench import BenchConfig, summarise
from kernelrl.train.rollouts import Judged, Rollout
from kernelrl.train.tiny import build_tiny_model


def judged(task: str, status: Status, speedup: float | None = None) -> Judged:
    r = Rollout(task=task, prompt="p", answer="a")
    return Judged(rollout=r, code="x", result=EvalResult(task=task, status=status, speedup=speedup))


def test_metrics_by_hand():
    tasks = [Task(name="a", source=""), Task(name="b", source="")]
    per_task = {"a": [judged("a", Status.CORRECT, 2.0), judged("a", Status.INCORRECT)],
                "b": [judged("b", Status.CORRECT, 0.5)]}  # one sample short: it counts as a failure
    report = summarise(BenchConfig(tasks=("a", "b"), proposer="x", k=2, ps=(1.0,)), tasks, per_task,
                       {"a": 4.0, "b": None})
    assert report.pass_at == {1: pytest.approx(0.5), 2: pytest.approx(1.0)}
    assert report.fast_at[1.0] == {1: pytest.approx(0.25), 2: pytest.approx(0.5)}
    assert report.geomean_eager == pytest.approx(1.0) and report.median_eager == pytest.approx(1.25)
    assert report.geomean_compile == pytest.approx(0.5) and report.missing_samples == 1
    assert report.solved == 2 and report.statuses == {"correct": 2, "incorrect": 1}


def test_bench_a_replay_file(tmp_path, tiny_task, cache_dir, capsys, monkeypatch):
    monkeypatch.setenv("KERNELRL_CACHE", str(cache_dir))
    right = tiny_task.source.replace("class Model(", "class ModelNew(")
    replay = tmp_path / "replay.jsonl"
    replay.write_text("\n".join(json.dumps({"task": tiny_task.name, "code": c})
                                for c in (right.replace("* 2.0", "* 3.0"), right)) + "\n")
    plot = tmp_path / "bench.png"
    args = ["bench", "--proposer", f"replay:{replay}", "--tasks", str(tiny_task.path), "--k", "2", "--fast", "0",
            "1000", "--no-compile", *QUICK_TIMING]
    assert main([*args, "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "pass@k, fast_p@k" in out
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:4]] for line in out.splitlines()
            if line.startswith("│") and line.split("│")[1].strip() in ("pass", "fast_0", "fast_1000")}
    # one of two samples is correct: pass@1 = 1/2, pass@2 = 1; nothing is 1000x faster
    assert rows == {"pass": ["50%", "100%"], "fast_0": ["50%", "100%"], "fast_1000": ["0%", "0%"]}
    # the judge's throughput over what this bench judged, and where its one timing group's time went
    judge = next(line for line in out.splitlines() if line.startswith("judge: "))
    # (a group that waited for its place says so first: `queued`)
    assert judge.startswith("judge: 2 evaluations in ")
    assert re.search(r" an hour; 1 groups: (queued [\d.]+ \(\d+%\), )?reference_load ", judge), judge
    assert plot.is_file() and plot.stat().st_size > 1000
    assert main([*args, "--json"]) == 0  # the verdicts are cached: no second evaluation
    report = json.loads(capsys.readouterr().out)
    assert report["pass_at"] == {"1": 0.5, "2": 1.0} and report["statuses"] == {"incorrect": 1, "correct": 1}
    assert report["geomean_compile"] is None
    assert report["throughput"]["evaluations"] == 2 and report["throughput"]["groups"] == 1


def test_bench_the_tiny_model(tmp_path, tiny_task, cache_dir, capsys, monkeypatch):
    monkeypatch.setenv("KERNELRL_CACHE", str(cache_dir))
    model = build_tiny_model(tmp_path / "tiny", [tiny_task])
    assert main(["bench", "--proposer", f"hf:{model} max_new_tokens=16 temperature=1.0", "--tasks",
                 str(tiny_task.path), "--k", "2", "--no-compile"]) == 0
    out = capsys.readouterr().out
    assert f"bench of hf:{model}: 1 tasks, k = 2 samples each" in out
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:4]] for line in out.splitlines()
            if line.startswith("│") and line.split("│")[1].strip() in ("pass", "fast_1", "fast_1.5", "fast_2")}
    assert set(rows) == {"pass", "fast_1", "fast_1.5", "fast_2"}
    assert all(v.endswith("%") for cells in rows.values() for v in cells)
    assert "verdicts: " in out


class _Judge:
    """Every answer correct at 2x, or every batch a failure."""

    def __init__(self, fails: bool = False) -> None:
        self.fails = fails

    def profile(self, task):
        return None

    def evaluate_batch(self, items):
        if self.fails:
            raise RuntimeError("the judge broke")
        return [EvalResult(task=t.name, status=Status.CORRECT, speedup=2.0) for t, _ in items]


def test_a_bench_with_a_database_is_a_run_of_it_closed_as_it_ended(tmp_path, tiny_task):
    from kernelrl.proposers.replay import ReplayProposer
    from kernelrl.store import Database
    from kernelrl.train.bench import run_bench

    right = tiny_task.source.replace("class Model(", "class ModelNew(")
    replay = tmp_path / "replay.jsonl"
    replay.write_text(json.dumps({"task": tiny_task.name, "code": right}) + "\n")
    config = BenchConfig(tasks=(str(tiny_task.path),), proposer=f"replay:{replay}", split="all", k=1,
                         compile_baseline=False, db_path=tmp_path / "b.db", proposer_opts={"api_key": "secret"})
    report = run_bench(config, proposer=ReplayProposer(replay), backend=_Judge(), tasks=[tiny_task])
    assert report.solved == 1
    other = tmp_path / "other.jsonl"  # a source not judged before (a judged one is taken from the database)
    other.write_text(json.dumps({"task": tiny_task.name, "code": right + "\n# again\n"}) + "\n")
    with pytest.raises(RuntimeError, match="the judge broke"):
        run_bench(config, proposer=ReplayProposer(other), backend=_Judge(fails=True), tasks=[tiny_task])
    with Database(config.db_path) as db:
        runs = db.runs()
        first = db.candidates(run_id=runs[0].id)
    assert [(r.config["stage"], r.status.value) for r in runs] == [("bench", "finished"), ("bench", "failed")]
    assert runs[0].config["task_names"] == [tiny_task.name] and runs[0].config["proposer"] == f"bench:replay:{replay}"
    assert runs[0].config["config"]["proposer_opts"] == ["api_key"]  # the option's name, not its value
    assert len(first) == 1 and first[0].speedup == 2.0
