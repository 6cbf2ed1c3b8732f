"""Throughput: how fast a run judged, as a figure people can track.

`Throughput.of(results, wall_s)` counts the results judged in a span of wall time (the caller
passes the ones its judge gave then, not verdicts reused from a database or another sample of the
same program; a result the evaluator handed out again from its result cache, `Environment.cached`,
is left out here) and sums where their timing groups' time went (`GroupPhases`), each group once
(`Environment.group`: the results of one group share its phases).

Guarantees: evaluations per hour is count / wall time, nothing else; a group's phases are counted
once however many of its results are passed. Does not: tell the judge's own time from the time a
proposer or trainer held the machine meanwhile (the wall time is the caller's span), or count a
result without a group (refused by reading it: no worker ran) in the phases.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, fields

from kernelrl.result import EvalResult, GroupPhases

# The consecutive parts of a group's wall time, in the order a group goes through them; every other
# field of `GroupPhases` looks inside one of them.
WALL_PHASES = ("queued_s", "reference_load_s", "reference_outputs_s", "candidate_checks_s", "timing_pool_s", "timing_s",
               "verdict_s")


@dataclass(frozen=True, kw_only=True)
class Throughput:
    evaluations: int  # results judged in the span
    wall_s: float  # the span, seconds
    groups: int  # timing groups among them
    phases: GroupPhases  # summed over those groups

    def __post_init__(self) -> None:
        if self.evaluations < 0 or self.wall_s < 0 or self.groups < 0:
            raise ValueError("evaluations, wall time and groups cannot be negative")

    @property
    def per_hour(self) -> float | None:
        """Evaluations per hour of the span (None for an empty span)."""
        return self.evaluations / self.wall_s * 3600 if self.wall_s > 0 else None

    @classmethod
    def of(cls, results: Iterable[EvalResult], wall_s: float) -> Throughput:
        counted = [r for r in results if not r.environment.cached]
        seen: dict[str, GroupPhases] = {}
        for r in counted:
            env = r.environment
            if env.group and env.phases is not None:
                seen.setdefault(env.group, env.phases)
        total = {f.name: round(sum(getattr(p, f.name) for p in seen.values()), 3) for f in fields(GroupPhases)}
        return cls(evaluations=len(counted), wall_s=round(wall_s, 3), groups=len(seen), phases=GroupPhases(**total))

    @property
    def group_wall_s(self) -> float:
        """The groups' wall times, summed (groups run side by side, so this can exceed the span)."""
        return float(sum(getattr(self.phases, name) for name in WALL_PHASES))

    def split(self) -> list[tuple[str, float, float | None]]:
        """(phase, seconds, share of `group_wall_s`) for every phase that took time: the consecutive
        ones first, in a group's order, then the ones that look inside them."""
        wall = self.group_wall_s
        names = [*WALL_PHASES, *(f.name for f in fields(GroupPhases) if f.name not in WALL_PHASES)]
        return [(name.removesuffix("_s"), getattr(self.phases, name), getattr(self.phases, name) / wall if wall else None)
                for name in names if getattr(self.phases, name)]

    def describe(self) -> str:
        """One line: "32 evaluations in 412 s: 280 an hour; 4 groups: reference_load 12.1 (8%), ...". """
        rate = f"{self.per_hour:.0f} an hour" if self.per_hour is not None else "no time"
        parts = [f"{name} {s:.1f}" + (f" ({share:.0%})" if share is not None else "") for name, s, share in self.split()]
        return (f"{self.evaluations} evaluations in {self.wall_s:.0f} s: {rate}; {self.groups} groups"
                + (": " + ", ".join(parts) if parts else ""))

    def to_dict(self) -> dict[str, object]:
        return {"evaluations": self.evaluations, "wall_s": self.wall_s, "per_hour": self.per_hour,
                "groups": self.groups, "phases": dataclasses.asdict(self.phases)}
