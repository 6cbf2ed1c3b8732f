"""Multi-turn GRPO: refinement episodes as TRL rollouts, each turn a sample paid its discounted return.

TRL's `GRPOTrainer` takes a `rollout_func(prompts, trainer)` that returns, for the rows handed
to this process, one completion each (`prompt_ids`, `completion_ids`, `logprobs`, and extra
fields that reach the reward functions). `MultiTurnRollout` is that function, chosen over
`environment_factory` because an environment's turns are tool calls inside one completion, judged
as one sequence with one reward (its `get_reward`), while Kevin's recipe makes every turn a sample
of its own, with its own prompt (the history rebuilt within a token budget) and its own return,
which only a rollout function can lay out; it also lets all trajectories' turn t be judged in one
evaluator batch, where an environment's tool judges one kernel per call:

- a group of `num_generations` rows holding one prompt (TRL's RepeatSampler) is split into
  `num_generations / turns` trajectories of `turns` rows: trajectory j owns rows j*T ... j*T+T-1;
- turn 1 of every trajectory answers the row's prompt; the answers of all trajectories are
  judged together (`KernelRewardFunction.score_rollouts`: one `evaluate_batch`, the reward's
  mapping and CUDA-L1's clip as in the single-turn path, every rank in one order, every code and
  verdict stored with its `turn`, `turns` and `episode` in the candidate's meta, turn 1's parents
  the row's (as single-turn rollouts'), a later turn's parent the previous turn's candidate);
  turn t answers `Episode.prompt` (the row's prompt, then the trajectory's earlier answers and
  verdicts within `history_tokens` of the policy's tokenizer, `kernelrl.episodes.episode`), and so
  on;
- a copy (`kernelrl.train.copies`) is a program the row's prompt showed (the task's versions
  from the database); repeating the episode's own earlier answer is not one: it is judged and
  paid again, so a turn that cannot improve is not pushed into a change for its own sake;
- the row for turn t of a trajectory is returned with that turn's prompt and completion, and its
  reward is the turn's discounted return (Kevin's attribution, `discounted_returns`):

      G_T = r_T,   G_t = r_t + gamma * G_{t+1}   (gamma = grpo.episode.gamma, 0.4 by default)

  where r_t is the turn's own reward (`RewardModel`, clipped; None when the task or the judge
  failed, or the run could not be timed: that turn has no return, and neither has any earlier
  turn of its episode, whose return would hold it; TRL is handed None for them, and the trainer
  takes them out of the batch, `kernelrl.train.trainer`; the step log counts them,
  `kernelrl/excluded/later_turn`). A turn that fails (r_1 = the compile-error penalty) and
  leads to a correct one (r_2) is paid r_1 + gamma * r_2; the correct turn is paid r_2;
- TRL normalises what it is handed within the group (all turns of its trajectories), so the
  returns are first centred per turn index (`TurnCredit.TURN`, `turn_credit`): each turn's return
  minus the mean return of that turn over the group's trajectories (gathered across ranks). With
  negative failure rewards, G_1 = r_1 + gamma G_2 is below G_2 whenever both fail, and returns
  normalised together taught turn position, not content; centred per turn, every turn index
  averages zero, equal outcomes get equal credit and a group of equal outcomes gets none. Kevin's
  alternative (failures at 0) would give up the reward's order among failures (a program that
  ran above no code, hacks lowest). The measured effect is in benchmarks/README.md (the
  learning check, `--credit group` against `turn`);
- `EpisodeReturn` is the reward function: it hands TRL the returns, after checking that each
  row's completion was judged against the row's own task and that the row's key is its task's and
  prompt's (`TaskMismatch` otherwise), and logs per-turn metrics (`kernelrl/turn<t>/...`) and
  completion columns (turn, verdict, reward, return);
- the curriculum is told once per group, from the returns of all its trajectories (gathered
  across ranks, in the global batch's order), not once per turn;
- every stored turn gets its return and what TRL was handed for it in its meta (`returned`,
  `credit`) once its episode ends, so what each turn was paid can be read from the database;
- the console shows one line per turn per step (the turn's verdicts, raw -> clipped rewards) and
  one line of each trajectory's verdicts and returns, turn by turn.

Guarantees: every returned sample's prompt is the prompt its completion was generated from; a
turn's return uses only its own and later turns' rewards of its own trajectory; each turn's
answers are scored against the task of the row they came from (the prompt stream's record,
`PromptStream.row_of`, checked against the row's task and key in `EpisodeReturn`); every rank
runs the same turns and collectives in the same order, so rewards gathered across ranks stay
aligned and episode numbers are unique within a run; with `turns = 1` nothing here is used (the
single-turn path is TRL's own generation and `KernelRewardFunction`).

Does not support GRPO-RoC (it drops samples by giving them no reward, which would cut a
trajectory's return short: refused at configuration), and uses TRL's own generation
(`kernelrl.train.trl_generate`, the one adapter over `GRPOTrainer`'s private generation:
transformers' generate, or vLLM when `use_vllm`; TRL calls the rollout function experimental,
and these private methods may move with it) for every turn, so a turn waits for the previous
turn's verdicts. The turns are `kernelrl.episodes.driver.run_episodes` with this module's `ask`
(TRL's generation) and `judge` (`score_rollouts`, the samples kept for TRL).
"""

