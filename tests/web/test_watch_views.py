"""What the run page computes: progress and ETA, and the training view of a GRPO run."""

from __future__ import annotations

from pathlib import Path

import pytest

import kernelrl.store.candidates as database  # stamps candidates and verdicts (its `time`)
from kernelrl.result import EvalResult, Status
from kernelrl.store import Database, NewCandidate, RunStatus
from kernelrl.store.records import RunMeta, RunStage
from kernelrl.store.snapshot import snapshot
from kernelrl.store.steps import StepRecord
from kernelrl.web import views
from watch_fixtures import add, correct, incorrect, start_run


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_progress_and_eta_from_the_recent_rate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(1000.0)
    monkeypatch.setattr(database.time, "time", clock)
    path = tmp_path / "k.db"
    with Database(path) as db:
        run = start_run(db, ["a", "b", "c"], budget=4)  # 12 candidates in all
        for i in range(6):  # one every 10 s
            clock.t = 1000.0 + 10.0 * (i + 1)
            add(db, run, "abc"[i % 3], f"p{i}", correct("abc"[i % 3], 1.1) if i % 2 else incorrect("abc"[i % 3]))
    with snapshot(path) as snap:
        prog = views.run_view(snap, run, now=1065.0).progress
    assert (prog.done, prog.total, prog.unit) == (6, 12, "candidates")
    assert prog.rate_per_s == pytest.approx(0.1)
    assert prog.eta_s == pytest.approx(60.0)  # 6 left at 0.1 per second
    assert prog.elapsed_s == pytest.approx(65.0) and prog.idle_s == pytest.approx(5.0)
    with Database(path) as db:
        db.finish_run(run, RunStatus.INTERRUPTED)
    with snapshot(path) as snap:
        prog = views.run_view(snap, run, now=5000.0).progress
    assert prog.eta_s is None and prog.idle_s is None  # a stopped run has no ETA


