"""The batch shaper: a global batch's raw rewards in, what TRL trains on out. A pure function.

`shape_batch(every, ...)` takes the global batch as every rank holds it after the gather (each
rank's `Scored` rows, concatenated in rank order: TRL's order of the generation batch), the clip
windows as they stood before the batch and GRPO-RoC's generator state, and returns:

- the groups: the batch cut into groups of `group_size` rows (TRL's `num_generations`), each of
  one task and one prompt whatever rank holds it, or a `TaskMismatch` (without `group_size`, runs
  of equal keys);
- the clipped rewards: CUDA-L1's smoothing, one band per task per batch from the windows before
  it, damped from above only (`kernelrl.reward.clip_with`), and the windows with the batch appended;
- GRPO-RoC's choice in each group (`kernelrl.train.roc.select`, with the generator state given)
  and the state after;
- per row, why it trains on nothing (`Exclusion`: no reward, or dropped by RoC).

Being a function of its arguments only, every rank computes the same result from the same
gathered batch, and a test can replay any batch.

Does not judge or score (`kernelrl.train.scorer`), gather (the reward function does, through
`kernelrl.train.ranks`), or store (`kernelrl.train.effects`).
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kernelrl.result import Status
from kernelrl.reward import Reward, SmoothingConfig, Windows, clip_with
from kernelrl.train.roc import RoCConfig, groups, select
from kernelrl.train.scorer import Exclusion, Scored


class TaskMismatch(RuntimeError):
    """A completion would be scored against a task other than the one its prompt came from."""


@dataclass(frozen=True, kw_only=True)
class Shaped:
    """What one global batch trains on, and the state it leaves."""

    groups: tuple[tuple[int, ...], ...]  # indices into the batch
    rewards: tuple[Reward | None, ...]  # clipped; None: no reward
    kept: tuple[bool, ...]  # trained on (RoC's choice; False for every row without a reward)
    excluded: tuple[Exclusion | None, ...]  # why a row trains on nothing
    windows: Windows  # the clip windows after the batch
    rng_state: Any  # GRPO-RoC's generator after the batch (`random.Random.getstate()`)

    @property
    def values(self) -> list[float | None]:
        """What TRL is handed: the clipped reward of a kept row, None for every other."""
        return [r.value if r is not None and k else None for r, k in zip(self.rewards, self.kept)]

    def group_of(self) -> dict[int, int]:
        return {i: g for g, members in enumerate(self.groups) for i in members}


def cut_groups(rows: Sequence[tuple[int, str, str]], step: int, group_size: int | None) -> list[list[int]]:
    """A global batch's groups from its rows' (rank, task, key), in order: groups of `group_size`
    (runs of equal keys without one); each must hold one task and one prompt, whatever rank
    holds it, or the call is a `TaskMismatch`."""
    if group_size is None:
        return groups([(task, key) for _, task, key in rows])
    if len(rows) % group_size:
        raise TaskMismatch(f"step {step}: {len(rows)} rows in the global batch is not a whole number of groups "
                           f"of {group_size}")
    out = [list(range(i, i + group_size)) for i in range(0, len(rows), group_size)]
    for g, members in enumerate(out):
        seen = {rows[i][1:] for i in members}
        if len(seen) > 1:
            held = ", ".join(f"{rows[i][1]}#{rows[i][2][:8]} (rank {rows[i][0]})" for i in members)
            raise TaskMismatch(f"step {step}: group {g} mixes prompts: {held}; completions would be scored "
                               "against another task (are the ranks' prompt streams shared?)")
    return out


def shape_batch(every: Sequence[Scored], *, step: int, group_size: int | None, windows: Windows,
                smoothing: SmoothingConfig, roc: RoCConfig, rng_state: Any) -> Shaped:
    """The global batch shaped (see the module docstring)."""
    parts = cut_groups([(s.rank, s.task, s.key) for s in every], step, group_size)
    rewards, after = clip_with(windows, [(s.reward, s.task, s.level) for s in every], smoothing)
    rng = random.Random()
    rng.setstate(rng_state)
    kept = [r is not None for r in rewards]
    if roc.enabled:
        kept = [False] * len(every)
        for members in parts:
            raws = [r.raw if (r := rewards[i]) is not None else None for i in members]
            for i, keep in zip(members, select(raws, [every[i].problems for i in members], roc, rng)):
                kept[i] = keep
    excluded = [s.excluded if rewards[i] is None else (None if kept[i] else Exclusion.DROPPED)
                for i, s in enumerate(every)]
    return Shaped(groups=tuple(tuple(p) for p in parts), rewards=tuple(rewards), kept=tuple(kept),
                  excluded=tuple(excluded), windows=after, rng_state=rng.getstate())


def batch_metrics(every: Sequence[Scored], shaped: Shaped) -> dict[str, float]:
    """TRL metrics of one global batch (the same on every rank): means of raw and trained-on
    rewards, shares of outcomes, and how many rows trained on nothing, by why."""
    n = max(1, len(every))
    scored = [r for r in shaped.rewards if r is not None]
    values = [v for v in shaped.values if v is not None]
    out = {
        "kernelrl/raw_reward": statistics.fmean(r.raw for r in scored) if scored else 0.0,
        "kernelrl/clipped_reward": statistics.fmean(values) if values else 0.0,
        "kernelrl/clipped_share": sum(r.clipped for r in scored) / n,
        "kernelrl/correct_share": sum(s.correct for s in every) / n,
        "kernelrl/flagged_share": sum(r.status is Status.FLAGGED for r in scored) / n,
        "kernelrl/no_code_share": sum(r.status is None for r in scored) / n,
        "kernelrl/kept_share": sum(shaped.kept) / n,
        "kernelrl/within_noise_share": sum(r.within_noise for r in scored) / n,
        "kernelrl/copy_share": sum(r.copy for r in scored) / n,
        "kernelrl/excluded": float(sum(e is not None for e in shaped.excluded)),
    }
    for why in Exclusion:
        out[f"kernelrl/excluded/{why.value}"] = float(sum(e is why for e in shaped.excluded))
    return out
