"""Multi-turn GRPO: refinement episodes through TRL's rollout hook, every turn a sample paid its
discounted return (Kevin's attribution). With TRL's generation scripted (a fake trainer, then the
real GRPOTrainer with its generation patched), ranks as threads, what the stage builds for one
turn and for more; then (slow) the tiny-cpu-multiturn run and two processes under accelerate."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kernelrl.episodes.episode import EpisodeConfig
from kernelrl.result import EvalResult, Status
from kernelrl.reward import Penalties, RewardModel
from kernelrl.run_parts import build_run
from kernelrl.store import Database
from kernelrl.tasks.task import Task
from kernelrl.train.multiturn import EpisodeReturn, MultiTurnRollout
from kernelrl.train.reward_fn import KernelRewardFunction, RewardShaping, TaskMismatch
from kernelrl.train.stream import row_key
from train_fixtures import ScriptedBackend, answer, run_parts

TASK = Task(name="t", source="class Model:\n    pass\n")
PROMPT = "Make t faster."


class Stream:
    def row_of(self, prompt: Any) -> dict[str, Any]:
        assert prompt.startswith(PROMPT)
        return {"task": "t", "parents": [7]}


class FakeTrainer:
    """TRL's generation, scripted: each call hands out the next answers in order."""

    def __init__(self, answers: list[str]) -> None:
        self.answers = answers
        self.prompts: list[list[str]] = []
        self.state = SimpleNamespace(global_step=0)
        self.processing_class = SimpleNamespace(batch_decode=lambda ids, skip_special_tokens: [
            self.answers[i[0]] for i in ids])
        self._next = 0

    def _tokenize_prompts(self, prompts: list[str]) -> tuple[list[list[int]], None, dict[str, Any]]:
        self.prompts.append(list(prompts))
        return [[len(p)] for p in prompts], None, {}

    def _generate_single_turn(self, prompt_ids: list[list[int]], images: Any, fields: Any, n: int
                              ) -> tuple[list[list[int]], None]:
        out = [[self._next + i] for i in range(len(prompt_ids))]
        self._next += len(prompt_ids)
        return out, None


def rollout(answers: list[str], *, turns: int = 2, db: Any = None, curriculum: Any = None
            ) -> tuple[MultiTurnRollout, FakeTrainer, Any]:
    scorer = KernelRewardFunction(run_parts([TASK], ScriptedBackend(), db=db),
                                  shaping=RewardShaping(reward=RewardModel(), group_size=None), curriculum=curriculum)
    return MultiTurnRollout(scorer, Stream(), EpisodeConfig(turns=turns)), FakeTrainer(answers), scorer


def test_turn_two_is_shown_turn_ones_verdict_and_each_turn_is_paid_its_discounted_return(tmp_path: Path):
    # two trajectories of two turns: turn-1 answers (does not build, wrong), then turn-2 answers (2x, 3x)
    answers = [answer("broken"), answer("wrong"), answer("fast2.0"), answer("fast3.0")]
    db = Database(tmp_path / "code.db")
    run, trainer, _ = rollout(answers, db=db)
    out = run([PROMPT] * 4, trainer)
    first, second = trainer.prompts
    assert first == [PROMPT, PROMPT]
    assert all("### Turn 1" in p and "Does not build: does not build" in p for p in second[:1])
    assert "Incorrect: on input set 1 (scaled and shifted): output: 4 of 4 values outside tolerance" in second[1]
    assert "x1.30" not in second[1] and "## Turn 2 of 2" in second[1]
    model = RewardModel()
    from train_fixtures import judge_by_marker

    def raw(marker: str) -> float:
        r = model.raw(judge_by_marker(TASK, answer(marker)))
        assert r is not None
        return r.raw

    expected = [raw("broken") + 0.4 * raw("fast2.0"), raw("fast2.0"), raw("wrong") + 0.4 * raw("fast3.0"),
                raw("fast3.0")]
    assert out["turn_return"] == pytest.approx(expected)
    assert out["turn_return"][0] > raw("broken")  # the failed turn is credited with the fix it led to
    # rows are laid out trajectory by trajectory, each turn with the prompt it was generated from
    assert [c[0] for c in out["completion_ids"]] == [0, 2, 1, 3]
    assert out["prompt_ids"][1] == [len(second[0])] and out["logprobs"] is None
    assert out["turn"] == [1, 2, 1, 2] and out["turn_task"] == ["t"] * 4
    assert out["turn_verdict"] == ["compile_error", "correct", "incorrect", "correct"]
    assert EpisodeReturn()([PROMPT] * 4, ["a"] * 4, task=["t"] * 4, turn_task=out["turn_task"],
                           turn_return=out["turn_return"], key=[row_key("t", PROMPT)] * 4) == out["turn_return"]
    stored = sorted(db.candidates(task="t"), key=lambda c: c.id)
    assert [(c.meta.episode, c.meta.turn) for c in stored] == [(1, 1), (2, 1), (1, 2), (2, 2)]
    assert stored[2].parents == (stored[0].id,) and "### Turn 1" in stored[2].prompt
    assert stored[0].parents == (7,)  # turn 1 builds on what the row's prompt showed, as a single-turn rollout


