"""The TRL reward function: one batch call, the mapping, RoC, the clip logged raw and clipped, the
database written back, the curriculum told."""

from __future__ import annotations

import math
import statistics

import pytest
from rich.console import Console

from kernelrl.judge.eval_config import EvalConfig
from kernelrl.reward import Penalties, RewardConfig, RewardModel, SmoothingConfig
from kernelrl.run_parts import Reporter
from kernelrl.store import Database
from kernelrl.tasks.task import Task
from kernelrl.train.curriculum import Curriculum
from kernelrl.train.reward_fn import KernelRewardFunction, RewardShaping
from kernelrl.train.roc import RoCConfig
from kernelrl.train.rollouts import EvalSettings
from train_fixtures import ScriptedBackend, answer, run_parts

TASK = Task(name="toy/relu", source="class Model: pass\n", level=1)
NO_SMOOTHING = RewardConfig(smoothing=SmoothingConfig(enabled=False))


def call(fn, answers, *, prompt="make it faster", **kw):
    return fn(prompts=[prompt] * len(answers), completions=answers, task=[TASK.name] * len(answers), **kw)


def test_one_batch_call_and_the_mapping_of_every_outcome():
    backend = ScriptedBackend()
    fn = KernelRewardFunction(run_parts([TASK], backend), shaping=RewardShaping(reward=RewardModel(NO_SMOOTHING)))
    assert fn.__name__ == "kernelrl_reward"
    values = call(fn, [answer("fast2.0"), answer("wrong"), answer("hack"), "no code at all", answer("taskerror"),
                       answer("broken")])
    assert len(backend.calls) == 1 and len(backend.calls[0]) == 5  # the code-less answer is not judged
    p = Penalties()
    assert values == [pytest.approx(math.log(2.0)), p.incorrect, p.flagged, p.no_code, None, p.compile_error]


def test_chat_message_completions_and_token_counts():
    backend = ScriptedBackend()
    cfg = RewardConfig(length_weight=0.1, length_soft_tokens=10, length_max_tokens=20,
                       smoothing=SmoothingConfig(enabled=False))
    fn = KernelRewardFunction(run_parts([TASK], backend), shaping=RewardShaping(reward=RewardModel(cfg)))
    completions = [[{"role": "assistant", "content": answer("fast1.0")}]] * 2
    values = fn(prompts=[[{"role": "user", "content": "p"}]] * 2, completions=completions, task=[TASK.name] * 2,
                completion_ids=[[0] * 5, [0] * 15])
    assert values == [pytest.approx(0.0), pytest.approx(-0.05)]  # the second is half-way into the length penalty


def test_a_reward_ten_sigma_above_the_window_is_logged_raw_and_clipped(capsys):
    smoothing = SmoothingConfig(window=16, k=1.5, min_samples=8)
    model = RewardModel(RewardConfig(mapping="speedup", smoothing=smoothing))
    fn = KernelRewardFunction(run_parts([TASK], ScriptedBackend(), reporter=Reporter(Console(width=200))),
                              shaping=RewardShaping(reward=model))
    history = [1.0, 1.2, 0.8, 1.1, 0.9, 1.0, 1.05, 0.95]
    call(fn, [answer(f"fast{s}") for s in history])
    mean, sigma = statistics.fmean(history), statistics.pstdev(history)
    outlier = mean + 10 * sigma
    values = call(fn, [answer(f"fast{outlier}")])
    assert values == [pytest.approx(mean + 1.5 * sigma)]
    last = fn.logs[-1].rollouts[0]
    assert last.raw == pytest.approx(outlier) and last.clipped and last.value == pytest.approx(mean + 1.5 * sigma)
    out = capsys.readouterr().out
    assert f"{outlier:+.3f}->{mean + 1.5 * sigma:+.3f}" in out and "1 clipped" in out