from __future__ import annotations

import enum
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

from kernelrl.candidate import extract_code
from kernelrl.episodes.driver import Judgement, run_episodes
from kernelrl.episodes.episode import Episode, EpisodeConfig
from kernelrl.result import Status
from kernelrl.run_parts import Reporter
from kernelrl.store.records import RunMeta
from kernelrl.train.effects import LogExtra, LogMetric, print_batch
from kernelrl.train.model import prompt_text
from kernelrl.train.reward_fn import KernelRewardFunction
from kernelrl.train.rollouts import Rollout
from kernelrl.train.shaper import TaskMismatch
from kernelrl.train.stream import PromptStream, row_key
from kernelrl.train.trl_generate import Generated, generate

if TYPE_CHECKING:
    from pathlib import Path

    from kernelrl.train.sampling import Prompt


@dataclass(frozen=True, kw_only=True)
class Trajectory:
    """One refinement episode's rows on this process: its task, its row's prompt, key and parents."""

    task: str
    prompt: Prompt
    key: str
    parents: tuple[int, ...] = ()  # the versions the row's prompt built on: turn 1's parents
    shown: tuple[int, ...] | None = None  # every version the row's prompt showed (database ids)


class RolloutColumns(TypedDict):
    """What `MultiTurnRollout` gives TRL: one entry per turn row in each column."""

    prompt_ids: list[Sequence[int]]
    completion_ids: list[Sequence[int]]
    logprobs: list[Sequence[float] | None] | None  # None: transformers' generate gives none; TRL computes them
    turn: list[int]
    turn_task: list[str]
    turn_verdict: list[str]
    turn_reward: list[float | None]
    turn_return: list[float | None]
    turn_credit: list[float | None]


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """One trajectory as every rank sees it after the gather: what the curriculum and the metrics read."""

    rank: int
    task: str
    key: str
    returns: tuple[float | None, ...]
    correct: bool  # any turn correct


class TurnCredit(enum.StrEnum):
    """What TRL is handed for each turn (it then normalises within the group).

    TURN: the turn's return minus the mean return of the same turn index over the group's
    trajectories. Every turn index then averages zero, so no position is preferred: with
    failures paid -2.5 to -4, G_1 = r_1 + gamma G_2 is lower than G_2 whenever both fail, and
    normalising all turns together pushed every first answer down and every refinement up
    whatever it held. Equal outcomes at one turn get equal credit; a group whose trajectories
    all had the same outcomes gets none (no gradient).
    GROUP: the return itself (all turns normalised together by TRL): kept to measure the bias
    (benchmarks/learning_check.py), not for training."""

    TURN = "turn"
    GROUP = "group"