def test_a_group_that_cannot_be_cut_into_whole_trajectories_is_refused():
    run, trainer, _ = rollout([answer("fast1.0")] * 3)
    with pytest.raises(ValueError, match="multiple of grpo.episode.turns"):
        run([PROMPT] * 3, trainer)


def test_the_stage_refuses_roc_and_groups_that_do_not_divide():
    from kernelrl.train.grpo import GRPOStageConfig
    from kernelrl.train.roc import RoCConfig

    with pytest.raises(ValueError, match="roc must be disabled"):
        GRPOStageConfig(episode=EpisodeConfig(turns=2), roc=RoCConfig(enabled=True), trl={"max_steps": 1})
    with pytest.raises(ValueError, match="multiple of grpo.episode.turns"):
        GRPOStageConfig(episode=EpisodeConfig(turns=2), roc=RoCConfig(enabled=False),
                        trl={"max_steps": 1, "num_generations": 3})


def test_a_row_is_paid_only_against_its_own_task():
    run, trainer, _ = rollout([answer("broken"), answer("fast2.0")])
    out = run([PROMPT] * 2, trainer)
    pay = EpisodeReturn()
    with pytest.raises(TaskMismatch, match="judged against 't'"):  # the rollout judged it against another task
        pay([PROMPT] * 2, ["a"] * 2, task=["t", "other"], turn_task=out["turn_task"], turn_return=out["turn_return"])
    with pytest.raises(TaskMismatch, match="not the task its prompt was built for"):
        pay([PROMPT] * 2, ["a"] * 2, task=["t"] * 2, turn_task=out["turn_task"], turn_return=out["turn_return"],
            key=[row_key("t", PROMPT), row_key("t", "another prompt")])


class Observer:
    def __init__(self) -> None:
        self.seen: list[tuple[str, list[float], bool]] = []

    def observe(self, task: str, values: list[float], *, any_correct: bool) -> None:
        self.seen.append((task, list(values), any_correct))


def test_the_curriculum_hears_once_per_group_the_returns_it_trains_on():
    observer = Observer()
    run, trainer, _ = rollout([answer("broken"), answer("wrong"), answer("fast2.0"), answer("broken")],
                              curriculum=observer)
    out = run([PROMPT] * 4, trainer)
    assert observer.seen == [("t", pytest.approx(out["turn_return"]), True)]  # one group: not once per turn


def test_a_trajectory_never_spans_two_processes():
    from kernelrl.config import ConfigError
    from kernelrl.train.grpo import GRPOStageConfig, check_episode_layout

    with pytest.raises(ValueError, match="trajectory would span two processes"):
        GRPOStageConfig(episode=EpisodeConfig(turns=2), trl={"max_steps": 1, "num_generations": 4,
                                                              "per_device_train_batch_size": 3})
    check_episode_layout(2, 8, 2)
    with pytest.raises(ConfigError, match="whole trajectories"):
        check_episode_layout(2, 6, 2)  # 3 rows a process


