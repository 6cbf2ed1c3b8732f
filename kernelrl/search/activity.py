"""What a long command is doing, said while it does it: no wait longer than a second goes unexplained.

- `waiting(console, what, lock=...)`: a spinner line "what (12 s)" for one blocking step (starting
  the evaluator, measuring the machine's peaks, judging a bench's answers), which adds, while
  another process holds the device's timing lock, who holds it ("the cpu timing lock is held by
  pid 8953: python3 benchmarks/learning_check.py ... for 40 s").
- `SearchActivity`: the search's progress: one bar per task (candidates judged of its budget,
  best speedup, elapsed, ETA), one over all tasks (the run's ETA) and a status line under them
  saying what the loop is waiting for (model calls, candidates being judged and for which tasks,
  candidates waiting for a batch, references being read, baselines, the timing lock's holder, the
  stop in progress).
- `lock_holders(path)`: the processes holding an `flock` on a file, from Linux's `/proc/locks`.

Guarantees: reads only (`/proc/locks`, `/proc/PID/cmdline`, the search's counters); never takes or
waits for a lock; where `/proc/locks` is missing nothing is said of holders. The status line is
refreshed at most once a second. Where the console is not a terminal (a log file, a pipe, CI),
spinners and bars cannot redraw, so the same facts are printed as plain lines: a step's start, then
one line every `LOG_EVERY_S` while it lasts; the search's progress (judged of budget, ETA, what it
waits for) every `LOG_EVERY_S`.
Does not measure anything or change what is waited for.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from rich.console import Console, RenderableType
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

if TYPE_CHECKING:
    from kernelrl.search.chains import TaskState
    from kernelrl.search.config import SearchConfig
    from kernelrl.search.summary import StopReason
    from kernelrl.store.records import CandidateRecord

REFRESH_S = 1.0
LOG_EVERY_S = 10.0  # a plain line this often where the console cannot redraw (not a terminal)
_COMMAND_CHARS = 80


@dataclass(frozen=True, kw_only=True)
class LockHolder:
    pid: int
    exclusive: bool
    command: str  # its command line, shortened


def lock_holders(path: str | Path) -> list[LockHolder]:
    """Processes holding an flock on `path` (waiters excluded); [] when unknown."""
    try:
        inode = os.stat(path).st_ino
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return []
    out: list[LockHolder] = []
    for line in lines:
        parts = line.split()
        if len(parts) < 6 or parts[1] == "->" or parts[1] != "FLOCK":
            continue
        try:
            pid, ino = int(parts[4]), int(parts[5].rsplit(":", 1)[1])
        except (ValueError, IndexError):
            continue
        if ino == inode and pid not in {h.pid for h in out}:
            out.append(LockHolder(pid=pid, exclusive=parts[3] == "WRITE", command=_command(pid)))
    return out


def _command(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    words = [w for w in raw.decode(errors="replace").split("\0") if w]
    if words:
        words[0] = Path(words[0]).name
    text = " ".join(" ".join(words).split())  # one line
    return text if len(text) <= _COMMAND_CHARS else text[:_COMMAND_CHARS - 3] + "..."


class LockWatch:
    """Who else holds a device lock, and since when this watch first saw them."""

    def __init__(self, path: Path | None, name: str = "timing") -> None:
        self.path = path
        self.name = name
        self._since: dict[int, float] = {}

    def note(self) -> str:
        if self.path is None:
            return ""
        others = [h for h in lock_holders(self.path) if h.pid != os.getpid() and h.exclusive]
        now = time.monotonic()
        self._since = {h.pid: self._since.get(h.pid, now) for h in others}
        if not others:
            return ""
        h = others[0]
        return (f"the {self.name} lock is held by pid {h.pid}: {h.command} (for {now - self._since[h.pid]:.0f} s "
                "here); timing waits for it")


def lock_watch(evaluator: object) -> LockWatch:
    """The watch of an evaluator's device lock (none for an injected judge)."""
    lock = getattr(evaluator, "lock", None)
    path = getattr(lock, "path", None)
    return LockWatch(Path(path) if path is not None else None, f"{getattr(lock, 'name', 'device')} timing")