def test_metrics_and_completion_columns_reach_trl():
    metrics, extra = {}, {}
    fn = KernelRewardFunction(run_parts([TASK], ScriptedBackend()), shaping=RewardShaping(reward=RewardModel(NO_SMOOTHING)))
    call(fn, [answer("fast1.5"), answer("wrong")], log_metric=lambda k, v: metrics.setdefault(k, v),
         log_extra=lambda k, v: extra.setdefault(k, v))
    assert metrics["kernelrl/correct_share"] == 0.5
    assert metrics["kernelrl/raw_reward"] == pytest.approx((math.log(1.5) + Penalties().incorrect) / 2)
    assert extra["verdict"] == ["correct", "incorrect"] and extra["raw_reward"][1] == Penalties().incorrect


def test_every_code_and_verdict_goes_to_the_database_and_is_reused(tmp_path):
    backend = ScriptedBackend()
    settings = EvalSettings.of(EvalConfig())
    with Database(tmp_path / "code.db") as db:
        db.upsert_task(name=TASK.name, source=TASK.source, identity_hash=TASK.identity_hash, level=1, size="small")
        fn = KernelRewardFunction(run_parts([TASK], backend, db=db),
                                  shaping=RewardShaping(reward=RewardModel(NO_SMOOTHING)), reuse=settings)
        state = type("State", (), {"global_step": 7})()
        call(fn, [answer("fast3.0"), "prose only", answer("hack")], trainer_state=state, parents=[[], [], []])
        rows = db.candidates()
        assert [r.status.value for r in rows] == ["correct", "no_code", "flagged"]  # "prose only": no code
        assert rows[0].meta.stage == "grpo" and rows[0].step == 7 and rows[0].meta.raw == pytest.approx(
            math.log(3.0))
        assert rows[1].source == "" and rows[1].answer == "prose only"
        assert db.recent_refused(TASK.name, 5)[0].id == rows[2].id  # later prompts show the refused hack
        assert db.top_candidates(TASK.name, 1)[0].id == rows[0].id  # and the best code
        call(fn, [answer("fast3.0")])  # same source again: the stored verdict, no second evaluation
        assert len(backend.calls) == 1 and fn.logs[-1].rollouts[0].reused


def test_roc_keeps_the_share_and_drops_with_none_and_the_curriculum_hears_each_group():
    tasks = [TASK, Task(name="toy/other", source="class Model: pass\n", level=2)]
    curriculum = Curriculum(tasks)
    shaping = RewardShaping(reward=RewardModel(NO_SMOOTHING), roc=RoCConfig(enabled=True, keep=0.5, min_per_side=1))
    fn = KernelRewardFunction(run_parts(tasks, ScriptedBackend()), shaping=shaping, curriculum=curriculum)
    unclean = answer("fast2.0") + "\nAlso:\n```python\nprint(1)\n```\n"  # the fastest, with an extra block
    group = [unclean, answer("fast1.5"), answer("wrong"), answer("broken"),
             answer("fast1.2"), answer("wrong", prose="y"), answer("broken", prose="z"), answer("fast1.1")]
    values = call(fn, group)
    kept = [i for i, v in enumerate(values) if v is not None]
    # 4 of 8 train; positives are half the group, so 2 of them: the cleanest, then the best
    assert len(kept) == 4 and [i for i in kept if i in (0, 1, 4, 7)] == [1, 4]
    assert all(values[i] is None for i in range(8) if i not in kept)
    assert curriculum.state()["solved"] == [TASK.name]
    # a flat group with nothing correct makes the task come back sooner
    call(fn, [answer("wrong")] * 4)
    assert curriculum.weight(TASK.name) > 1


def test_state_round_trips_for_checkpoints():
    model = RewardModel(RewardConfig(mapping="speedup", smoothing=SmoothingConfig(window=8, min_samples=2)))
    fn = KernelRewardFunction(run_parts([TASK], ScriptedBackend()), shaping=RewardShaping(reward=model),
                              curriculum=Curriculum([TASK]))
    call(fn, [answer("fast1.0"), answer("fast1.2")])
    saved = fn.state()
    other = KernelRewardFunction(run_parts([TASK], ScriptedBackend()),
                                 shaping=RewardShaping(reward=RewardModel(model.config)), curriculum=Curriculum([TASK]))
    other.load_state(saved)
    assert other.reward.window(TASK.name) == model.window(TASK.name)
    assert other.curriculum.state() == fn.curriculum.state()