def test_ranks_agree_on_every_turn_and_number_episodes_apart():
    """Two ranks, one group of 4 rows (2 trajectories of 2 turns) split between them: the main
    process's prompt on both, each turn judged and clipped in one order, one curriculum
    observation per group on each rank, episode numbers that do not collide."""
    from kernelrl.reward import RewardConfig, SmoothingConfig
    from kernelrl.train.curriculum import Curriculum, CurriculumConfig
    from kernelrl.train.stream import PromptContent, PromptForm, PromptStream
    from train_fixtures import run_ranks

    tasks = [Task(name=f"toy/t{i}", source=f"class Model: pass  # {i}\n", level=1) for i in range(3)]

    def body(ranks: Any) -> Any:
        curriculum = Curriculum(tasks, CurriculumConfig(by_level=False), seed=0)
        parts = run_parts(tasks, ScriptedBackend())
        stream = PromptStream(parts, curriculum, form=PromptForm(as_prompt=lambda text: text),
                              content=PromptContent(k=0), seed=0, ranks=ranks)
        model = RewardModel(RewardConfig(smoothing=SmoothingConfig(window=8, min_samples=2)))
        scorer = KernelRewardFunction(parts, shaping=RewardShaping(reward=model, group_size=2), curriculum=curriculum,
                                      ranks=ranks)
        run = MultiTurnRollout(scorer, stream, EpisodeConfig(turns=2))
        rows = stream.rows()
        returns = []
        for step in range(2):
            row = next(rows)
            mine = [row["prompt"]] * 2  # this rank's half of the group of 4
            markers = (["broken", "fast2.0"], ["wrong", "fast1.5"])[ranks.index]
            trainer = FakeTrainer([answer(m) for m in markers])
            trainer.state.global_step = step
            out = run(mine, trainer)
            returns.append(out["turn_return"])
            assert EpisodeReturn(run)([row["prompt"]] * 2, ["a"] * 2, task=[row["task"]] * 2,
                                      turn_task=out["turn_task"], turn_return=out["turn_return"],
                                      key=[row["key"]] * 2) == out["turn_return"]
        return {"returns": returns, "episodes": run.episodes, "reward": model.state(),
                "curriculum": curriculum.state(), "metrics": run.metrics, "calls": scorer.totals.calls}

    first, second = run_ranks(2, body)
    assert not isinstance(first, BaseException), first
    assert not isinstance(second, BaseException), second
    assert first["reward"] == second["reward"]
    heard = ("open", "solved", "streak")  # what the observations decide (only the main process draws)
    assert {k: first["curriculum"][k] for k in heard} == {k: second["curriculum"][k] for k in heard}
    assert first["curriculum"]["solved"]  # both steps' groups were observed, on both ranks
    assert first["metrics"] == second["metrics"] and "kernelrl/turn2/correct_share" in first["metrics"]
    assert first["episodes"] == second["episodes"] == 4 and first["calls"] == 4  # two turns a step, two steps
    assert first["returns"] != second["returns"]  # each rank pays its own trajectory


def test_a_rank_with_another_prompt_stops_the_step():
    """Without the shared stream, a group would hold two prompts: refused on every rank, never scored."""
    from train_fixtures import run_ranks

    def body(ranks: Any) -> Any:
        prompt = f"{PROMPT} (rank {ranks.index})"
        stream = SimpleNamespace(row_of=lambda p: {"task": "t"})
        scorer = KernelRewardFunction(run_parts([TASK], ScriptedBackend()), shaping=RewardShaping(group_size=2),
                                      ranks=ranks)
        return MultiTurnRollout(scorer, stream, EpisodeConfig(turns=2))([prompt] * 2, FakeTrainer(
            [answer("broken"), answer("fast2.0")]))

    results = run_ranks(2, body)
    assert all(isinstance(r, TaskMismatch) and "mixes prompts" in str(r) for r in results), results


def program_judge(task: Task, source: str) -> EvalResult:
    """The tiny model's programs: the one that does not parse, and the reference wrapped (correct at 1.25x)."""
    if "def forward(self, x:" in source:
        return EvalResult(task=task.name, status=Status.COMPILE_ERROR, message="does not parse")
    return EvalResult(task=task.name, status=Status.CORRECT, speedup=1.25, speedup_ci=(1.2, 1.3), message="correct")