@contextlib.contextmanager
def waiting(console: Console, what: str, watch: LockWatch | None = None) -> Iterator[None]:
    """A spinner saying `what`, its elapsed seconds and the lock's holder, while the block runs;
    nothing at all on a quiet console (a run given none), not even the thread that reads the lock."""
    if console.quiet:
        yield
        return
    start = time.monotonic()
    done = threading.Event()
    plain = not console.is_terminal
    if plain:
        console.print(f"{what} ...", highlight=False)
    with console.status(what, spinner="dots") as status:
        def refresh() -> None:
            last = start
            while not done.wait(REFRESH_S):
                note = watch.note() if watch is not None else ""
                line = f"{what} ({time.monotonic() - start:.0f} s)" + (f"; {note}" if note else "")
                if not plain:
                    status.update(line)
                elif time.monotonic() - last >= LOG_EVERY_S:
                    last = time.monotonic()
                    console.print(line, highlight=False)

        thread = threading.Thread(target=refresh, name="kernelrl-waiting", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()


class SearchView(Protocol):
    """What the status line reads of a search (`kernelrl.search.scheduler.Scheduler`)."""

    @property
    def config(self) -> SearchConfig: ...  # its budget: candidates per task

    @property
    def state(self) -> Mapping[str, TaskState]: ...  # per task: in_flight, profile_pending, evaluated

    @property
    def eval_pending(self) -> Sequence[tuple[str, str]]: ...  # (task, hash) waiting for a batch

    @property
    def evals_in_flight(self) -> Mapping[tuple[str, str], Sequence[CandidateRecord]]: ...  # (task, hash) not judged yet

    @property
    def batch_running(self) -> bool: ...

    @property
    def baselines_in_flight(self) -> int: ...

    @property
    def stop_reason(self) -> StopReason | None: ...


class _Bars(Progress):
    """Progress bars with one line of text under them."""

    status = ""

    def get_renderables(self) -> Iterator[RenderableType]:
        yield from super().get_renderables()
        if self.status:
            yield Text(self.status, style="dim")


class SearchActivity:
    """The search's progress bars and its status line (see the module docstring)."""

    def __init__(self, console: Console, watch: LockWatch | None = None) -> None:
        self.watch = watch
        self.progress: Progress = _Bars(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                        TextColumn("{task.fields[best]}"), TimeElapsedColumn(), _Eta(),
                                        console=console, transient=False)
        self._last = 0.0
        self._all: TaskID | None = None
        self._rate = JudgingRate()
        self._console = console
        self._started = time.monotonic()
        self._logged = self._started  # the last plain progress line (a console that is not a terminal)

    @property
    def text(self) -> str:
        return self.progress.status if isinstance(self.progress, _Bars) else ""

    def tick(self, search: SearchView, *, final: bool = False) -> None:
        """Say what `search` waits for; at most once a second. `final`: the loop has ended, and the
        last frame says how (done, or stopped with what is left to a resume), whenever it comes."""
        now = time.monotonic()
        if not isinstance(self.progress, _Bars) or (not final and now - self._last < REFRESH_S):
            return
        self._last = now
        done = sum(ts.evaluated for ts in search.state.values())
        total = search.config.budget * len(search.state)
        self.progress.status = (ended(search, done) if final else
                                describe(search, self.watch.note() if self.watch is not None else ""))
        self._rate.seen(done, now)
        budget = search.config.budget
        left = {name: max(0, budget - ts.evaluated) for name, ts in search.state.items()}
        active = sum(1 for n in left.values() if n)
        for name, ts in search.state.items():
            bar = getattr(ts, "progress_id", None)
            if bar is not None:  # round-robin: a task's share of the run's rate is one active task's
                self.progress.update(bar, eta=eta_text(0.0 if final else self._rate.eta_s(left[name] * active)))
        if len(search.state) > 1:  # a bar over every task: the run's own ETA
            if self._all is None:
                self._all = self.progress.add_task("all tasks", total=total, completed=done, best="", eta="-")
            self.progress.update(self._all, completed=done, total=total,
                                 eta=eta_text(0.0 if final else self._rate.eta_s(total - done)))
        if not self._console.is_terminal and now - self._logged >= LOG_EVERY_S:
            self._logged = now
            self._console.print(progress_line(done, total, now - self._started, self.progress.status,
                                              eta_s=self._rate.eta_s(total - done)), highlight=False)


class _Eta(ProgressColumn):
    """A bar's ETA as `SearchActivity.tick` set it (the run's judging rate, `JudgingRate`)."""

    def render(self, task: Task) -> Text:
        return Text(f"ETA {task.fields.get('eta', '-')}")


class JudgingRate:
    """Candidates judged per second since the first verdict of this invocation: the start (workers,
    references, baselines, the first torch.compile) is not a candidate's cost, and counting it made
    the run's ETA 40-65 % high."""

    def __init__(self) -> None:
        self._start: int | None = None  # judged when this invocation started (a resumed run's count)
        self._first: tuple[int, float] | None = None  # (judged, when) at this invocation's first verdict
        self._now: tuple[int, float] | None = None

    def seen(self, judged: int, now: float) -> None:
        if self._start is None:
            self._start = judged
        if self._first is None and judged > self._start:
            self._first = (judged, now)
        self._now = (judged, now)

    def eta_s(self, remaining: int) -> float | None:
        """Seconds to judge `remaining` more at the rate so far; None until two verdicts set a rate."""
        if remaining <= 0:
            return 0.0
        if self._first is None or self._now is None:
            return None
        n, dt = self._now[0] - self._first[0], self._now[1] - self._first[1]
        if n < 2 or dt <= 0:
            return None
        return remaining * dt / n


def eta_text(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = round(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def progress_line(done: int, total: int, elapsed_s: float, status: str, *, eta_s: float | None = None) -> str:
    """The search's progress as one plain line (for a log): judged of budget, elapsed, ETA (the
    judging rate's, `JudgingRate`), status."""
    eta = f"ETA {eta_s:.0f} s" if eta_s is not None and done < total else "ETA unknown"
    return f"[{elapsed_s:.0f} s] judged {done}/{total} candidates, {eta}; {status}"


def ended(search: SearchView, done: int) -> str:
    """The last status line: how the loop ended, and what it left to a resume."""
    left = sum(len(recs) for recs in search.evals_in_flight.values())
    reason = getattr(search.stop_reason, "value", "") or "done"
    words = {"interrupted": "stopped (Ctrl-C)", "budget": "done", "tokens": "stopped: the token budget is spent",
             "wall_time": "stopped: the wall-time limit is reached"}.get(reason, reason)
    text = f"{words}: {done} candidate{'s' * (done != 1)} judged"
    if left:
        text += f"; {left} proposed and not judged, left to a resume (`--resume` judges them)"
    return text


def describe(search: SearchView, lock_note: str = "") -> str:
    """What the loop is waiting for, in one line."""
    state = search.state.values()
    parts = []
    calls = sum(ts.in_flight for ts in state)
    if calls:
        parts.append(f"{calls} model call{'s' * (calls != 1)}")
    pending = set(search.eval_pending)
    judging = [key for key in search.evals_in_flight if key not in pending]
    if search.batch_running and judging:
        tasks = sorted({task for task, _ in judging})
        shown = ", ".join(tasks[:3]) + (f" and {len(tasks) - 3} more" if len(tasks) > 3 else "")
        parts.append(f"judging {len(judging)} candidate{'s' * (len(judging) != 1)} of {shown} "
                     "(worker start, build, correctness, timing)")
    if pending:
        parts.append(f"{len(pending)} waiting for a batch")
    profiles = sum(1 for ts in state if ts.profile_pending)
    if profiles:
        parts.append(f"reading {profiles} task reference{'s' * (profiles != 1)} in a worker (shapes, FLOPs)")
    if search.baselines_in_flight:
        parts.append(f"timing {search.baselines_in_flight} baseline{'s' * (search.baselines_in_flight != 1)}")
    if lock_note:
        parts.append(lock_note)
    text = "waiting for: " + "; ".join(parts) if parts else "scheduling"
    if search.stop_reason is not None and getattr(search.stop_reason, "value", "") == "interrupted":
        text = "stopping, " + text
    return text
