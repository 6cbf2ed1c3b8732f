"""A search the way `kernelrl optimize` runs one: the run's parts from its builder, then the search."""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

from rich.console import Console

from kernelrl.judge.contract import BatchJudge
from kernelrl.run_parts import build_run
from kernelrl.search.config import SearchConfig
from kernelrl.search.loop import run_search
from kernelrl.search.proposers import Proposer
from kernelrl.search.summary import SearchSummary
from kernelrl.tasks.task import Task


def searched(cfg: SearchConfig, *, tasks: Sequence[Task], judge: BatchJudge | None = None,
             proposer: Proposer | None = None, console: Console | None = None, **options: Any) -> SearchSummary:
    """Run `cfg`'s search of `tasks` through `build_run` (its database, judge, proposer and console);
    `judge` and `proposer` replace the configured ones, `options` go to `run_search`."""
    with build_run(tasks=tasks, eval_config=cfg.judge_config(), db_path=cfg.db_path, judge=judge,
                   proposers={cfg.proposer: proposer} if proposer is not None else None,
                   console=console or Console(file=io.StringIO()), watch=cfg.watch) as run:
        assert run.db is not None
        return run_search(cfg, tasks=run.tasks, db=run.db, judge=run.judge,
                          proposer=run.proposer(cfg.proposer, **cfg.proposer_options()),
                          console=run.reporter.console, **options)
