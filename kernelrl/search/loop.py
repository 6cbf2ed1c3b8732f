"""The search: parallel self-improving chains per task over the code database.

Each task gets `chains` chains. A chain's step builds a contrastive prompt around the chain's
current best (the first step starts from the reference), asks the proposer, stores the answer as
a candidate, evaluates it and stores the verdict; every `exchange_every` steps a chain adopts the
task's best of this run when that is better than its own. Chains of all tasks run at once: model
calls run on `model_concurrency` threads, and candidates waiting for a verdict are judged in
batches (`Evaluator.evaluate_batch`: candidates of one task are timed together with their
reference) while model calls go on: one batch at a time, or with an in-process evaluator the next
batch, of the tasks with no group under way, while the last one's slowest groups finish. A batch
starts when no model call is under way or when its oldest candidate has waited `batch_wait_s`. Only the calling thread
touches the database, so each write is one committed transaction from one writer.

`run_search` puts the search's parts together and runs them; each part's docstring states its guarantees:
- `kernelrl.search.state`: the run (new or resumed), each task's chains, tokens spent, what
  counts as better;
- `kernelrl.search.scheduler`: what the model is asked next, budgets, the event loop, Ctrl-C;
- `kernelrl.search.judging`: candidates, baselines and task profiles sent to the judge;
- `kernelrl.search.workers`: the threads of blocking calls and their event queue;
- `kernelrl.search.output`: the database writes, the console (errors, bars, status line), the
  summary.

Budgets: `budget` is candidates (model answers) per task in this run, split evenly over the
task's chains (budget 8 with 2 chains: 4 steps each; the remainder goes to the first chains), so
a run is `chains` x `budget / chains` steps per task; `token_budget` is prompt plus
completion tokens over the whole run (a resumed run counts what it spent before); `wall_time_s`
is per invocation. When a budget runs out no new model call starts and the calls and evaluations
already under way finish and are stored.

Guarantees:
- a source already evaluated for a task (same device, size and policy) is never evaluated again:
  the stored result is reused, and two chains proposing the same source at once share one
  evaluation;
- `resume=True` continues the database's latest search run (not a bench's, a collection's or a
  training stage's in the same file): candidates stored but not evaluated are
  evaluated without asking the model again, and chain state (step, current best) is rebuilt from
  the stored candidates (a chain's best at its last step is that step's parent);
- Ctrl-C stops new work and lets what is under way finish and be stored; a second Ctrl-C leaves
  at once (unfinished evaluations stay `proposed` and a resume evaluates them).
- nothing waits silently (`kernelrl.search.activity`); a verdict is stored when its group ends.
- the run's row, database, judge, proposer and console are the run's: its builder
  (`kernelrl.run_parts.build_run`, called by `kernelrl.optimize.optimize`) opens the row (new, or the latest search's
  reopened), registers the tasks in the database, and closes them all (the row `finished`,
  `interrupted`, or `failed` when the search raised); the search opens nothing of its own.

Task code never runs in the search's process: each task's profile (constants, shapes, what its
model is) comes from the evaluator's reference worker before the task's first prompt; a task
whose reference hangs, crashes or fails is given up with its reason and the others go on.

Baselines (eager and torch.compile times) are measured once per task, device and size, inside
the task's first timing group (`EvalConfig.compile_baseline`), and stored. With an injected
`measure_baseline`, they are measured first instead, and a task's first prompt waits for them.

Does not guarantee: that an evaluation running when the process was SIGKILLed is not run again on
resume (its result never reached the database); fairness between tasks beyond round-robin order.
"""

from __future__ import annotations

from typing import Protocol

from rich.console import Console

from kernelrl.judge.contract import BatchJudge, SearchJudge
from kernelrl.judge.eval_config import config_fingerprint
from kernelrl.judge.harness.device import DevicePeaks
from kernelrl.judge.timing.roofline import prompt_peaks
from kernelrl.proposers import Proposer
from kernelrl.search.activity import lock_watch, waiting
from kernelrl.search.config import SearchConfig
from kernelrl.search.judging import BaselineFn, Judging
from kernelrl.search.output import RunOutput
from kernelrl.search.scheduler import PromptFn, Scheduler
from kernelrl.search.state import open_run
from kernelrl.search.summary import SearchSummary, StopReason
from kernelrl.search.workers import Workers
from kernelrl.store import Database
from kernelrl.tasks.task import Task

