"""A search the way `kernelrl optimize` runs one: `kernelrl.optimize.optimize`, with a quiet console."""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

from rich.console import Console

from kernelrl.judge.contract import BatchJudge
from kernelrl.optimize import optimize
from kernelrl.proposers import Proposer
from kernelrl.search.config import SearchConfig
from kernelrl.search.summary import SearchSummary
from kernelrl.tasks.task import Task


def searched(cfg: SearchConfig, *, tasks: Sequence[Task], judge: BatchJudge | None = None,
             proposer: Proposer | None = None, console: Console | None = None, **options: Any) -> SearchSummary:
    """Run `cfg`'s search of `tasks` through `optimize` (the run's builder: its database, row, judge,
    proposer and console); `judge` and `proposer` replace the configured ones, `options` go to `run_search`."""
    return optimize(cfg, tasks=tasks, judge=judge, proposer=proposer, console=console or Console(file=io.StringIO()),
                    **options)
