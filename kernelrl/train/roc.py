"""GRPO-RoC (Resample-on-Correct, rStar2-Agent): oversample a group, train on a chosen part.

TRL samples `num_generations` rollouts per prompt; with RoC on, that is the *oversampled* group
(e.g. 16 for a kept group of 8, `keep = 0.5`). `select` chooses which rollouts of a group train:

- rollouts split into positives (raw reward above `positive_above`) and negatives (the rest);
  rollouts without a reward (a `task_error`) are never kept;
- each side keeps its share of the kept group in proportion to its share of the sampled one,
  floored at `min_per_side` (while the side has that many), the other side giving way;
- negatives are drawn uniformly (their diversity is the lesson); positives are taken cleanest
  first: fewest problems in the answer (`problems`: a malformed answer, extra code blocks,
  warnings the static checks raised on its code, a completion cut at the length limit), then the
  higher reward. A dynamic warning (a roofline floor beaten, say) speaks of the measurement, not
  of the answer's cleanliness, and is not counted: it comes with being fast (a kernel that skips
  a task's redundant work beats the floor counted from the reference's work), and counting it
  made RoC drop the fastest correct rollouts first, so a policy learned to prefer a slower
  kernel (seen in benchmarks/learning_check.py on two processes).

The dropped rollouts get no reward (None): TRL leaves them out of the group's mean and spread and
gives them zero advantage, so they do not move the policy; the kept ones are normalised among
themselves. Costs to know: the dropped rollouts still pass through TRL's forward and backward
(with zero weight), and the token-normalised losses (`dapo`, `bnpo`, `grpo`) count their tokens,
so the effective step is about `keep` times TRL's; raise the learning rate to match if it
matters. With several processes a group can be split between them; each part is selected on
its own with the same shares.

Does not sample: TRL does, `num_generations` per prompt.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from kernelrl.candidate import fenced_blocks
from kernelrl.checks.rules import STATIC_RULES
from kernelrl.result import EvalResult, Severity
from kernelrl.reward import well_formed


@dataclass(frozen=True, kw_only=True)
class RoCConfig:
    enabled: bool = False  # GRPO-RoC on: sample the group oversampled, train on the part it keeps
    keep: float = 0.5  # share of each sampled group that trains (0.5: TRL samples twice the kept group)
    min_per_side: int = 2  # each of positives and negatives keeps at least this many when it has them
    positive_above: float = 0.0  # a raw reward above this is a positive

    def __post_init__(self) -> None:
        if not 0 < self.keep <= 1:
            raise ValueError("keep must be in (0, 1]")
        if self.min_per_side < 0:
            raise ValueError("min_per_side must be >= 0")


def problems(answer: str, result: EvalResult | None, *, truncated: bool = False) -> int:
    """How unclean a rollout is: format problems, extra code blocks, static check warnings, truncation."""
    n = 0 if well_formed(answer) else 1
    n += max(0, len(fenced_blocks(answer)) - 1)
    if result is not None:
        n += sum(1 for f in result.findings if f.severity is Severity.WARN and f.rule in STATIC_RULES)
    return n + (1 if truncated else 0)


def select(raws: Sequence[float | None], problem_counts: Sequence[int], config: RoCConfig,
           rng: random.Random) -> list[bool]:
    """Which rollouts of one group train (see the module docstring)."""
    if len(raws) != len(problem_counts):
        raise ValueError("one problem count per rollout")
    valid = [i for i, r in enumerate(raws) if r is not None]
    if not config.enabled or not valid:
        return [r is not None for r in raws]
    k = min(max(1, round(len(raws) * config.keep)), len(valid))
    pos = [i for i in valid if raws[i] > config.positive_above]  # type: ignore[operator]
    neg = [i for i in valid if raws[i] <= config.positive_above]  # type: ignore[operator]
    lo_pos = min(config.min_per_side, len(pos), k)
    lo_neg = min(config.min_per_side, len(neg), k - lo_pos)
    n_pos = min(max(round(k * len(pos) / len(valid)), lo_pos), k - lo_neg, len(pos))
    n_neg = min(k - n_pos, len(neg))
    n_pos = min(len(pos), k - n_neg)  # negatives ran short: positives fill the group
    cleanest = sorted(pos, key=lambda i: (problem_counts[i], -raws[i], i))[:n_pos]  # type: ignore[operator]
    kept = set(cleanest) | set(rng.sample(neg, n_neg))
    return [i in kept for i in range(len(raws))]


def groups(keys: Sequence[object]) -> list[list[int]]:
    """Runs of equal consecutive keys: TRL puts a prompt's rollouts next to each other."""
    out: list[list[int]] = []
    for i, key in enumerate(keys):
        if out and keys[out[-1][0]] == key:
            out[-1].append(i)
        else:
            out.append([i])
    return out
