"""The episode driver: the refinement turn loop, written once.

`run_episodes(episodes, bases, ask=..., judge=...)` runs fresh episodes (`kernelrl.episodes.episode`)
side by side, turn by turn: each live episode's prompt is its base prompt and its history within
the token budget (`turn_prompt`: a plain prompt, or a chat whose last user message gets the
history), `ask` answers all of them in one batch, `judge` judges every answer in one batch and
hands back a `Judgement` each (code, result, where it is stored, the turn's reward), the driver
records each verdict in its episode (the next turn reads it), and at the end it returns each
episode's discounted returns. The bench's refinement turns (`kernelrl.train.bench_turns`) and
multi-turn GRPO (`kernelrl.train.multiturn`) are this loop with their own `ask` and `judge`.

A search chain (`kernelrl.search.chains`) and an HTTP session (`kernelrl.serve.sessions`) cannot
block on a batch (the scheduler's model calls and the client's requests come one at a time), so
they take the same steps one turn at a time: `Episode.prompt` for the next prompt,
`Episode.record` for a verdict (the text stored with it, when restored), `Episode.parents` for
what the next turn refines, `Episode.returns` for the returns.

Guarantees: every answer asked for is judged in the same turn's batch, in the order asked; each
episode's turns are recorded in order; an episode given no answer is asked nothing more; the
returns use only the rewards the judge paid (`discounted_returns`).

Does not generate, judge, store or pay: the callers' `ask` and `judge` do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kernelrl.episodes.episode import Episode
from kernelrl.result import EvalResult


def turn_prompt(episode: Episode, base: str | Sequence[Mapping[str, object]]) -> str | Sequence[Mapping[str, object]]:
    """The next turn's prompt from `base`, a plain prompt (`Episode.prompt`) or a chat (its last
    user message gets the history); turn 1's is `base` itself."""
    if not episode.turns:
        return base
    if isinstance(base, str):
        return episode.prompt(base)
    messages = [dict(m) for m in base]
    last_user = max(i for i, m in enumerate(messages) if m.get("role") == "user")
    messages[last_user]["content"] = episode.prompt(str(messages[last_user]["content"]))
    return messages


@dataclass(frozen=True, kw_only=True)
class Judgement:
    """What a judge hands back for one answer: the code judged (None: no complete code block),
    its result (None exactly when code is None), where it is stored, the turn's own reward, and
    the task's torch.compile ratio the verdict text compares with."""

    code: str | None
    result: EvalResult | None
    candidate_id: int | None = None
    reward: float | None = None
    compile_speedup: float | None = None
    compile_ci: tuple[float, float] | None = None


# The prompts of `Ask` and `Judge` stay `Any`: a caller's own function may take a narrower kind
# of prompt than `turn_prompt` makes (kernelrl.train.bench_turns asks with plain ones only).
class Ask(Protocol):
    """Answers for a batch of prompts: `(turn, episode indices, prompts) -> answers`, one per
    prompt, None where there is none (a finite proposer ran out: that episode ends there)."""

    def __call__(self, turn: int, live: Sequence[int], prompts: Sequence[Any], /) -> Sequence[str | None]: ...


class Judge(Protocol):
    """Verdicts for a batch of answers: `(turn, episode indices, prompts, answers) -> judgements`,
    one per answer, in order (the caller judges, stores and pays them)."""

    def __call__(self, turn: int, asked: Sequence[int], prompts: Sequence[Any], answers: Sequence[str], /
                 ) -> Sequence[Judgement]: ...


def run_episodes(episodes: Sequence[Episode], bases: Sequence[str | Sequence[Mapping[str, object]]], *, ask: Ask,
                 judge: Judge) -> list[list[float | None]]:
    """The turn loop, for fresh `episodes` run side by side (`bases[i]`: episode i's turn-1
    prompt, plain or chat). Each turn: every live episode's prompt (its base and its history
    within the budget, `turn_prompt`), one `ask` for all of them, one `judge` of every
    answer given, each verdict recorded in its episode (the next turn reads it). An episode ends
    after its turns or when `ask` gives it no answer; the loop ends when none is live. Returns
    each episode's discounted returns (from the rewards the judge paid)."""
    if len(bases) != len(episodes):
        raise ValueError(f"{len(bases)} prompts for {len(episodes)} episodes")
    if any(ep.turns for ep in episodes):
        raise ValueError("run_episodes starts episodes: every episode must be fresh")
    ended: set[int] = set()
    for turn in range(1, max((ep.config.turns for ep in episodes), default=0) + 1):
        live = [i for i, ep in enumerate(episodes) if not ep.done and i not in ended]
        prompts = [turn_prompt(episodes[i], bases[i]) for i in live]
        answers = ask(turn, live, prompts) if live else []
        if len(answers) != len(live):
            raise ValueError(f"turn {turn}: {len(answers)} answers for {len(live)} prompts")
        ended |= {i for i, a in zip(live, answers) if a is None}
        asked = [(i, p, a) for i, p, a in zip(live, prompts, answers) if a is not None]
        if not asked:
            break
        verdicts = judge(turn, [i for i, _, _ in asked], [p for _, p, _ in asked], [a for _, _, a in asked])
        if len(verdicts) != len(asked):
            raise ValueError(f"turn {turn}: {len(verdicts)} verdicts for {len(asked)} answers")
        for (i, _, a), v in zip(asked, verdicts):
            episodes[i].record(a, v.code, v.result, compile_speedup=v.compile_speedup, compile_ci=v.compile_ci,
                               candidate_id=v.candidate_id, reward=v.reward)
    return [ep.returns() for ep in episodes]


__all__ = ["Ask", "Judge", "Judgement", "run_episodes", "turn_prompt"]