def test_through_trl_a_failed_turn_then_a_correct_one_is_paid_as_the_docstring_says(tmp_path: Path, tiny_task: Task,
                                                                                  monkeypatch: pytest.MonkeyPatch):
    """TRL's GRPOTrainer end to end on a tiny model, its generation scripted: every turn 1 writes a
    program that does not build, every turn 2 the correct one. multiturn's docstring: turn 1's
    return is r_1 + gamma * r_2, turn 2's r_2; TRL trains on them centred per turn index."""
    import json

    from transformers import AutoTokenizer
    from trl.trainer.grpo_trainer import GRPOTrainer

    from kernelrl.judge.eval_config import EvalConfig
    from kernelrl.reward import RewardConfig, SmoothingConfig
    from kernelrl.train.grpo import GRPOStageConfig, train_grpo
    from kernelrl.train.model import ModelConfig
    from kernelrl.train.tiny import build_tiny_model, program_tokens

    base = build_tiny_model(tmp_path / "base", [tiny_task])
    tok = AutoTokenizer.from_pretrained(base)
    programs = {kind: tok.convert_tokens_to_ids(text) for text in program_tokens([tiny_task], 1)
                for kind in ("broken", "correct") if f"{kind} version" in text}
    calls = itertools.count()

    def scripted(self: Any, prompt_ids: list[list[int]], images: Any, fields: Any, n: int) -> tuple[Any, None]:
        kind = "broken" if next(calls) % 2 == 0 else "correct"  # turn 1, then turn 2, per generation batch
        return [[programs[kind], tok.eos_token_id] for _ in prompt_ids], None

    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", scripted)
    paid: list[dict[str, list[Any]]] = []
    original = EpisodeReturn.__call__

    def spy(self: EpisodeReturn, *args: Any, **kw: Any) -> list[float | None]:
        values = original(self, *args, **kw)
        paid.append({"turn": list(kw["turn"]), "value": values, "verdict": list(kw["turn_verdict"]),
                     "return": list(kw["turn_return"])})
        return values

    monkeypatch.setattr(EpisodeReturn, "__call__", spy)
    gamma = 0.4
    stage = GRPOStageConfig(k_shown=1, episode=EpisodeConfig(turns=2, gamma=gamma),
                            trl={"max_steps": 2, "num_generations": 4, "per_device_train_batch_size": 4,
                                 "max_completion_length": 4, "learning_rate": 1e-3, "report_to": "none",
                                 "use_cpu": True, "bf16": False, "save_steps": 2, "logging_steps": 1})
    model = RewardModel(RewardConfig(smoothing=SmoothingConfig(enabled=False)))
    with build_run(tasks=[tiny_task], eval_config=EvalConfig(size="small"), db_path=tmp_path / "code.db",
                   judge=ScriptedBackend(program_judge)) as run:
        result = train_grpo(stage, run=run, model=ModelConfig(path=str(base)), init_from=str(base),
                            output_dir=tmp_path / "grpo", reward=model, eval_settings=None)
    with Database(tmp_path / "code.db") as db:
        stored = db.candidates()
    r_fail = model.raw(program_judge(tiny_task, "def forward(self, x:")).raw  # type: ignore[union-attr]
    r_correct = model.raw(program_judge(tiny_task, "return x")).raw  # type: ignore[union-attr]
    assert r_fail < 0 < r_correct
    assert result.outcome.steps == 2 and len(paid) == 2
    for call in paid:  # one generation batch: two trajectories of two turns
        assert call["turn"] == [1, 2, 1, 2] and call["verdict"] == ["compile_error", "correct"] * 2
        assert call["return"] == pytest.approx([r_fail + gamma * r_correct, r_correct] * 2)
        # TRL is handed each return centred on its turn's mean: two trajectories with the same
        # outcomes, so no credit at all (no turn position is preferred)
        assert call["value"] == pytest.approx([0.0] * 4)
    # every turn stored: turn 2 shown turn 1's verdict, its parent turn 1's candidate
    assert sorted(c.meta.turn for c in stored) == [1] * 4 + [2] * 4
    by_id = {c.id: c for c in stored}
    for c in (c for c in stored if c.meta.turn == 2):
        (parent,) = c.parents
        assert by_id[parent].meta.turn == 1 and by_id[parent].meta.episode == c.meta.episode
        assert "Does not build" in c.prompt and "### Turn 1" in c.prompt
    assert len({c.meta.episode for c in stored}) == 4
    logged = json.loads((tmp_path / "grpo" / "checkpoint-2" / "trainer_state.json").read_text())["log_history"]
    assert logged[0]["kernelrl/turn1/correct_share"] == 0.0 and logged[0]["kernelrl/turn2/correct_share"] == 1.0


