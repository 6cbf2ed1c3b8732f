"""The static rules' registry: rule name -> the function that finds its hits.

Guarantees: every entry of `CHECKS` carries its `Rule` from `kernelrl.checks.rules` (name,
description, default severity), in the order `rules.py` lists them; a name that is not a static
rule there, or one registered twice, fails at import. Rule functions yield `Hit`s (a line and a
message); `check_source` (`scan.py`) turns them into findings.

Does not guarantee that every static rule has a function: `CHECKS` fills as the rule family
modules are imported (`scan.py` imports them all), and a test checks the two lists agree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kernelrl.checks import rules as R
from kernelrl.checks.static.source import SourceInfo


@dataclass(frozen=True)
class Hit:
    line: int | None
    message: str


RuleFunction = Callable[[SourceInfo], Iterable[Hit]]


@dataclass(frozen=True)
class Check:
    rule: R.Rule
    run: RuleFunction

    @property
    def name(self) -> str:
        return self.rule.name


CHECKS: dict[str, Check] = {}
_ORDER = {name: i for i, name in enumerate(R.STATIC_RULES)}


def register(name: str) -> Callable[[RuleFunction], RuleFunction]:
    """Register a check function under a static rule name from `kernelrl.checks.rules`."""
    rule = R.STATIC_RULES[name]

    def deco(fn: RuleFunction) -> RuleFunction:
        if name in CHECKS:
            raise ValueError(f"static rule {name} registered twice")
        CHECKS[name] = Check(rule=rule, run=fn)
        # kept in rules.py's order, whatever order the family modules are imported in
        for key in sorted(CHECKS, key=_ORDER.__getitem__):
            CHECKS[key] = CHECKS.pop(key)
        return fn

    return deco
