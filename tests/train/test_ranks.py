"""Rank consistency. The mechanism (ranks as threads, TRL's slicing of a generation batch done by
hand): one prompt stream decided by the main process, every group scored against its own task,
the clip windows, RoC and the curriculum the same on every rank; and what happens without. Then
(slow) the real thing: two processes under accelerate train tiny-cpu for two steps and resume."""

from __future__ import annotations

import itertools
import math
import re

import pytest

from kernelrl.result import EvalResult, Status
from kernelrl.reward import RewardConfig, RewardModel, SmoothingConfig
from kernelrl.store import Database
from kernelrl.tasks.task import Task
from kernelrl.train.curriculum import Curriculum, CurriculumConfig
from kernelrl.train.ranks import SingleProcess, current_ranks
from kernelrl.train.reward_fn import KernelRewardFunction, RewardShaping, TaskMismatch
from kernelrl.train.roc import RoCConfig
from kernelrl.train.stream import PromptContent, PromptForm, PromptStream, row_key
from train_fixtures import ScriptedBackend, answer, launch_stage, run_parts, run_ranks

TASKS = [Task(name=f"toy/t{i}", source=f"class Model: pass  # {i}\n", level=1) for i in range(4)]
GROUP = 4  # num_generations
PER_RANK = 2  # per_device_train_batch_size: every group spans both ranks
MARKERS = ["fast2.0", "wrong", "fast1.5", "broken"]


def rank_step(ranks, stream: PromptStream, fn: KernelRewardFunction, step: int):
    """What TRL does on one rank for one generation batch: read the whole stream's batch, repeat
    each row GROUP times, keep this rank's contiguous slice, then call the reward function."""
    unique = ranks.count * PER_RANK // GROUP
    rows = [row for row in itertools.islice(stream_rows(stream), unique) for _ in range(GROUP)]
    mine = rows[ranks.index * PER_RANK:(ranks.index + 1) * PER_RANK]
    completions = [answer(MARKERS[(step + ranks.index * PER_RANK + i) % len(MARKERS)]) for i in range(len(mine))]
    state = type("State", (), {"global_step": step})()
    return fn(prompts=[r["prompt"] for r in mine], completions=completions, task=[r["task"] for r in mine],
              key=[r["key"] for r in mine], trainer_state=state)


def stream_rows(stream: PromptStream):
    if not hasattr(stream, "_it"):
        stream._it = stream.rows()
    return stream._it


def make(ranks, *, shared: bool, seed: int = 0, roc: bool = False):
    curriculum = Curriculum(TASKS, CurriculumConfig(by_level=False), seed=seed)
    run = run_parts(TASKS, ScriptedBackend())
    stream = PromptStream(run, curriculum, form=PromptForm(as_prompt=lambda text: text), content=PromptContent(k=0),
                          seed=seed, ranks=ranks if shared else SingleProcess())
    model = RewardModel(RewardConfig(smoothing=SmoothingConfig(window=8, min_samples=2)))
    shaping = RewardShaping(reward=model, group_size=GROUP, seed=seed, roc=RoCConfig(enabled=roc, keep=0.5, min_per_side=1))
    fn = KernelRewardFunction(run, shaping=shaping, curriculum=curriculum, ranks=ranks)
    return stream, fn


def test_with_a_shared_stream_every_group_is_one_task_on_both_ranks_and_their_state_agrees():
    def body(ranks):
        stream, fn = make(ranks, shared=True)
        values = [rank_step(ranks, stream, fn, step) for step in range(4)]
        return values, [b.groups for b in fn.logs], fn.state(), [[r.task for r in b.rollouts] for b in fn.logs]

    (v0, groups0, state0, tasks0), (v1, groups1, state1, tasks1) = run_ranks(2, body)
    assert groups0 == groups1 and len(groups0) == 4  # both ranks log the same task for every group
    for step in range(4):
        # the group spans both ranks: each holds half of it, of the group's one task
        assert tasks0[step] == tasks1[step] and len(set(tasks0[step])) == 1
        assert groups0[step][0].startswith(tasks0[step][0] + "#")
    assert len({g[0] for g in groups0}) > 1  # the curriculum drew more than one task
    assert state0["reward"] == state1["reward"] and state0["curriculum"]["solved"] == state1["curriculum"]["solved"]
    assert state0["curriculum"]["streak"] == state1["curriculum"]["streak"]
    assert all(len(v) == PER_RANK for v in v0 + v1)


def test_without_a_shared_stream_a_completion_would_be_scored_against_another_task():
    # each rank draws its own tasks (different curricula, as before round 2): the check refuses
    out = run_ranks(2, lambda ranks: [rank_step(ranks, *make(ranks, shared=False, seed=ranks.index), 0)])
    assert all(isinstance(e, TaskMismatch) and "group 0 mixes prompts" in str(e) for e in out), out


def test_roc_selects_whole_groups_across_ranks():
    def body(ranks):
        stream, fn = make(ranks, shared=True, roc=True)
        return [rank_step(ranks, stream, fn, step) for step in range(3)]

    per_rank = run_ranks(2, body)
    for step in range(3):
        kept = sum(v is not None for rank in per_rank for v in rank[step])
        assert kept == GROUP // 2  # keep = 0.5 of the whole group, not of each rank's half


