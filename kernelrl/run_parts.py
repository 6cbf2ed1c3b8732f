"""A run's parts, built from their configs in one place and closed by whoever built them.

A run (`optimize`, `collect`, `bench`, `train`) is tasks, a judge, a code database, proposers and
a reporter. `build_run` builds each from its config and owns their lifetimes, so no command
assembles them by hand:

    with build_run(tasks=tasks, eval_config=config.eval, db_path=config.db_path, console=console,
                   watch=config.watch, record={"stage": "bench", ...}) as run:
        answer = run.proposer("openai:m", temperature=0.7)
        results = run.judge.evaluate_batch(items)
        run.say(f"run {run.run_id}: ...")

Guarantees:
- the code database (when a path is given) is opened once, and every task is registered in it
  at the run's size before the block starts (`register_tasks=False`: a training rank other than
  the main one, which only reads);
- a run given its `record` (what its command stores of its config) owns its row in the database:
  the row is written before the block starts (with `resume`, the database's latest run of the
  same stage, `record["stage"]`, none for a search, is reopened under the new record, and
  `resumed` says so; none found, a new row), and closed as the block ends: `finished`,
  `interrupted` on Ctrl-C (`KeyboardInterrupt`, or `mark_interrupted()` by a command that stops
  on Ctrl-C without raising), `failed` on any other error (which goes on). A row is written only
  over tasks registered as the run's (source and size): a task registered otherwise is refused
  (`ValueError`) before anything is written, since results stored for it would be judged against
  a task the database does not describe;
- the judge is built on first use, so a run with nothing left to judge starts no worker, by
  `kernelrl.backends.judges.make_judge`: the reward server's client when `backend.url` is set, else
  an in-process `Evaluator` of `eval_config`. `reuse_stored` says whether verdicts stored
  under the run's evaluator settings stand for this judge's (not for a reward server's: its device
  is its own);
- the reporter is what the run tells people: its console (progress, notices; a run given none
  prints nothing) and, when `watch.port` is set, the run page of its database
  (`kernelrl.web.live.LivePage`) served while the block runs, its address said on the console.
  The port is bound before the judge or a proposer is built, so a taken port fails first
  (`OSError`); with a row, the run's own page is said too. `say` is the console's print (a run
  given no console prints nothing);
- a proposer is built on the first ask for its spec and options, once, with the run's policy and
  device;
- everything built here is closed when the block ends, the last built first (the row before the
  page, so an open page shows how the run ended), whatever happened; what the caller hands in (a
  judge, proposers: its own, or a test's) is used and never closed.

Does not load or select tasks (each command chooses its split and says what it left out), and
runs nothing: the commands drive the parts (`kernelrl.search.loop.run_search` is given them).
The reward server (`kernelrl serve`) is not a run (no tasks, database or proposer of its own): it
shares the judge's builder, `kernelrl.backends.judges.make_judge`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from kernelrl.backends.judges import BackendConfig, make_judge
from kernelrl.store.records import RunStatus
from kernelrl.web.config import WatchConfig

if TYPE_CHECKING:
    from kernelrl.judge.contract import OwnedJudge, ProfilingJudge
    from kernelrl.judge.eval_config import EvalConfig
    from kernelrl.proposers import Proposer
    from kernelrl.store import Database
    from kernelrl.tasks.task import Task
    from kernelrl.web.live import LivePage


class Reporter:
    """What a run tells people (see the module docstring): `console`, and `page_url` while its run
    page is served (None without one)."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.page: LivePage | None = None  # set by `build_run` once the page answers

    @classmethod
    def quiet(cls) -> Reporter:
        """A reporter that tells no one (a part built outside a run, by a test)."""
        return cls(Console(quiet=True))

    @property
    def page_url(self) -> str | None:
        return self.page.url if self.page is not None else None

    def say(self, text: str) -> None:
        self.console.print(text)