def test_compile_baseline_is_measured_once_per_task():
    class WithBaseline(ScriptedBackend):
        measured = 0

        def baseline(self, task):
            WithBaseline.measured += 1
            return type("B", (), {"compile_speedup": 2.0, "eager_ms": 2.0, "compile_ms": 1.0, "device": "cpu",
                                  "size": "small"})()

    cfg = RewardConfig(baseline="compile", mapping="speedup", smoothing=SmoothingConfig(enabled=False))
    fn = KernelRewardFunction(run_parts([TASK], WithBaseline()), shaping=RewardShaping(reward=RewardModel(cfg)))
    assert call(fn, [answer("fast3.0"), answer("fast4.0")]) == [1.5, 2.0]
    assert WithBaseline.measured == 1


def test_unknown_task_names_are_a_clear_error():
    fn = KernelRewardFunction(run_parts([TASK], ScriptedBackend()))
    with pytest.raises(KeyError, match="nope"):
        fn(prompts=["p"], completions=["c"], task=["nope"])


@pytest.mark.parametrize("seed", range(6))
def test_shuffling_a_group_changes_no_reward(seed):
    """Through the trainer's reward function with the 7B reward config and a window already full:
    a group's rollouts in any order get the same rewards, and the correct ones are paid in the
    order of their speedups (one call clipped one result at a time used to pay 4x below 1.5x)."""
    import random

    from kernelrl.train.recipe import load_train_config

    group = [answer("fast4.0"), answer("fast2.0"), answer("fast1.5"), answer("fast1.05"), answer("wrong"),
             "no code", answer("hack"), answer("broken")]
    order = list(range(len(group)))
    random.Random(seed).shuffle(order)

    def paid(answers):
        fn = KernelRewardFunction(run_parts([TASK], ScriptedBackend()),
                                  shaping=RewardShaping(reward=RewardModel(load_train_config("qwen7b-lora-1gpu").reward)))
        call(fn, [answer(f"fast{s}") for s in (1.0, 1.1, 1.2, 1.3, 1.0, 1.1, 1.2, 1.3)])  # the window
        return call(fn, answers)

    straight, shuffled = paid(group), paid([group[i] for i in order])
    assert shuffled == [straight[i] for i in order]
    correct = straight[:4]
    assert correct == sorted(correct, reverse=True) and min(correct) > max(straight[4:])


def shown_version(db, source: str, speedup: float) -> int:
    """A version an earlier step stored, judged correct at `speedup` (a 5 % interval)."""
    from kernelrl.candidate import source_hash
    from kernelrl.result import EvalResult, Status
    from kernelrl.store.records import NewCandidate, RunMeta

    rec = db.add_candidate(NewCandidate(task=TASK.name, hash=source_hash(source), source=source, parents=(), chain=0,
                                        step=0, proposer="seed", prompt="", answer=source, prompt_tokens=0,
                                        completion_tokens=0, run_id=None, meta=RunMeta()))
    db.store_result(rec.id, EvalResult(task=TASK.name, status=Status.CORRECT, speedup=speedup,
                                       speedup_ci=(speedup * 0.95, speedup * 1.05)))
    return rec.id


KERNEL = """import torch


class ModelNew(torch.nn.Module):
    def forward(self, x):
        y = torch.relu(x) * 2.0
        return y + 1.0  # MARKER
"""


def judge_kernels(task, source):
    """The shown kernel and its near-copies at the speed their MARKER comment names (3x without
    one); other programs by `judge_by_marker`."""
    from kernelrl.result import EvalResult, Status
    from train_fixtures import judge_by_marker

    if "# MARKER" not in source:
        return judge_by_marker(task, source)
    speed = float(source.split("# MARKER", 1)[1].split("\n")[0].strip() or 3.0)
    return EvalResult(task=task.name, status=Status.CORRECT, speedup=speed, speedup_ci=(speed * 0.95, speed * 1.05))


def fenced(source: str) -> str:
    return f"```python\n{source}```\n"