def test_a_row_whose_task_is_not_its_prompts_is_refused():
    stream, fn = make(SingleProcess(), shared=True)
    row = next(stream.rows())
    other = next(t.name for t in TASKS if t.name != row["task"])
    with pytest.raises(TaskMismatch, match="not the task its prompt was built for"):
        fn(prompts=[row["prompt"]], completions=[answer("fast2.0")], task=[other], key=[row["key"]])
    assert row["key"] == row_key(row["task"], row["prompt"])


def test_groups_must_be_whole():
    stream, fn = make(SingleProcess(), shared=True)
    row = next(stream.rows())
    with pytest.raises(TaskMismatch, match="not a whole number of groups"):
        fn(prompts=[row["prompt"]] * 3, completions=[answer("wrong")] * 3, task=[row["task"]] * 3)


def test_one_process_needs_no_launcher():
    ranks = current_ranks()
    assert (ranks.index, ranks.count, ranks.is_main) == (0, 1, True)
    assert ranks.broadcast({"a": 1}) == {"a": 1} and ranks.gather([1, 2]) == [1, 2]


def group_lines(log: str) -> dict[tuple[str, str], str]:
    return {(step, rank): groups for step, rank, groups in re.findall(r"groups step (\d+) rank (\d)/2: (.*)", log)}


@pytest.mark.slow
def test_two_processes_train_two_steps_agree_on_every_group_and_resume_both_ranks(tmp_path, cache_dir):
    run = tmp_path / "run"
    done = launch_stage("grpo", run, cache_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = group_lines(done.stdout)
    assert set(lines) == {(s, r) for s in ("0", "1") for r in ("0", "1")}
    for step in ("0", "1"):  # both ranks log the same task for every group
        assert lines[(step, "0")] == lines[(step, "1")]
    with Database(run / "code.db", readonly=True) as db:
        assert len(db.runs()) == 1  # one run row, whatever the number of processes
        rows = db.candidates()
    assert len(rows) == 12 and {r.meta.rank for r in rows} == {0, 1}
    by_group = {}
    for r in rows:
        by_group.setdefault((r.meta.step, r.meta.group), set()).add(r.task)
    assert all(len(tasks) == 1 for tasks in by_group.values())
    for rank in (0, 1):
        assert (run / "grpo" / "checkpoint-2" / f"kernelrl_state.rank{rank}.json").is_file()

    # resume to a third step, with groups of 4 over 2 rows per process: the group spans both ranks
    done = launch_stage("grpo", run, cache_dir, "--resume", "--grpo.trl", "max_steps=3", "num_generations=4",
                  "per_device_train_batch_size=2")
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 1):
        assert re.search(rf"rank {rank}: kernelrl state restored from \S*checkpoint-2/kernelrl_state\.rank{rank}\.json; "
                         r"identical to the saved state", done.stdout), done.stdout[-3000:]
    lines = group_lines(done.stdout)
    assert set(lines) == {("2", "0"), ("2", "1")} and lines[("2", "0")] == lines[("2", "1")]
    with Database(run / "code.db", readonly=True) as db:
        third = [r for r in db.candidates() if r.meta.step == 2]
    assert len(third) == 4 and {r.meta.rank for r in third} == {0, 1} and len({r.task for r in third}) == 1
    assert {r.meta.group for r in third} == {0}


def test_each_rank_restores_its_own_state_else_rank_0s_else_an_older_single_file(tmp_path):
    from kernelrl.train.grpo import LEGACY_STATE_FILE, _state_text, load_rank_state, state_file

    def fresh():
        stream, fn = make(SingleProcess(), shared=True)
        return fn, stream

    fn, stream = fresh()
    fn.reward.score(EvalResult(task=TASKS[0].name, status=Status.CORRECT, speedup=2.0))
    saved = _state_text(fn, stream, 0)
    (tmp_path / LEGACY_STATE_FILE).write_text(saved)
    fn1, stream1 = fresh()
    assert load_rank_state(tmp_path, 1, fn1, stream1) == tmp_path / LEGACY_STATE_FILE
    assert fn1.reward.window(TASKS[0].name) == fn.reward.window(TASKS[0].name) != []
    state_file(tmp_path, 0).write_text(saved)
    assert load_rank_state(tmp_path, 1, *fresh()) == state_file(tmp_path, 0)
    state_file(tmp_path, 1).write_text(saved)
    assert load_rank_state(tmp_path, 1, *fresh()) == state_file(tmp_path, 1)


def test_the_same_program_judged_on_two_ranks_is_paid_by_its_first_verdict_on_both():
    """Each rank judges its own rows: two measurements of one program differ by noise (here rank 0's
    judge says 2.0x, rank 1's 2.5x). The group's identical programs are paid identically, by the
    verdict of the first in the global batch, and that verdict is what each rank keeps."""

    def body(ranks):
        stream, fn = make(ranks, shared=True)
        speed = 2.0 + 0.5 * ranks.index
        fn.scorer.backend = ScriptedBackend(lambda task, source: EvalResult(task=task.name, status=Status.CORRECT,
                                                                            speedup=speed))
        row = next(stream_rows(stream))
        values = fn(prompts=[row["prompt"]] * PER_RANK, completions=[answer("same")] * PER_RANK,
                    task=[row["task"]] * PER_RANK, key=[row["key"]] * PER_RANK)
        return values, [r.speedup for r in fn.logs[-1].results]

    (values0, kept0), (values1, kept1) = run_ranks(2, body)
    assert values0 == values1 == [pytest.approx(math.log(2.0))] * PER_RANK
    assert kept0 == kept1 == [2.0] * PER_RANK
