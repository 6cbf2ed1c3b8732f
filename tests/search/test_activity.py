"""What a long command says while it waits: the status line's text and the timing lock's holder."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from rich.console import Console

from kernelrl.search.activity import LockWatch, SearchActivity, describe, lock_holders
from kernelrl.search.summary import StopReason


def _search(**kw):
    ts = [SimpleNamespace(in_flight=2, profile_pending=False), SimpleNamespace(in_flight=0, profile_pending=True)]
    base = dict(state={"a": ts[0], "b": ts[1]}, eval_pending=[("b", "h2")],
                evals_in_flight={("a", "h1"): [], ("b", "h2"): []}, batch_running=True, baselines_in_flight=0,
                stop_reason=None)
    return SimpleNamespace(**{**base, **kw})


def test_the_status_line_says_what_the_search_waits_for():
    text = describe(_search())
    assert text.startswith("waiting for: 2 model calls; judging 1 candidate of a (worker start, build")
    assert "1 waiting for a batch" in text and "reading 1 task reference in a worker" in text
    assert describe(_search(stop_reason=StopReason.INTERRUPTED)).startswith("stopping, waiting for: ")
    idle = _search(state={}, eval_pending=[], evals_in_flight={}, batch_running=False)
    assert describe(idle, "the cpu timing lock is held by pid 7: x") == "waiting for: the cpu timing lock is held by pid 7: x"


def test_the_timing_locks_holder_is_named_with_its_command(tmp_path: Path):
    lock = tmp_path / "cpu.lock"
    lock.write_text("")
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time\n"
                               f"f = open({str(lock)!r}, 'a'); fcntl.flock(f, fcntl.LOCK_EX)\n"
                               "print('held', flush=True); time.sleep(60)", "--holder-marker"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        found = lock_holders(lock)
        assert [(h.pid, h.exclusive) for h in found] == [(holder.pid, True)]
        assert found[0].command.startswith(f"{Path(sys.executable).name} -c import fcntl, sys, time f = open(")
        note = LockWatch(lock, "cpu timing").note()
        assert note.startswith(f"the cpu timing lock is held by pid {holder.pid}: ") and "timing waits for it" in note
    finally:
        holder.kill()
        holder.wait()
    assert lock_holders(lock) == [] and LockWatch(lock).note() == ""
    with open(lock, "a") as f:  # this process's own hold is not "another holder"
        fcntl.flock(f, fcntl.LOCK_EX)
        assert [h.pid for h in lock_holders(lock)] == [os.getpid()] and LockWatch(lock).note() == ""


def test_the_status_line_is_drawn_under_the_bars():
    console = Console(record=True, width=120, force_terminal=True)
    activity = SearchActivity(console)
    search = _search(config=SimpleNamespace(budget=4))
    search.state["a"].evaluated, search.state["b"].evaluated = 3, 1
    with activity.progress:
        activity.progress.add_task("level1/softmax", total=4, best="-")
        activity.tick(search)
        time.sleep(0.05)
    out = console.export_text()
    assert "level1/softmax" in out and "ETA" in out and "waiting for: 2 model calls" in out
    assert "all tasks" in out and "4/8" in out  # the run's own bar


def test_a_log_that_is_not_a_terminal_gets_plain_progress_lines(monkeypatch):
    import io

    from kernelrl.search import activity as activity_module

    monkeypatch.setattr(activity_module, "LOG_EVERY_S", 0.0)
    monkeypatch.setattr(activity_module, "REFRESH_S", 0.01)
    log = io.StringIO()
    console = Console(file=log, width=200, force_terminal=False)
    activity = SearchActivity(console)
    search = _search(config=SimpleNamespace(budget=4))
    search.state["a"].evaluated, search.state["b"].evaluated = 3, 1
    with activity.progress:
        activity.tick(search)
    lines = [line for line in log.getvalue().splitlines() if "judged" in line]
    assert lines and "judged 4/8 candidates, ETA " in lines[0] and "waiting for: 2 model calls" in lines[0]
    with activity_module.waiting(console, "starting the evaluator"):
        time.sleep(0.1)
    said = log.getvalue()
    assert "starting the evaluator ..." in said and "starting the evaluator (0 s)" in said


def test_the_plain_progress_line_gives_an_eta_only_when_it_can():
    from kernelrl.search.activity import progress_line

    assert progress_line(2, 8, 30.0, "scheduling", eta_s=90.0) == "[30 s] judged 2/8 candidates, ETA 90 s; scheduling"
    assert "ETA unknown" in progress_line(0, 8, 5.0, "x") and "ETA unknown" in progress_line(8, 8, 5.0, "x", eta_s=0.0)


def test_the_eta_is_the_judging_rate_since_the_first_verdict_not_since_the_start():
    """Starting workers, references and baselines is not a candidate's cost: 60 s of start, then a
    verdict every 10 s, leaves 4 candidates 40 s, not 4 x (90 s / 3)."""
    from kernelrl.search.activity import JudgingRate, eta_text

    rate = JudgingRate()
    rate.seen(0, 0.0)
    assert rate.eta_s(4) is None  # no rate yet
    rate.seen(1, 60.0)
    assert rate.eta_s(4) is None  # one verdict is no rate
    rate.seen(2, 70.0)
    rate.seen(3, 80.0)
    assert rate.eta_s(4) == 40.0 and rate.eta_s(0) == 0.0
    resumed = JudgingRate()  # a resumed run starts from what it judged before
    for judged, at in ((5, 0.0), (6, 30.0), (8, 50.0)):
        resumed.seen(judged, at)
    assert resumed.eta_s(2) == 20.0
    assert eta_text(None) == "-" and eta_text(3725.4) == "1:02:05"


def test_a_quiet_console_gets_no_spinner_and_no_thread_reading_the_lock():
    import threading

    from kernelrl.search.activity import waiting

    class Watch:
        reads = 0

        def note(self) -> str:
            Watch.reads += 1
            return ""

    with waiting(Console(quiet=True), "starting", Watch()):  # type: ignore[arg-type]
        assert not [t for t in threading.enumerate() if t.name == "kernelrl-waiting"]
        time.sleep(0.1)
    assert Watch.reads == 0
