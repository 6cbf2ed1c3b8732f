"""Multi-turn GRPO: refinement episodes as TRL rollouts, each turn a sample paid its discounted return.

TRL's `GRPOTrainer` takes a `rollout_func(prompts, trainer)` that returns, for the rows handed
to this process, one completion each (`prompt_ids`, `completion_ids`, `logprobs`, and extra
fields that reach the reward functions). `MultiTurnRollout` is that function, chosen over
`environment_factory` because an environment's turns are tool calls inside one completion, judged
as one sequence with one reward, while Kevin's recipe makes every turn a sample of its own with
its own return, which only a rollout function can lay out:

- a group of `num_generations` rows holding one prompt (TRL's RepeatSampler) is split into
  `num_generations / turns` trajectories of `turns` rows: trajectory j owns rows j*T ... j*T+T-1;
- turn 1 of every trajectory answers the row's prompt; the answers of all trajectories are
  judged together (`KernelRewardFunction.score_rollouts`: one `evaluate_batch`, the reward's
  mapping and clip, every rank in one order, every code and verdict stored with its turn and
  episode, the previous turn as its parent); turn t answers `Episode.prompt` (the row's prompt,
  then the trajectory's earlier answers and verdicts, `kernelrl.search.episode`), and so on;
- the row for turn t of a trajectory is returned with that turn's prompt and completion, and its
  reward is the turn's discounted return (`discounted_returns`: own reward plus gamma times the
  next turn's return, gamma 0.4 by default), carried to `EpisodeReturn` as the extra field
  `turn_return`;
- one console line per turn per step names the turn and its verdicts.

Guarantees: every returned sample's prompt is the prompt its completion was generated from; a
turn's return uses only its own and later turns' rewards of its own trajectory; each turn's
answers are scored against the task of the row they came from (the prompt stream's record,
`PromptStream.task_of`, and the row key the reward function checks); every rank runs the same
number of turns in the same order, so rewards gathered across ranks stay aligned; with
`turns = 1` nothing here is used (the single-turn path is TRL's own generation).

Does not support GRPO-RoC (it drops samples by giving them no reward, which would cut a
trajectory's return short: refused at configuration), and uses TRL's own generation
(`GRPOTrainer._generate_single_turn`: transformers' generate, or vLLM when `use_vllm`) for every
turn, so a turn waits for the previous turn's verdicts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kernelrl.candidate import extract_code
from kernelrl.search.episode import Episode, EpisodeConfig
from kernelrl.train.model import completion_text, prompt_text
from kernelrl.train.reward_fn import KernelRewardFunction, print_batch
from kernelrl.train.rollouts import Rollout
from kernelrl.train.stream import PromptStream, row_key


class EpisodeReturn:
    """TRL reward function of multi-turn rows: the turn's discounted return, computed by the rollout."""

    __name__ = "kernelrl_episode_return"

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], turn_return: Sequence[float | None],
                 **kwargs: Any) -> list[float | None]:
        if len(turn_return) != len(completions):
            raise ValueError(f"{len(turn_return)} returns for {len(completions)} completions")
        return list(turn_return)