__all__ = ["SearchConfig", "SearchRun", "SearchSummary", "StopReason", "run_search"]


class SearchRun(Protocol):
    """What a search is given of its run (`kernelrl.run_parts.RunParts` is one): its tasks, its
    code database and row, its judge, its proposers and where it speaks."""

    tasks: list[Task]
    db: Database | None
    run_id: int | None
    resumed: bool

    @property
    def judge(self) -> BatchJudge: ...

    @property
    def console(self) -> Console: ...

    def proposer(self, spec: str, *, label: str | None = None, **opts: object) -> Proposer: ...

    def mark_interrupted(self) -> None: ...




def run_search(config: SearchConfig, run: SearchRun, *, build_prompt: PromptFn | None = None,
               measure_baseline: BaselineFn | None = None) -> SearchSummary:
    """Run (or continue, when the run's row was reopened) a search of the run's tasks; return what it did.

    `run` is the run's parts (`kernelrl.run_parts.build_run`, given the search's record:
    `kernelrl.optimize.optimize` builds it), which it opens and closes: its row, its code database
    (`config.db_path`) with its tasks registered, its console. Its judge judges candidates: an in-process
    `kernelrl.judge.evaluator.Evaluator` (built from `config.judge_config()`), or any judge with
    what `kernelrl.judge.contract.SearchJudge` names, gives baselines from each task's first timing
    group, results as each group ends, the machine's peaks and each task's shapes for prompts; any
    other `BatchJudge` is used for its verdicts (task profiles and baselines then come only from
    `measure_baseline(task)` when it is given). Its proposer for `config.proposer` (with
    `config.proposer_options()`) answers the prompts. `build_prompt(...)` replaces
    `kernelrl.episodes.prompt.build_prompt`. A run stopped by Ctrl-C has its row closed `interrupted`.
    """
    db = run.db
    if db is None or run.run_id is None:
        raise ValueError("a search stores its run: build its parts with a database and the search's record "
                         "(kernelrl.optimize.optimize does)")
    tasks = run.tasks
    console = run.console
    if build_prompt is None:
        from kernelrl.episodes.prompt import build_prompt as default_build_prompt

        build_prompt = default_build_prompt
    proposer = run.proposer(config.proposer, **config.proposer_options())
    judge: BatchJudge = run.judge
    evaluator = judge if isinstance(judge, SearchJudge) else None
    profile = known_baseline = None
    device: DevicePeaks | None = None
    fingerprint = config_fingerprint(config.eval)
    if evaluator is not None:
        fingerprint = evaluator.fingerprint
        profile = evaluator.profile
        known_baseline = evaluator.cached_baseline
        with waiting(console, "this machine's peak bandwidth and FLOP/s (measured once, then cached)",
                     lock_watch(evaluator)):
            peaks = evaluator.peaks()  # prompts state them
        if peaks is not None:
            device = prompt_peaks(peaks, config.eval.device)
    if not config.baselines:
        measure_baseline = None
    state = open_run(config, tasks, db, run_id=run.run_id, resumed=run.resumed)
    out = RunOutput(state, db, console, fingerprint=fingerprint, known_baseline=known_baseline,
                    watch=lock_watch(evaluator) if evaluator is not None else None)
    workers = Workers(config.model_concurrency)
    # a streaming evaluator hands each result over as soon as its group ends
    judging = Judging(state, out, db, workers, evaluate_batch=judge.evaluate_batch, streams=evaluator is not None,
                      measure_baseline=measure_baseline, profile=profile)
    scheduler = Scheduler(state, out, judging, workers, db, proposer=proposer, build_prompt=build_prompt,
                          device=device)
    scheduler.drive()
    if state.stop_reason is StopReason.INTERRUPTED:
        run.mark_interrupted()
    return out.summary()