@pytest.mark.parametrize("turns", [1, 2])
def test_one_turn_builds_todays_trainer_and_more_add_the_rollout_hook(turns: int, tmp_path: Path, tiny_task: Task,
                                                                      monkeypatch: pytest.MonkeyPatch):
    import kernelrl.train.grpo as grpo_module
    from kernelrl.judge.eval_config import EvalConfig
    from kernelrl.train.grpo import GRPOStageConfig, train_grpo
    from kernelrl.train.model import ModelConfig
    from kernelrl.train.tiny import build_tiny_model

    class Built(Exception):
        pass

    seen: dict[str, Any] = {}

    def capture(*args: Any, **kwargs: Any) -> None:
        seen.update(kwargs)
        raise Built

    monkeypatch.setattr(grpo_module, "grpo_trainer_class", lambda: capture)
    base = build_tiny_model(tmp_path / "base", [tiny_task])
    stage = GRPOStageConfig(episode=EpisodeConfig(turns=turns),
                            trl={"max_steps": 1, "num_generations": 4, "per_device_train_batch_size": 4,
                                 "report_to": "none", "use_cpu": True, "bf16": False})
    with pytest.raises(Built), build_run(tasks=[tiny_task], eval_config=EvalConfig(), db_path=tmp_path / "code.db",
                                         judge=ScriptedBackend()) as run:
        train_grpo(stage, run=run, model=ModelConfig(path=str(base)), init_from=str(base),
                   output_dir=tmp_path / "grpo", reward=RewardModel(), eval_settings=None)
    (fn,) = seen["reward_funcs"]
    if turns == 1:  # today's path: TRL generates, the kernel reward function judges
        assert "rollout_func" not in seen and isinstance(fn, KernelRewardFunction) and fn.group_size == 4
    else:
        assert isinstance(seen["rollout_func"], MultiTurnRollout) and isinstance(fn, EpisodeReturn)
        assert seen["rollout_func"].scorer.group_size == 2  # trajectories per group


@pytest.mark.slow
def test_tiny_cpu_multiturn_trains_two_steps_and_logs_both_turns(tmp_path: Path, cache_dir: Path):
    run = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "kernelrl", "train", "grpo", "--config", "tiny-cpu-multiturn",
                           "--output-dir", str(run), "--model.path", str(run / "base"), "--cache-dir", str(cache_dir)],
                          capture_output=True, text=True, timeout=900, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    log = done.stdout + done.stderr
    for step in (0, 1):
        for turn in (1, 2):
            assert f"turn {turn}/2 reward step {step}:" in log
        assert f"returns step {step} (turn 1..2, gamma 0.4): episode" in log
    with Database(run / "code.db", readonly=True) as db:
        stored = db.candidates()
    assert sorted(c.meta.turn for c in stored) == [1, 1, 1, 1, 2, 2, 2, 2]
    assert all("### Turn 1" in c.prompt for c in stored if c.meta.turn == 2)


@pytest.mark.slow
def test_two_processes_split_a_group_and_agree_on_its_episodes(tmp_path: Path, cache_dir: Path):
    """Two processes under accelerate (gloo on the CPU), each holding one trajectory of every group."""
    from train_fixtures import launch_stage

    run = tmp_path / "run"
    done = launch_stage("grpo", run, cache_dir, "--grpo.episode.turns", "2", "--grpo.trl",
                        "num_generations=4", "per_device_train_batch_size=2")
    assert done.returncode == 0, done.stderr[-3000:]
    with Database(run / "code.db", readonly=True) as db:
        stored = db.candidates()
    assert len(stored) == 8 and {c.meta.rank for c in stored} == {0, 1}
    for step in (0, 1):
        turns = [c for c in stored if c.meta.step == step]
        assert len({c.task for c in turns}) == 1  # one group, one task, on both processes
        assert len({c.meta.episode for c in turns}) == 2  # numbered apart across the processes
    by_id = {c.id: c for c in stored}
    for c in (c for c in stored if c.meta.turn == 2):
        (parent,) = c.parents
        assert (by_id[parent].meta.episode, by_id[parent].meta.rank) == (c.meta.episode, c.meta.rank)


