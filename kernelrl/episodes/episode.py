"""A refinement episode: one task, up to T turns, each turn shown its earlier answers and verdicts.

Kernel engineers iterate: write, build, read the error or the measurement, fix, measure again.
An `Episode` holds one task's turns. Turn t's prompt is the task's contrastive prompt (built by
the caller, `kernelrl.episodes.prompt.build_prompt`) followed by this episode's history: each
earlier answer's code and its verdict as a model should read it (`kernelrl.episodes.feedback`),
and what to do now. `record(answer, code, result)` adds a turn; `done` says when T turns were
taken.

The history fits a token budget (`EpisodeConfig.history_tokens`, counted by the caller's
tokenizer or, without one, as characters / 4): the latest turn is always shown in full; older
turns are shown in full while they fit, newest first, then as one line each (their verdict), and
the oldest one-line turns are dropped when even those do not fit.

Rewards across turns follow Kevin's multi-turn recipe: each turn is a sample, and its return is
its own reward plus gamma times the next turn's return (`discounted_returns`, gamma 0.4 by
default): a turn that fails but leads to a correct one is paid part of the later success.

Guarantees: a prompt holds only the task, the caller's contrastive context, this episode's own
answers (their code) and their verdict texts; verdict texts come only from `feedback` (no log,
seed, input value or harness path); a turn's return uses only its own and later turns' rewards;
a turn with no reward (the task failed, or a run the judge could not time) has no return and
adds nothing to earlier returns.

Does not judge, sample or train: the caller asks a proposer or a policy for the answer, the
evaluator for the verdict and `kernelrl.reward` for each turn's reward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kernelrl.episodes.feedback import feedback, verdict_line
from kernelrl.episodes.prompt import Templates
from kernelrl.result import EvalResult, Status

DEFAULT_GAMMA = 0.4  # Kevin's best discount for later turns' rewards


@dataclass(frozen=True, kw_only=True)
class EpisodeConfig:
    turns: int = 1  # answers per episode (1: single-turn, every prompt fresh)
    history_tokens: int = 6000  # the most the history of earlier turns may take in a prompt
    gamma: float = DEFAULT_GAMMA  # discount of later turns' rewards in a turn's return

    def __post_init__(self) -> None:
        if self.turns < 1:
            raise ValueError(f"turns must be >= 1, got {self.turns}")
        if self.history_tokens < 200:
            raise ValueError(f"history_tokens must be >= 200, got {self.history_tokens}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")


@dataclass(frozen=True, kw_only=True)
class Turn:
    """One answer of an episode and its verdict."""

    number: int  # 1-based
    answer: str
    code: str | None  # the program judged; None: no complete code block
    result: EvalResult | None  # None exactly when code is None
    verdict: str  # the verdict as the next turn reads it (`feedback`)
    candidate_id: int | None = None  # where the code database keeps it, when it does
    reward: float | None = None  # the turn's own reward, when the caller pays one (`returns`)


@dataclass
class Episode:
    """See the module docstring. Not thread-safe: one caller drives an episode turn by turn."""

    task: str
    config: EpisodeConfig = field(default_factory=EpisodeConfig)
    turns: list[Turn] = field(default_factory=list)
    template_dir: str | Path | None = None
    count_tokens: Callable[[str], int] | None = None  # the policy's tokenizer; None: characters / 4

    @property
    def turn(self) -> int:
        """The number of the next turn (1-based)."""
        return len(self.turns) + 1

    @property
    def done(self) -> bool:
        return len(self.turns) >= self.config.turns

    @property
    def parents(self) -> tuple[int, ...]:
        """The stored candidate the next turn refines: the latest turn's (none before turn 2, or
        when the latest turn was not stored)."""
        last = self.turns[-1].candidate_id if self.turns else None
        return (last,) if last is not None else ()

    def record(self, answer: str, code: str | None, result: EvalResult | None, *,
               compile_speedup: float | None = None, compile_ci: tuple[float, float] | None = None,
               candidate_id: int | None = None, reward: float | None = None, verdict: str | None = None) -> Turn:
        """Add the next turn: the answer, the code judged and the verdict (`verdict`: the text
        given when this turn was judged, for an episode restored from storage; otherwise `feedback`'s)."""
        if self.done:
            raise ValueError(f"{self.task}: the episode already has its {self.config.turns} turns")
        if (code is None) != (result is None):
            raise ValueError("a turn has a result exactly when it has code to judge")
        if verdict is None:
            verdict = feedback(result, compile_speedup=compile_speedup, compile_ci=compile_ci)
        turn = Turn(number=self.turn, answer=answer, code=code, result=result, verdict=verdict,
                    candidate_id=candidate_id, reward=reward)
        self.turns.append(turn)
        return turn

    def prompt(self, base: str) -> str:
        """The prompt of the next turn: `base` (the task and its contrastive context) and this
        episode's history, within the token budget."""
        if not self.turns:
            return base
        t = Templates(self.template_dir)
        count = self.count_tokens or _approx_tokens
        budget = self.config.history_tokens
        full = [t.render("turn.txt", turn=x.number, code=(x.code or "(no complete code block)").rstrip("\n"),
                         verdict=x.verdict).rstrip("\n") for x in self.turns]
        short = [t.render("turn_summary.txt", turn=x.number, verdict=verdict_line(x.result)).rstrip("\n")
                 for x in self.turns]
        # newest first: the latest turn in full always; older ones in full, then summarised, then dropped
        shown: list[str] = [full[-1]]
        used = count(full[-1])
        summarising = False
        for i in range(len(self.turns) - 2, -1, -1):
            if not summarising and used + count(full[i]) <= budget:
                shown.append(full[i])
                used += count(full[i])
                continue
            summarising = True
            if used + count(short[i]) > budget:
                break
            shown.append(short[i])
            used += count(short[i])
        omitted = len(self.turns) - len(shown)
        history = "\n\n".join(reversed(shown))
        if omitted:
            history = t.render("turn_omitted.txt", n=omitted).rstrip("\n") + "\n\n" + history
        section = t.render("turn_history.txt", history=history, turn=self.turn, turns=self.config.turns,
                           last=self.turns[-1].number, next_step=next_step(self.turns[-1]),
                           task_name=self.task).rstrip("\n")
        return base.rstrip("\n") + "\n\n" + section + "\n"

    def returns(self, rewards: Sequence[float | None] | None = None) -> list[float | None]:
        """Each turn's return from the turns' own rewards (`rewards`, else those recorded with
        the turns; see `discounted_returns`)."""
        return discounted_returns([t.reward for t in self.turns] if rewards is None else rewards, self.config.gamma)


FLAT_KEYS = ("turns", "history_tokens")  # an older config's top-level keys, now its `episode` table's


def nest_episode_keys(values: dict[str, object]) -> dict[str, object]:
    """`values` (a run config's top level) with the older flat `turns` and `history_tokens` moved
    into its `episode` table; a ValueError when a key is given both ways."""
    flat = {k: values[k] for k in FLAT_KEYS if k in values}
    if not flat:
        return values
    nested = values.get("episode", {})
    if not isinstance(nested, dict):
        raise ValueError("episode: a table, not a value")
    if both := sorted(set(flat) & set(nested)):
        raise ValueError(f"{both[0]} is given both at the top level and in [episode]: keep episode.{both[0]}")
    return {**{k: v for k, v in values.items() if k not in FLAT_KEYS}, "episode": {**nested, **flat}}


def next_step(turn: Turn) -> str:
    """What the next turn is asked to do after `turn`'s verdict: the prompt's last line, so the
    instruction that follows from the verdict is the last thing a policy reads."""
    result = turn.result
    if result is not None and result.status is Status.CORRECT:
        return f"Turn {turn.number} is correct: make it faster while keeping it correct."
    what = "no code" if result is None else result.status.value.replace("_", " ")
    return f"Turn {turn.number} failed ({what}): fix what its verdict says first."


def discounted_returns(rewards: Sequence[float | None], gamma: float = DEFAULT_GAMMA) -> list[float | None]:
    """G_t = r_t + gamma * G_{t+1}, from the last turn back. A turn whose reward is None (the task
    failed there, or its run could not be judged) has no return, and neither has any turn before
    it: their returns would hold a reward nobody measured (counting it as 0 credited them as if
    the turn had earned the reference's own reward). Turns after it keep theirs."""
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    out: list[float | None] = [None] * len(rewards)
    later = 0.0
    for i in range(len(rewards) - 1, -1, -1):
        r = rewards[i]
        if r is None:
            break
        later = r + gamma * later
        out[i] = later
    return out


def _approx_tokens(text: str) -> int:
    return max(1, len(text) // 4)


__all__ = ["DEFAULT_GAMMA", "FLAT_KEYS", "Episode", "EpisodeConfig", "Turn", "discounted_returns",
           "nest_episode_keys", "next_step"]
