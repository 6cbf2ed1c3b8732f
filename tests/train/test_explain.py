"""`kernelrl reward`: completions scored through training's own scorer and shaper, every step said;
bad input is one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernelrl.candidate import source_hash
from kernelrl.cli import main
from kernelrl.judge.eval_config import EvalConfig
from kernelrl.result import EvalResult, Status
from kernelrl.reward import RewardConfig, RewardModel
from kernelrl.store import Database
from kernelrl.store.records import NewCandidate, RunMeta, RunStage
from kernelrl.tasks.task import Task
from kernelrl.train.explain import ExplainError, explain, prompted, run_windows
from kernelrl.train.rollouts import EvalSettings
from train_fixtures import ScriptedBackend

TASK = Task(name="toy/relu", source="import torch\n\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
                                     "        return torch.relu(x)\n", level=1)
OTHER = Task(name="toy/other", source="class Model: pass\n", level=1)

SHOWN = """import torch


class ModelNew(torch.nn.Module):
    def forward(self, x):
        y = torch.relu(x)
        for _ in range(8):
            y = torch.relu(x)
        return y  # SPEED
"""
NEAR = SHOWN.replace("(self, x)", "(self, inp)").replace("relu(x)", "relu(inp)").replace("        return",
                                                                                         "        pass\n        return")
BETTER = SHOWN.replace("range(8)", "range(1)")


def judge(task: Task, source: str) -> EvalResult:
    """Programs by their loop count: 8 repeats 0.5x, 1 repeat 2x (5 % intervals)."""
    speed = 2.0 if "range(1)" in source else 0.5
    return EvalResult(task=task.name, status=Status.CORRECT, speedup=speed, speedup_ci=(speed * 0.95, speed * 1.05))


def seeded(path: Path) -> int:
    with Database(path) as db:
        for t in (TASK, OTHER):
            db.upsert_task(name=t.name, source=t.source, identity_hash=t.identity_hash, level=1, size="small")
        rec = db.add_candidate(NewCandidate(task=TASK.name, hash=source_hash(SHOWN), source=SHOWN, parents=(),
                                            chain=0, step=0, proposer="seed", prompt="", answer=SHOWN, prompt_tokens=0,
                                            completion_tokens=0, run_id=None, meta=RunMeta()))
        db.store_result(rec.id, judge(TASK, SHOWN))
        return rec.id


def test_a_near_copy_is_paid_at_most_no_speedup_and_an_honest_improvement_its_speedup(tmp_path: Path):
    shown = seeded(tmp_path / "run.db")
    model = RewardModel(RewardConfig(correct_bonus=0.3))
    with Database(tmp_path / "run.db", readonly=True) as db:
        at = prompted(db, task=None, shown=[shown], prompt_row=None)
        items = explain(db, at, [("near", f"```python\n{NEAR}```"), ("better", f"```python\n{BETTER}```"),
                                 ("none", "no code here")],
                        judge=ScriptedBackend(judge), reward=model, settings=EvalSettings.of(EvalConfig()),
                        windows=run_windows(db, at.task, 64))
    near, better, none = items
    assert near.copy is not None and near.copy.version == shown and near.value == pytest.approx(0.3 - 0.6931, abs=1e-3)
    assert better.copy is None and better.value == pytest.approx(0.3 + 0.6931, abs=1e-3)
    assert none.result is None and none.value == pytest.approx(model.config.penalties.no_code)
    assert [e.to_dict()["copy"] is not None for e in items] == [True, False, False]


def test_the_command_says_copy_of_version_n_and_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]):
    import kernelrl.backends.judges as judges

    monkeypatch.setattr(judges, "make_judge", lambda *a, **k: ScriptedBackend(judge))
    shown = seeded(tmp_path / "run.db")
    (tmp_path / "near.py").write_text(NEAR)
    (tmp_path / "better.md").write_text(f"Fewer repeats.\n\n```python\n{BETTER}```\n")
    assert main(["reward", "--db", str(tmp_path / "run.db"), "--shown", str(shown), str(tmp_path / "near.py"),
                 str(tmp_path / "better.md")]) == 0
    out = capsys.readouterr().out
    assert f"copy of version {shown}" in out and "not a copy of any shown version" in out
    assert out.count("  paid ") == 2
    assert main(["reward", "--db", str(tmp_path / "run.db"), "--shown", str(shown), "--json",
                 str(tmp_path / "near.py")]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["copy"]["version"] == shown and row["value"] <= row["raw"] and row["status"] == "correct"


def test_a_prompt_row_brings_its_task_and_shown_versions(tmp_path: Path):
    shown = seeded(tmp_path / "run.db")
    with Database(tmp_path / "run.db") as db:
        row = db.add_candidate(NewCandidate(task=TASK.name, hash=source_hash(BETTER), source=BETTER, parents=(shown,),
                                            chain=0, step=3, proposer="grpo", prompt="the prompt", answer=BETTER,
                                            prompt_tokens=0, completion_tokens=0, run_id=None,
                                            meta=RunMeta(stage=RunStage.GRPO, step=3, shown=(shown,), raw=1.0)))
        at = prompted(db, task=None, shown=None, prompt_row=row.id)
    assert at.task.name == TASK.name and at.shown == (shown,) and at.prompt == "the prompt"


@pytest.mark.parametrize(("args", "says"), [
    (["--shown", "999"], "no candidate 999"),
    (["--shown", "1", "--task", "toy/other"], "versions of 'toy/relu', not of 'toy/other'"),
    (["--prompt-row", "999"], "no candidate 999"),
    ([], "--shown ID"),
    (["--shown", "1,x"], "candidate ids, comma-separated"),
    (["--shown", "1", "--prompt-row", "1"], "one of the two"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                          says: str, monkeypatch: pytest.MonkeyPatch):
    import kernelrl.cli.options as options

    monkeypatch.setattr(options, "load_one_task", lambda spec: OTHER if spec == "toy/other" else TASK)
    seeded(tmp_path / "run.db")
    (tmp_path / "a.py").write_text(NEAR)
    monkeypatch.setattr("kernelrl.cli.train.load_one_task", options.load_one_task)
    assert main(["reward", "--db", str(tmp_path / "run.db"), *args, str(tmp_path / "a.py")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err


def test_a_database_that_does_not_hold_the_task_is_refused(tmp_path: Path):
    seeded(tmp_path / "run.db")
    elsewhere = Task(name="toy/relu", source="class Model: pass  # another version\n", level=1)
    with Database(tmp_path / "run.db", readonly=True) as db, pytest.raises(ExplainError, match="another version"):
        explain(db, prompted(db, task=elsewhere, shown=[1], prompt_row=None), [("a", "x")],
                judge=ScriptedBackend(judge), reward=RewardModel(), settings=EvalSettings.of(EvalConfig()))
    assert main(["reward", "--db", str(tmp_path / "missing.db"), "--shown", "1", str(tmp_path / "run.db")]) == 2