def test_turn_credit_prefers_no_turn_position():
    """Returns centred per turn index: equal outcomes get equal credit whatever the turn, a group
    where nothing is correct (and everything failed alike) gets none, and every turn index of a
    group sums to zero; `group` hands TRL the returns themselves."""
    from kernelrl.train.multiturn import Outcome, TurnCredit, turn_credit

    def outcome(*returns: float | None) -> Outcome:
        return Outcome(rank=0, task="t", key="k", returns=tuple(returns), correct=False)

    fail = -3.0
    g1 = fail + 0.4 * fail
    flat = [outcome(g1, fail), outcome(g1, fail)]  # nothing correct, the same failures
    assert turn_credit(flat, [[0, 1]], TurnCredit.TURN) == [(0.0, 0.0), (0.0, 0.0)]
    assert turn_credit(flat, [[0, 1]], TurnCredit.GROUP) == [(g1, fail), (g1, fail)]  # position alone differs
    mixed = [outcome(fail + 0.4 * 0.7, 0.7), outcome(g1, fail), outcome(0.7 + 0.4 * 0.7, 0.7), outcome(None, 0.7)]
    credit = turn_credit(mixed, [[0, 1, 2, 3]], TurnCredit.TURN)
    for t in range(2):
        assert sum(c[t] for c in credit if c[t] is not None) == pytest.approx(0.0)
    assert credit[0][1] == credit[2][1] == credit[3][1]  # the same correct turn 2: the same credit
    assert credit[3][0] is None  # a turn with no return passes nothing back
    assert credit[2][0] > credit[0][0] > credit[1][0]  # turn 1: right first > fixed later > never right


def test_repeating_the_episodes_own_answer_is_paid_and_copying_the_rows_shown_version_is_not():
    """Turn 2 repeats turn 1's 2x program: judged and paid again (the episode's own history is
    not a shown version); a program the row's prompt showed is a copy at either turn."""
    best = "import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x * 2  # fast3.0\n"
    other = ("import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
             "        y = torch.relu(x)\n        z = torch.sigmoid(y) + torch.tanh(x)\n        return z.sum(dim=0)  # fast2.0\n")
    shown = f"```python\n{best}```\n"
    prompt = PROMPT + "\n\nThe best so far (3.00x):\n" + shown
    mine = f"```python\n{other}```\n"
    answers = [mine, "Copy.\n\n" + shown, mine, "Again.\n\n" + shown]
    run, trainer, scorer = rollout(answers)
    out = run([prompt] * 4, trainer)
    # trajectory 1: 2x then the same 2x again; trajectory 2: the shown version twice
    assert out["turn_reward"] == pytest.approx([math.log(2.0), math.log(2.0), 0.0, 0.0])
    turn2 = scorer.logs[-1].rollouts
    assert [r.copy for r in turn2] == [False, True]


def test_a_turn_two_without_a_reward_takes_turn_ones_return_out_and_says_why(tmp_path: Path):
    """Turn 2 of the first episode hits a task error (no reward): its turn 1 has no return either
    (None to TRL, so the trainer leaves both rows out), while the other episode is paid as usual;
    the step's metrics count the turn left out for a later turn, and the turn left out for its own;
    the database holds each turn's return and credit, none for the two left out."""
    answers = [answer("broken"), answer("wrong"), answer("taskerror"), answer("fast3.0")]
    db = Database(tmp_path / "code.db")
    run, trainer, _ = rollout(answers, db=db)
    out = run([PROMPT] * 4, trainer)
    model = RewardModel()
    from train_fixtures import judge_by_marker

    wrong = model.raw(judge_by_marker(TASK, answer("wrong")))
    fast = model.raw(judge_by_marker(TASK, answer("fast3.0")))
    assert wrong is not None and fast is not None
    assert out["turn_reward"][:2] == [pytest.approx(Penalties().compile_error), None]
    assert out["turn_return"] == [None, None, pytest.approx(wrong.raw + 0.4 * fast.raw), pytest.approx(fast.raw)]
    assert out["turn_credit"][:2] == [None, None]
    assert run.metrics["kernelrl/excluded/later_turn"] == 1.0
    assert run.metrics["kernelrl/turn2/excluded/task_error"] == 1.0
    values = EpisodeReturn()([PROMPT] * 4, ["a"] * 4, task=["t"] * 4, turn_task=out["turn_task"],
                             turn_return=out["turn_return"], turn_credit=out["turn_credit"])
    assert values[:2] == [None, None] and None not in values[2:]
    stored = {(c.meta.episode, c.meta.turn): c.meta for c in db.candidates(task="t")}
    assert stored[(1, 1)].returned is None and stored[(1, 1)].credit is None and stored[(1, 2)].credit is None
    assert stored[(2, 1)].returned == pytest.approx(out["turn_return"][2]) and stored[(2, 2)].credit is not None