def turn_credit(every: Sequence[Outcome], parts: Sequence[Sequence[int]], credit: TurnCredit
                ) -> list[tuple[float | None, ...]]:
    """Each trajectory's per-turn values for TRL, for the global batch `every` cut into groups
    `parts` (indices into `every`); a turn with no return (None) stays None."""
    if credit is TurnCredit.GROUP:
        return [o.returns for o in every]
    out: list[tuple[float | None, ...]] = [o.returns for o in every]
    for members in parts:
        turns = max((len(every[i].returns) for i in members), default=0)
        means = []
        for t in range(turns):
            paid = [g for i in members if t < len(every[i].returns) and (g := every[i].returns[t]) is not None]
            means.append(statistics.fmean(paid) if paid else 0.0)
        for i in members:
            out[i] = tuple(None if g is None else g - means[t] for t, g in enumerate(every[i].returns))
    return out


class EpisodeReturn:
    """TRL reward function of multi-turn rows: the turn's discounted return, computed by the rollout."""

    __name__ = "kernelrl_episode_return"

    def __init__(self, rollout: MultiTurnRollout | None = None) -> None:
        self.rollout = rollout  # where the latest episodes' metrics are read

    def __call__(self, prompts: Sequence[Prompt], completions: Sequence[object], task: Sequence[str],
                 turn_task: Sequence[str], turn_return: Sequence[float | None], key: Sequence[str] | None = None,
                 turn: Sequence[int] | None = None, turn_verdict: Sequence[str] | None = None,
                 turn_reward: Sequence[float | None] | None = None, turn_credit: Sequence[float | None] | None = None,
                 log_metric: LogMetric | None = None, log_extra: LogExtra | None = None,
                 **kwargs: object) -> list[float | None]:
        n = len(completions)
        if not (len(prompts) == len(task) == len(turn_task) == len(turn_return) == n):
            raise ValueError(f"{len(prompts)} prompts, {len(task)} tasks, {len(turn_task)} judged tasks and "
                             f"{len(turn_return)} returns for {n} completions")
        for i, (row_task, judged) in enumerate(zip(task, turn_task)):
            if row_task != judged:
                raise TaskMismatch(f"row {i}: its completion was judged against {judged!r}, but the row's task is "
                                   f"{row_task!r}")
        if key is not None:
            for i, (name, p, carried) in enumerate(zip(task, prompts, key)):
                if row_key(name, p) != carried:
                    raise TaskMismatch(f"row {i}: task {name!r} is not the task its prompt was built for "
                                       f"(key {carried}); its completion would be scored against another task")
        if callable(log_metric) and self.rollout is not None:
            for name, value in self.rollout.metrics.items():
                log_metric(name, value)
        if callable(log_extra):
            for name, column in (("turn", turn), ("verdict", turn_verdict), ("turn_reward", turn_reward),
                                 ("turn_return", turn_return), ("turn_credit", turn_credit)):
                if column is not None:
                    log_extra(name, list(column))
        if turn_credit is not None and len(turn_credit) != n:
            raise ValueError(f"{len(turn_credit)} credits for {n} completions")
        return list(turn_credit if turn_credit is not None else turn_return)


