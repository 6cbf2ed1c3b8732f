"""`kernelrl optimize` as a library call: the search's run built, run and closed.

`optimize(config)` stands beside `kernelrl.train.collect.collect`, `kernelrl.train.bench.run_bench`
and `kernelrl.train.recipe.run_stage`: each builds its run with `kernelrl.run_parts.build_run`
(which owns the run's row, database, judge, proposers and page) and drives it. Here the driver is
`kernelrl.search.loop.run_search`, whose docstring states the search's guarantees.

Does not print the report (`kernelrl.report`), and does not check what the command line checks
before a worker starts (`kernelrl.cli.search.preflight`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from rich.console import Console

from kernelrl.run_parts import build_run
from kernelrl.search.activity import waiting
from kernelrl.search.config import SearchConfig
from kernelrl.search.loop import run_search
from kernelrl.search.summary import SearchSummary

if TYPE_CHECKING:
    from kernelrl.judge.contract import BatchJudge, ProfilingJudge
    from kernelrl.proposers import Proposer
    from kernelrl.search.judging import BaselineFn
    from kernelrl.search.scheduler import PromptFn
    from kernelrl.tasks.task import Task


def optimize(config: SearchConfig, *, tasks: Sequence[Task] | None = None, console: Console | None = None,
             judge: BatchJudge | None = None, proposer: Proposer | None = None, build_prompt: PromptFn | None = None,
             measure_baseline: BaselineFn | None = None) -> SearchSummary:
    """`kernelrl optimize` as a library call: build the run (`kernelrl.run_parts.build_run`: the
    database at `config.db_path` with `tasks` registered, the run's row, new or with
    `config.resume` the latest search's, the judge, the proposer, the run page), run the search
    (`kernelrl.search.loop.run_search`) and close the run; return what it did.

    `tasks` default to `config.tasks` loaded; `judge` and `proposer` replace the configured ones
    (and are not closed here); `console` is where the run speaks (none: it prints nothing);
    `build_prompt(...)` replaces `kernelrl.episodes.prompt.build_prompt`; `measure_baseline` is the
    baseline of a judge that gives none itself (`kernelrl.search.loop.run_search`). Tasks that
    cannot make a run (none, or two of one name) are refused (`ValueError`) before the database is
    opened.
    """
    if tasks is None:
        from kernelrl.tasks.suites import load_tasks

        tasks = load_tasks(list(config.tasks))
    tasks = list(tasks)
    if not tasks:
        raise ValueError(f"no tasks found for {', '.join(config.tasks)}")
    names = [t.name for t in tasks]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate task names: {sorted({n for n in names if names.count(n) > 1})}")
    # the task names are stored with the run so a report counts a task that got no candidate
    record = {**config.to_json(), "task_names": names}
    # The run's builder holds a judge that profiles tasks (what bench and training ask); the search
    # asks only a `SearchJudge` for profiles, so any `BatchJudge` serves it.
    given = cast("ProfilingJudge | None", judge)
    with build_run(tasks=tasks, eval_config=config.judge_config(), db_path=config.db_path, judge=given,
                   proposers={config.proposer: proposer} if proposer is not None else None, console=console,
                   watch=config.watch, record=record, resume=config.resume) as run:
        run.proposer(config.proposer, **config.proposer_options())  # first: a bad spec fails before any worker
        with waiting(run.console, "starting the evaluator"):
            run.judge  # noqa: B018 - built now, so the wait is said
        return run_search(config, run, build_prompt=build_prompt, measure_baseline=measure_baseline)