class MultiTurnRollout:
    """TRL `rollout_func` running refinement episodes (see the module docstring)."""

    def __init__(self, scorer: KernelRewardFunction, stream: PromptStream, config: EpisodeConfig, *,
                 as_prompt: Callable[[str], Any], template_dir: Any = None, console: Any = None) -> None:
        if config.turns < 2:
            raise ValueError("a multi-turn rollout needs turns >= 2 (one turn is TRL's own generation)")
        self.scorer = scorer
        self.stream = stream
        self.config = config
        self.as_prompt = as_prompt
        self.template_dir = template_dir
        self.console = console
        self.episodes = 0  # trajectories started on this rank

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        T = self.config.turns
        trajectories = self._trajectories(prompts)
        step = int(getattr(getattr(trainer, "state", None), "global_step", 0) or 0)
        episodes = [Episode(task=task, config=self.config, template_dir=self.template_dir) for task, _, _ in trajectories]
        numbers = list(range(self.episodes + 1, self.episodes + 1 + len(trajectories)))
        self.episodes += len(trajectories)
        turn_prompts: list[list[Any]] = [[] for _ in trajectories]
        turn_ids: list[list[tuple[list[int], list[int], Any]]] = [[] for _ in trajectories]
        rewards: list[list[float | None]] = [[] for _ in trajectories]
        parents: list[tuple[int, ...]] = [() for _ in trajectories]
        for turn in range(1, T + 1):
            now = [self._turn_prompt(row_prompt, ep) for (_, row_prompt, _), ep in zip(trajectories, episodes)]
            prompt_ids, _, _ = trainer._tokenize_prompts(now)
            completion_ids, logprobs = trainer._generate_single_turn(prompt_ids, None, {}, 1)
            answers = [completion_text(c) for c in trainer.processing_class.batch_decode(
                completion_ids, skip_special_tokens=True)]
            rollouts = [Rollout(task=task, prompt=prompt_text(p), answer=a, completion_tokens=len(ids),
                                parents=parents[j])
                        for j, ((task, _, _), p, a, ids) in enumerate(zip(trajectories, now, answers, completion_ids))]
            keys = [key for _, _, key in trajectories]
            meta = [{"turn": turn, "episode": n, "turns": T} for n in numbers]
            values, batch = self.scorer.score_rollouts(rollouts, keys=keys, step=step, meta=meta)
            for j, (ep, answer, result, log) in enumerate(zip(episodes, answers, batch.results, batch.rollouts)):
                code = extract_code(answer)
                ep.record(answer, code if result is not None else None, result, candidate_id=log.candidate_id)
                parents[j] = (log.candidate_id,) if log.candidate_id is not None else ()
                rewards[j].append(values[j])
                turn_prompts[j].append(now[j])
                turn_ids[j].append((prompt_ids[j], completion_ids[j], logprobs[j] if logprobs is not None else None))
            if self.console is not None:
                self.console.print(f"[bold]turn {turn}/{T}[/bold]", end=" ", highlight=False)
                print_batch(batch, self.console)
        returns = [ep.returns(r) for ep, r in zip(episodes, rewards)]
        out: dict[str, Any] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "turn_return": []}
        for j in range(len(trajectories)):
            for t in range(T):
                p_ids, c_ids, lps = turn_ids[j][t]
                out["prompt_ids"].append(p_ids)
                out["completion_ids"].append(c_ids)
                out["logprobs"].append(lps)
                out["turn_return"].append(returns[j][t])
        if all(lp is None for lp in out["logprobs"]):
            out["logprobs"] = None  # transformers' generate gives none; TRL computes them
        return out

    def _trajectories(self, prompts: list[Any]) -> list[tuple[str, Any, str]]:
        """(task, row prompt, key) per trajectory: each run of equal prompts cut into T rows each."""
        T = self.config.turns
        out: list[tuple[str, Any, str]] = []
        i = 0
        while i < len(prompts):
            j = i
            while j < len(prompts) and prompt_text(prompts[j]) == prompt_text(prompts[i]):
                j += 1
            if (j - i) % T:
                raise ValueError(f"{j - i} rows of one prompt on this process cannot be cut into trajectories of "
                                 f"{T} turns: make num_generations (and each process's share of a group) a "
                                 f"multiple of grpo.episode.turns")
            task = self.stream.task_of(prompts[i])
            out += [(task, prompts[i], row_key(task, prompts[i]))] * ((j - i) // T)
            i = j
        return out

    def _turn_prompt(self, row_prompt: Any, episode: Episode) -> Any:
        """The row's prompt with the episode's history after its user text (chat or plain)."""
        if not episode.turns:
            return row_prompt
        if isinstance(row_prompt, str):
            return episode.prompt(row_prompt)
        messages = [dict(m) for m in row_prompt]
        last_user = max(i for i, m in enumerate(messages) if m.get("role") == "user")
        messages[last_user]["content"] = episode.prompt(str(messages[last_user]["content"]))
        return messages