def test_a_task_with_no_candidate_counts_against_fast_p(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    with Database(path) as db:
        run = start_run(db, ["a", "b"])
        add(db, run, "a", "x", correct("a", 2.0))
    with snapshot(path) as snap:
        view = views.run_view(snap, run, now=0.0)
    assert [t.task for t in view.tasks] == ["a", "b"] and dict(view.fast_p)[1.0] == 0.5


def _grpo_run(path: Path) -> int:
    """A GRPO run: 2 steps of 3 rollouts, as kernelrl.train.reward_fn stores them, and a step log."""
    with Database(path) as db:
        for name, level in (("t1", 1), ("t2", 2)):
            db.upsert_task(name=name, source="# ref", identity_hash=name, level=level, size="small")
        run = db.start_run({"stage": "grpo", "config": {"tasks": ["t1", "t2"], "grpo": {"trl": {"max_steps": 4}}}})
        rollouts = [  # step, speedup (None: incorrect), raw, clipped value, kept, clipped
            (0, 2.0, 0.7, 0.5, True, True), (0, None, -0.5, -0.5, True, False), (0, 0.8, -0.1, -0.1, False, False),
            (1, 1.5, 0.4, 0.4, True, False), (1, 3.0, 1.1, 0.6, True, True), (1, None, -0.5, -0.5, True, False)]
        for i, (step, speed, raw, value, kept, clipped) in enumerate(rollouts):
            rec = db.add_candidate(NewCandidate(task="t1", hash=f"h{i}", source=f"s{i}", run_id=run, step=step,
                                                proposer="grpo", meta=RunMeta(stage=RunStage.GRPO, step=step, kept=kept,
                                                                          raw=raw, reward=value, clipped=clipped)))
            result = (EvalResult(task="t1", status=Status.CORRECT, speedup=speed) if speed is not None
                      else EvalResult(task="t1", status=Status.INCORRECT, message="wrong"))
            db.store_result(rec.id, result)
    with Database(path) as db:
        for step, weights in ((1, {"t1": 3.0, "t2": 0.0}), (2, {"t1": 1.0, "t2": 1.0})):
            db.log_step(StepRecord(run_id=run, step=step, logged=2000.0 + step, metrics={"loss": 0.1 * step},
                                   weights=weights, open_levels=(1,) if step == 1 else (1, 2)))
    return run


def test_training_view_per_step(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    run = _grpo_run(path)
    with snapshot(path) as snap:
        view = views.run_view(snap, run, now=3000.0)
    assert view.run.kind == "grpo" and view.training is not None
    s0, s1 = view.training.steps
    assert (s0.step, s0.rollouts, s0.clipped) == (0, 3, 1)
    assert s0.raw_reward == pytest.approx((0.7 - 0.5 - 0.1) / 3)
    assert s0.clipped_reward == pytest.approx((0.5 - 0.5) / 2)  # the dropped rollout was not given to TRL
    assert s0.correct_share == pytest.approx(2 / 3) and s0.fast_1_share == pytest.approx(1 / 3)
    assert s1.fast_1_share == pytest.approx(2 / 3)
    assert [r.weights for r in view.training.logged] == [{"t1": 3.0, "t2": 0.0}, {"t1": 1.0, "t2": 1.0}]
    assert (view.progress.unit, view.progress.done, view.progress.total) == ("steps", 2, 4)
    assert [t.task for t in view.tasks] == ["t1", "t2"]


def test_training_charts(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from kernelrl.web.app import create_app

    path = tmp_path / "k.db"
    run = _grpo_run(path)
    display = TestClient(create_app(path)).get(f"/api/runs/{run}").json()["display"]
    charts = display["charts"]
    # steps counted from 1 everywhere (rollouts at TRL's global step k are step k + 1, as the trainer's log counts)
    assert charts["reward"]["x"] == [1.0, 2.0] and [s["label"] for s in charts["reward"]["series"]] == ["raw",
                                                                                                       "clipped"]
    assert charts["reward"]["series"][1].get("dash") is True and charts["reward"]["xlabel"] == "training step"
    assert [s["label"] for s in charts["correct"]["series"]] == ["correct", "fast_1"]
    shares = {s["label"]: s["values"] for s in charts["curriculum"]["series"]}
    assert shares == {"t1": [1.0, 0.5], "t2": [0.0, 0.5]}
    assert charts["trainer"]["series"][0] == {"label": "loss", "values": [pytest.approx(0.1), pytest.approx(0.2)]}
    assert display["tables"]["steps"]["rows"][0][:3] == ["1", "3", "0.033"]


def test_the_judges_throughput_counts_its_own_verdicts_and_each_groups_phases_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kernelrl.result import Environment, GroupPhases
    from kernelrl.web.app import create_app

    clock = Clock(1000.0)
    monkeypatch.setattr(database.time, "time", clock)
    path = tmp_path / "k.db"
    phases = {"g1": GroupPhases(reference_load_s=2.0, candidate_checks_s=6.0, timing_s=4.0),
              "g2": GroupPhases(reference_load_s=1.0, candidate_checks_s=3.0, timing_s=2.0)}
    with Database(path) as db:
        run = start_run(db, ["a"], budget=8)
        ids = []
        for i, group in enumerate(["g1", "g1", "g2"]):  # three verdicts of two groups, one every 20 s
            clock.t = 1000.0 + 20.0 * (i + 1)
            result = EvalResult(task="a", status=Status.INCORRECT, message="wrong",
                                environment=Environment(group=group, phases=phases[group]))
            ids.append(add(db, run, "a", f"p{i}", result))
        # a verdict reused from another candidate was not judged in this run
        rec = db.add_candidate(NewCandidate(task="a", hash="p0", source="p0", run_id=run, proposer="x"))
        db.store_reused_result(rec.id, ids[0], EvalResult(task="a", status=Status.INCORRECT, message="wrong",
                                                           environment=Environment(group="g1", phases=phases["g1"])))
    with snapshot(path) as snap:
        judge = views.run_view(snap, run, now=1100.0).judge
    assert judge is not None and (judge.evaluations, judge.groups) == (3, 2)
    assert judge.per_hour == pytest.approx(3 / 60 * 3600)  # three verdicts in the 60 s since the run started
    assert judge.phases.reference_load_s == 3.0 and judge.phases.candidate_checks_s == 9.0
    from fastapi.testclient import TestClient

    display = TestClient(create_app(path)).get(f"/api/runs/{run}").json()["display"]
    assert display["texts"]["judge_rate"].startswith("180 evaluations an hour")
    assert display["tables"]["judge"]["rows"][0] == ["reference_load", "3.0", "17%"]
