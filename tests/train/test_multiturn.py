"""Multi-turn GRPO: refinement episodes through TRL's rollout hook, every turn a sample paid its
discounted return (Kevin's attribution)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kernelrl.reward import RewardModel
from kernelrl.search.database import Database
from kernelrl.search.episode import EpisodeConfig
from kernelrl.tasks.task import Task
from kernelrl.train.multiturn import EpisodeReturn, MultiTurnRollout
from kernelrl.train.reward_fn import KernelRewardFunction
from train_fixtures import ScriptedBackend, answer

TASK = Task(name="t", source="class Model:\n    pass\n")
PROMPT = "Make t faster."


class Stream:
    def task_of(self, prompt: Any) -> str:
        assert prompt == PROMPT
        return "t"


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


def rollout(answers: list[str], *, turns: int = 2, db: Any = None) -> tuple[MultiTurnRollout, FakeTrainer, Any]:
    scorer = KernelRewardFunction(ScriptedBackend(), tasks={"t": TASK}, reward=RewardModel(), db=db,
                                  group_size=None)
    return (MultiTurnRollout(scorer, Stream(), EpisodeConfig(turns=turns), as_prompt=lambda t: t),
            FakeTrainer(answers), scorer)


def test_turn_two_is_shown_turn_ones_verdict_and_each_turn_is_paid_its_discounted_return(tmp_path: Path):
    # two trajectories of two turns: turn-1 answers (does not build, wrong), then turn-2 answers (2x, 3x)
    answers = [answer("broken"), answer("wrong"), answer("fast2.0"), answer("fast3.0")]
    db = Database(tmp_path / "code.db")
    run, trainer, _ = rollout(answers, db=db)
    out = run([PROMPT] * 4, trainer)
    first, second = trainer.prompts
    assert first == [PROMPT, PROMPT]
    assert all("### Turn 1" in p and "Does not build: does not build" in p for p in second[:1])
    assert "Incorrect: wrong values" in second[1] and "## Turn 2 of 2" in second[1]
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
    assert EpisodeReturn()([PROMPT] * 4, ["a"] * 4, turn_return=out["turn_return"]) == out["turn_return"]
    stored = sorted(db.candidates(task="t"), key=lambda c: c.id)
    assert [(c.meta["episode"], c.meta["turn"]) for c in stored] == [(1, 1), (2, 1), (1, 2), (2, 2)]
    assert stored[2].parents == (stored[0].id,) and "### Turn 1" in stored[2].prompt


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


@pytest.mark.slow
def test_tiny_cpu_multiturn_trains_two_steps_and_logs_both_turns(tmp_path: Path, cache_dir: Path):
    run = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "kernelrl", "train", "grpo", "--config", "tiny-cpu-multiturn",
                           f"output_dir={run}", f"model.path={run / 'base'}", f"eval.cache_dir={cache_dir}"],
                          capture_output=True, text=True, timeout=900, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    log = done.stdout + done.stderr
    for step in (0, 1):
        for turn in (1, 2):
            assert f"turn {turn}/2 reward step {step}:" in log
    with Database(run / "code.db", readonly=True) as db:
        stored = db.candidates()
    assert sorted(c.meta.get("turn") for c in stored) == [1, 1, 1, 1, 2, 2, 2, 2]
    assert all("### Turn 1" in c.prompt for c in stored if c.meta.get("turn") == 2)