class MultiTurnRollout:
    """TRL `rollout_func` running refinement episodes (see the module docstring)."""

    def __init__(self, scorer: KernelRewardFunction, stream: PromptStream, config: EpisodeConfig, *,
                 template_dir: str | Path | None = None, reporter: Reporter | None = None,
                 count_tokens: Callable[[str], int] | None = None, credit: TurnCredit = TurnCredit.TURN) -> None:
        if config.turns < 2:
            raise ValueError("a multi-turn rollout needs turns >= 2 (one turn is TRL's own generation)")
        self.credit = TurnCredit(credit)
        self.scorer = scorer
        self.stream = stream
        self.config = config
        self.template_dir = template_dir
        self.reporter = reporter or Reporter.quiet()
        self.count_tokens = count_tokens  # the policy's tokenizer for the history budget; None: characters / 4
        self.episodes = 0  # trajectories started in this run, over every rank (the same on each)
        self.metrics: dict[str, float] = {}  # the latest call's, over the global batch

    def __call__(self, prompts: list[Prompt], trainer: Any) -> RolloutColumns:
        T = self.config.turns
        ranks = self.scorer.ranks
        trajectories = self._trajectories(prompts)
        step = int(getattr(getattr(trainer, "state", None), "global_step", 0) or 0)
        # Episode numbers unique within the run, whatever rank holds the trajectory.
        counts = ranks.gather([len(trajectories)])
        first = self.episodes + sum(counts[:ranks.index]) + 1
        numbers = list(range(first, first + len(trajectories)))
        self.episodes += sum(counts)
        episodes = [Episode(task=t.task, config=self.config, template_dir=self.template_dir,
                            count_tokens=self.count_tokens) for t in trajectories]
        keys = [t.key for t in trajectories]
        # (prompt_ids, completion_ids, logprobs) of each turn
        samples: list[list[tuple[Sequence[int], Sequence[int], Sequence[float] | None]]] = [[] for _ in trajectories]
        verdicts: list[list[str]] = [[] for _ in trajectories]
        correct = [False] * len(trajectories)
        metrics: dict[str, float] = {}
        generated: list[Generated] = []  # this turn's

        def ask(turn: int, live: Sequence[int], now: Sequence[Prompt]) -> list[str | None]:
            generated[:] = [generate(trainer, now)]
            return list(generated[0].answers)  # one per prompt: every trajectory runs its T turns

        def judge(turn: int, asked: Sequence[int], now: Sequence[Prompt], answers: Sequence[str]) -> list[Judgement]:
            g = generated[0]
            # turn 1's parents are the row's; a later turn's, the previous turn's candidate
            rollouts = [Rollout(task=trajectories[j].task, prompt=prompt_text(p), answer=a, completion_tokens=len(ids),
                                parents=episodes[j].parents if episodes[j].turns else trajectories[j].parents,
                                shown=trajectories[j].shown, shown_text=prompt_text(trajectories[j].prompt))
                        for j, p, a, ids in zip(asked, now, answers, g.completion_ids)]
            meta = [RunMeta(turn=turn, turns=T, episode=numbers[j]) for j in asked]
            values, batch = self.scorer.score_rollouts(rollouts, keys=[keys[j] for j in asked], step=step, meta=meta,
                                                       observe=False)
            out: list[Judgement] = []
            for k, (j, answer, result, log) in enumerate(zip(asked, answers, batch.results, batch.rollouts)):
                out.append(Judgement(code=extract_code(answer) if result is not None else None, result=result,
                                     candidate_id=log.candidate_id, reward=values[k],
                                     compile_speedup=self.scorer.compile_speedups.get(trajectories[j].task)))
                verdicts[j].append((log.status or Status.NO_CODE).value)
                correct[j] = correct[j] or log.status is Status.CORRECT
                samples[j].append((g.prompt_ids[k], g.completion_ids[k], g.logprobs[k] if g.logprobs is not None else None))
            metrics.update({name.replace("kernelrl/", f"kernelrl/turn{turn}/", 1): value
                            for name, value in batch.metrics.items()})
            self.reporter.console.print(f"[bold]turn {turn}/{T}[/bold]", end=" ", highlight=False)
            print_batch(batch, self.reporter.console)
            return out

        returns = run_episodes(episodes, [t.prompt for t in trajectories], ask=ask, judge=judge)
        rewards = [[turn.reward for turn in ep.turns] for ep in episodes]
        every = ranks.gather([Outcome(rank=ranks.index, task=t.task, key=t.key, returns=tuple(g), correct=c)
                              for t, g, c in zip(trajectories, returns, correct)])
        parts = self.scorer.cut_groups([(o.rank, o.task, o.key) for o in every], step)
        start = sum(counts[:ranks.index])
        credits = turn_credit(every, parts, self.credit)[start:start + len(trajectories)]
        self._tell_curriculum(every, parts)
        self._store_returns(episodes, returns, credits)
        for turn in range(1, T + 1):
            paid = [g for o in every if (g := o.returns[turn - 1]) is not None]
            metrics[f"kernelrl/turn{turn}/return"] = statistics.fmean(paid) if paid else 0.0
        # Turns with a reward of their own but no return: a later turn of the episode had none.
        later = ranks.gather([sum(r is not None and g is None for r, g in zip(rs, gs))
                              for rs, gs in zip(rewards, returns)])
        metrics["kernelrl/excluded/later_turn"] = float(sum(later))
        self.metrics = metrics
        # each trajectory's verdict and return, turn by turn
        shown = "; ".join(f"episode {n}: " + " -> ".join(f"{v} {'none' if g is None else f'{g:+.3f}'}"
                                                          for v, g in zip(vs, gs))
                          for n, vs, gs in zip(numbers, verdicts, returns))
        self.reporter.console.print(f"[bold]returns[/bold] step {step} (turn 1..{T}, gamma {self.config.gamma}): "
                                    f"{shown}", highlight=False, soft_wrap=True)
        logprobs: list[Sequence[float] | None] = []
        out: RolloutColumns = {"prompt_ids": [], "completion_ids": [], "logprobs": logprobs, "turn": [], "turn_task": [],
                               "turn_verdict": [], "turn_reward": [], "turn_return": [], "turn_credit": []}
        for j, t in enumerate(trajectories):
            for k in range(T):
                p_ids, c_ids, lps = samples[j][k]
                out["prompt_ids"].append(p_ids)
                out["completion_ids"].append(c_ids)
                logprobs.append(lps)
                out["turn"].append(k + 1)
                out["turn_task"].append(t.task)
                out["turn_verdict"].append(verdicts[j][k])
                out["turn_reward"].append(rewards[j][k])
                out["turn_return"].append(returns[j][k])
                out["turn_credit"].append(credits[j][k])
        if all(lp is None for lp in logprobs):
            out["logprobs"] = None  # transformers' generate gives none; TRL computes them
        return out

    def _trajectories(self, prompts: list[Prompt]) -> list[Trajectory]:
        """One per T rows: each run of equal prompts cut into trajectories of T rows."""
        T = self.config.turns
        out: list[Trajectory] = []
        i = 0
        while i < len(prompts):
            j = i
            while j < len(prompts) and prompt_text(prompts[j]) == prompt_text(prompts[i]):
                j += 1
            if (j - i) % T:
                raise ValueError(f"{j - i} rows of one prompt on this process cannot be cut into trajectories of "
                                 f"{T} turns: make num_generations (and each process's share of a group) a "
                                 f"multiple of grpo.episode.turns")
            row = self.stream.row_of(prompts[i])
            task = str(row["task"])
            out += [Trajectory(task=task, prompt=prompts[i], key=row_key(task, prompts[i]),
                               parents=tuple(row.get("parents") or ()),
                               shown=tuple(row["shown"]) if row.get("shown") is not None else None)] * ((j - i) // T)
            i = j
        return out

    def _store_returns(self, episodes: Sequence[Episode], returns: Sequence[Sequence[float | None]],
                       credits: Sequence[Sequence[float | None]]) -> None:
        """Each stored turn's return and what TRL was handed for it, once its episode has ended (a
        turn whose return holds a missing reward keeps none)."""
        db = self.scorer.db
        if db is None:
            return
        for ep, gs, cs in zip(episodes, returns, credits):
            for turn, g, c in zip(ep.turns, gs, cs):
                if turn.candidate_id is not None and (g is not None or c is not None):
                    db.merge_meta(turn.candidate_id, RunMeta(returned=g, credit=c))

    def _tell_curriculum(self, every: Sequence[Outcome], parts: Sequence[Sequence[int]]) -> None:
        """Once per group of the global batch, from all its trajectories' returns."""
        curriculum = self.scorer.curriculum
        if curriculum is None:
            return
        for members in parts:
            values = [g for i in members for g in every[i].returns if g is not None]
            curriculum.observe(every[members[0]].task, values, any_correct=any(every[i].correct for i in members))