class RunParts:
    """The parts of one run (see the module docstring); made by `build_run`, valid inside its block."""

    def __init__(self, *, tasks: Sequence[Task], eval_config: EvalConfig, backend: BackendConfig,
                 db: Database | None, judge: ProfilingJudge | None, proposers: Mapping[str, Proposer],
                 reporter: Reporter, closing: contextlib.ExitStack) -> None:
        self.tasks = list(tasks)
        self.reporter = reporter
        self.run_id: int | None = None  # the run's row, when it was given a record
        self.owns_row = False  # written here, so closed here (`adopt_row`: another process's)
        self.resumed = False  # the row is an earlier run's, reopened
        self.interrupted = False  # stopped on Ctrl-C without raising (`mark_interrupted`)
        self.eval_config = eval_config
        self.backend = backend
        self.db = db
        self._judge = judge
        self._given_judge = judge is not None
        self._given = dict(proposers)
        self._made: dict[tuple[str, tuple[tuple[str, object], ...]], Proposer] = {}
        self._closing = closing

    def say(self, text: str) -> None:
        """Tell the run's people (its console; nothing when it was given none)."""
        self.reporter.say(text)

    @property
    def console(self) -> Console:
        """The run's console (a quiet one when it was given none)."""
        return self.reporter.console

    def adopt_row(self, run_id: int) -> None:
        """The run's row as another process wrote it (a training rank other than the main one, told
        the main one's id): its records go under it; it is closed by the process that wrote it."""
        if self.owns_row and self.run_id != run_id:
            raise ValueError(f"this run wrote its own row ({self.run_id}), not {run_id}")
        self.run_id = run_id

    def mark_interrupted(self) -> None:
        """The run stopped on Ctrl-C and returns normally (a search lets what is under way finish):
        its row closes `interrupted`, not `finished`."""
        self.interrupted = True

    @property
    def judge(self) -> ProfilingJudge:
        """The run's judge, built on first use (see the module docstring)."""
        if self._judge is None:
            made: OwnedJudge = make_judge(self.eval_config, self.backend)
            self._closing.callback(made.close)
            self._judge = made
        return self._judge

    @property
    def judge_started(self) -> bool:
        return self._judge is not None

    @property
    def reuse_stored(self) -> bool:
        """Whether verdicts stored under the run's evaluator settings stand for this judge's: a
        reward server judges on its own device, so its verdicts and ours are not interchangeable."""
        return self._given_judge or not self.backend.url

    def proposer(self, spec: str, *, label: str | None = None, **opts: object) -> Proposer:
        """The proposer of `spec` with `opts`, built once with the run's policy and device; one the
        caller handed in under `label` (or under `spec`) is returned as it is."""
        given = self._given.get(label or spec)
        if given is not None:
            return given
        key = (spec, tuple(sorted(opts.items(), key=lambda kv: kv[0])))
        if key not in self._made:
            from kernelrl.proposers import make_proposer

            made = make_proposer(spec, policy=self.eval_config.policy, device=self.eval_config.device, **opts)
            self._closing.callback(made.close)
            self._made[key] = made
        return self._made[key]


@contextlib.contextmanager
def build_run(*, tasks: Sequence[Task], eval_config: EvalConfig, db_path: Path | str | None = None,
              backend: BackendConfig | None = None, register_tasks: bool = True,
              judge: ProfilingJudge | None = None, proposers: Mapping[str, Proposer] | None = None,
              console: Console | None = None, watch: WatchConfig | None = None,
              record: Mapping[str, object] | None = None, resume: bool = False) -> Iterator[RunParts]:
    """The run's parts for the block (see the module docstring). `judge` and `proposers` (by label
    or spec) replace the ones the configs would build, and are not closed here; `console` is the
    reporter's (none: the run prints nothing); `record` opens the run's row (`resume`: reopens the
    latest of its stage)."""
    watch = watch or WatchConfig()
    if watch.port is not None and db_path is None:
        raise ValueError("a run page (watch.port) shows the run's database: this run has none")
    if record is not None and db_path is None:
        raise ValueError("a run's record is stored in its database: this run has none")
    reporter = Reporter(console if console is not None else Console(quiet=True))
    with contextlib.ExitStack() as closing:
        db = None
        if db_path is not None:
            from kernelrl.store import Database

            db = closing.enter_context(Database(db_path))
            if register_tasks:
                for t in tasks:
                    db.register_task(t, size=eval_config.size)
        if watch.port is not None:
            from kernelrl.web.live import LivePage, announcement

            assert db_path is not None  # checked above
            page = LivePage(db_path, host=watch.host, port=watch.port)
            closing.callback(page.close)
            reporter.page = page.start()
            for line in announcement(db_path, watch.host, page.port, name="run page"):
                reporter.say(line)
        parts = RunParts(tasks=tasks, eval_config=eval_config, backend=backend or BackendConfig(), db=db,
                         judge=judge, proposers=proposers or {}, reporter=reporter, closing=closing)
        if record is not None:
            assert db is not None  # checked above
            _open_row(parts, db, record, resume=resume, size=eval_config.size)
            if reporter.page is not None:  # the run's own page (the address above lists the runs)
                reporter.say(f"run page of run {parts.run_id}: {reporter.page.url}runs/{parts.run_id}")
        try:
            yield parts
        except KeyboardInterrupt:
            _close_row(parts, RunStatus.INTERRUPTED)
            raise
        except BaseException:
            _close_row(parts, RunStatus.FAILED)
            raise
        _close_row(parts, RunStatus.INTERRUPTED if parts.interrupted else RunStatus.FINISHED)


def _open_row(parts: RunParts, db: Database, record: Mapping[str, object], *, resume: bool, size: str) -> None:
    """Write the run's row (see the module docstring): refused, before anything is written, over a
    task not registered as the run's."""
    registered = {r.name: r for r in db.tasks()}
    stale = [t.name for t in parts.tasks if (r := registered.get(t.name)) is None
             or (r.identity_hash, r.size) != (t.identity_hash, size)]
    if stale:
        raise ValueError(f"tasks not registered in {db.path} as this run's (at size {size}): {', '.join(stale)}; "
                         "the run's builder registers them unless told not to (register_tasks=False)")
    stage = record.get("stage")
    latest = max((r for r in db.runs() if r.config.get("stage") == stage), key=lambda r: r.id,
                 default=None) if resume else None
    if latest is not None:
        db.reopen_run(latest.id, record)
        parts.run_id, parts.resumed = latest.id, True
    else:
        parts.run_id = db.start_run(record)
    parts.owns_row = True


def _close_row(parts: RunParts, status: RunStatus) -> None:
    if parts.owns_row and parts.run_id is not None and parts.db is not None:
        parts.db.finish_run(parts.run_id, status)