def test_a_copy_of_a_version_the_prompt_showed_is_paid_at_most_as_no_speedup(tmp_path):
    """The versions a prompt showed come by id from the database, in full. A verbatim copy (its
    stored 3x reused) and a near-copy (renamed, a dead statement; judged at 3.05x, within noise) are
    paid as no speedup; a near-copy measured at 0.5x is paid its 0.5x; a near-copy measured at 6x
    (faster beyond noise) and a different program are paid what they measured."""
    settings = EvalSettings.of(EvalConfig())
    near = KERNEL.replace("x)", "inp)").replace("y", "out").replace("        return", "        pass\n        return")
    with Database(tmp_path / "code.db") as db:
        db.upsert_task(name=TASK.name, source=TASK.source, identity_hash=TASK.identity_hash, level=1, size="small")
        best = shown_version(db, KERNEL, 3.0)
        fn = KernelRewardFunction(run_parts([TASK], ScriptedBackend(judge_kernels), db=db),
                                  shaping=RewardShaping(reward=RewardModel(NO_SMOOTHING)), reuse=settings)
        answers = [fenced(KERNEL), fenced(near.replace("# MARKER", "# MARKER 3.05")),
                   fenced(near.replace("# MARKER", "# MARKER 0.5")), fenced(near.replace("# MARKER", "# MARKER 6.0")),
                   answer("fast2.0")]
        values = call(fn, answers, prompt="Improve on version A.", shown=[[best]] * len(answers))
        assert values == [pytest.approx(0.0), pytest.approx(0.0), pytest.approx(math.log(0.5)),
                          pytest.approx(math.log(6.0)), pytest.approx(math.log(2.0))]
        logs = fn.logs[-1].rollouts
        assert [r.copy for r in logs] == [True, True, True, False, False]
        assert [r.copy_of for r in logs] == [best, best, best, None, None]
        stored = [c for c in db.candidates() if c.proposer != "seed"]
        assert [c.meta.copy for c in stored] == [True, True, True, False, False]
        assert all(c.meta.shown == (best,) for c in stored) and stored[0].meta.copy_of == best
        assert fn.logs[-1].metrics["kernelrl/copy_share"] == pytest.approx(3 / 5)


def test_a_prompt_without_ids_is_matched_to_the_database_by_the_versions_it_shows(tmp_path):
    """A prompt row stored before ids were recorded: its blocks are found among the task's versions."""
    settings = EvalSettings.of(EvalConfig())
    with Database(tmp_path / "code.db") as db:
        db.upsert_task(name=TASK.name, source=TASK.source, identity_hash=TASK.identity_hash, level=1, size="small")
        best = shown_version(db, KERNEL, 3.0)
        fn = KernelRewardFunction(run_parts([TASK], ScriptedBackend(judge_kernels), db=db),
                                  shaping=RewardShaping(reward=RewardModel(NO_SMOOTHING)), reuse=settings)
        prompt = f"Version A (3.00x):\n{fenced(KERNEL)}Write a faster one."
        values = call(fn, [fenced(KERNEL.replace("# MARKER", "# MARKER 3.1"))], prompt=prompt)
        assert values == [pytest.approx(0.0)] and fn.logs[-1].rollouts[0].copy_of == best


def test_the_same_program_twice_in_a_batch_is_judged_once_and_paid_alike():
    """Two measurements of identical code differ by noise; identical programs are paid identically."""
    from kernelrl.result import EvalResult, Status

    speeds = iter([2.0, 2.6, 3.1])

    def drifting(task, source):
        return EvalResult(task=task.name, status=Status.CORRECT, speedup=next(speeds))

    backend = ScriptedBackend(drifting)
    fn = KernelRewardFunction(run_parts([TASK], backend), shaping=RewardShaping(reward=RewardModel(NO_SMOOTHING)))
    values = call(fn, [answer("same"), answer("other"), answer("same")])
    assert len(backend.calls[0]) == 2 and values[0] == values[2] == pytest.approx(math.log(2.0))
    assert fn.logs[-1].evaluated == 2
