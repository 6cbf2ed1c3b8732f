"""Ctrl-C, once or twice, at several moments of `kernelrl optimize`: exit 130, never an abort,
nothing stored is lost. Real SIGINTs to a real command (`python -m kernelrl`)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ABORT = "terminate called"


def _program(tiny_task, n: int) -> str:
    return tiny_task.source.replace("class Model(", "class ModelNew(") + f"\n# version {n}\n"


def _start(tmp_path: Path, tiny_task, cache_dir: Path, budget: int = 4) -> tuple[subprocess.Popen[str], Path]:
    answers = tmp_path / "answers.jsonl"
    answers.write_text("".join(json.dumps({"task": tiny_task.name, "code": _program(tiny_task, i)}) + "\n"
                               for i in range(budget)))
    db = tmp_path / "run.db"
    argv = [sys.executable, "-m", "kernelrl", "optimize", "--tasks", str(tiny_task.path), "--proposer",
            f"replay:{answers}", "--budget", str(budget), "--chains", "2", "--db", str(db), "--no-baselines",
            "--cache-dir", str(cache_dir), "--timing.min-rounds", "5", "--timing.max-rounds", "40",
            "--timing-cap", "2", "--timing.warmup-calls", "2", "--batch-wait", "0"]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)},
                            # as a terminal delivers Ctrl-C, even when the tests run in the background
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    return proc, db


def _count(db: Path, sql: str) -> int:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
            return int(conn.execute(sql).fetchone()[0])
    except sqlite3.Error:
        return 0


def _wait_for_a_candidate(proc: subprocess.Popen[str], db: Path, limit_s: float = 240) -> None:
    end = time.monotonic() + limit_s
    while _count(db, "SELECT count(*) FROM candidates") == 0:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < end, "no candidate was stored in time"
        time.sleep(0.2)


def _finish(proc: subprocess.Popen[str], limit_s: float) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"still running {limit_s:g} s after the interrupt:\n{out}\n{err}")
    return proc.returncode, out, err


def test_ctrl_c_while_starting_exits_130(tmp_path: Path, tiny_task, cache_dir: Path) -> None:
    proc, _ = _start(tmp_path, tiny_task, cache_dir)
    time.sleep(0.5)  # importing, checking the flags
    proc.send_signal(signal.SIGINT)
    code, out, err = _finish(proc, 60)
    assert code == 130, out + err
    assert ABORT not in err and "Traceback" not in err, err


def test_ctrl_c_twice_during_the_search_leaves_at_once_keeping_every_candidate(tmp_path: Path, tiny_task,
                                                                               cache_dir: Path) -> None:
    proc, db = _start(tmp_path, tiny_task, cache_dir)
    _wait_for_a_candidate(proc, db)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    code, out, err = _finish(proc, 60)
    assert code == 130, out + err
    assert ABORT not in err and "Traceback" not in err, err
    assert "stopping" in out
    assert _count(db, "SELECT count(*) FROM runs WHERE status = 'interrupted'") == 1
    assert _count(db, "SELECT count(*) FROM candidates") >= 1  # stored; a resume evaluates what is left


@pytest.mark.slow  # 23 s; the search's own Ctrl-C tests (tests/search/test_loop.py) are fast
def test_ctrl_c_once_leaves_within_seconds_and_a_resume_judges_the_rest(tmp_path: Path, tiny_task,
                                                                           cache_dir: Path) -> None:
    """One Ctrl-C: what finishes within `INTERRUPT_GRACE_S` is kept, the run leaves, every proposal
    is stored; `--resume` judges what was left and loses nothing."""
    from kernelrl.search.scheduler import INTERRUPT_GRACE_S

    proc, db = _start(tmp_path, tiny_task, cache_dir, budget=8)
    _wait_for_a_candidate(proc, db)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    code, out, err = _finish(proc, 300)
    took = time.monotonic() - sent
    assert code == 130, out + err
    assert ABORT not in err and "Traceback" not in err, err
    assert took < INTERRUPT_GRACE_S + 25, took  # seconds (the grace, then closing workers), not the run's work
    assert "stopped by Ctrl-C" in out and _count(db, "SELECT count(*) FROM runs WHERE status = 'interrupted'") == 1
    stored = _count(db, "SELECT count(*) FROM candidates")
    assert stored >= 1 and _count(db, "SELECT count(*) FROM results") <= stored
    resumed = subprocess.run([*proc.args, "--resume"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert _count(db, "SELECT count(*) FROM results") == _count(db, "SELECT count(*) FROM candidates") >= stored


def test_the_last_frame_on_a_terminal_says_how_the_run_ended(tmp_path: Path, tiny_task, cache_dir: Path) -> None:
    """On a terminal (a pty here), the live frame left above the summary is the run's end: every
    candidate judged, "done", nothing still "judging"."""
    import pty
    import re

    answers = tmp_path / "answers.jsonl"
    answers.write_text("".join(json.dumps({"task": tiny_task.name, "code": _program(tiny_task, i)}) + "\n"
                               for i in range(2)))
    main, child = pty.openpty()
    argv = [sys.executable, "-m", "kernelrl", "optimize", "--tasks", str(tiny_task.path), "--proposer",
            f"replay:{answers}", "--budget", "2", "--chains", "1", "--db", str(tmp_path / "run.db"), "--no-baselines",
            "--cache-dir", str(cache_dir), "--timing.min-rounds", "5", "--timing.max-rounds", "20", "--timing-cap", "2",
            "--batch-wait", "0"]
    proc = subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=child, stderr=child,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "160", "TERM": "xterm"})
    os.close(child)
    chunks = []
    while True:
        try:
            data = os.read(main, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(300) == 0
    os.close(main)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode(errors="replace"))
    before = text[:text.rindex("every task used its budget")]  # what the terminal shows above the summary
    last = [line.strip() for line in before.replace("\r", "\n").splitlines() if line.strip()][-3:-1]
    assert "2/2" in last[0] and "ETA 0:00:00" in last[0], last  # the task's bar, full, nothing left
    assert last[1] == "done: 2 candidates judged", last  # not "waiting for: judging 1 candidate"


@pytest.mark.slow
@pytest.mark.parametrize("after_s", [2.0, 8.0])
def test_ctrl_c_twice_while_heuristic_candidates_are_judged_never_aborts(tmp_path: Path, after_s: float) -> None:
    """The moment that aborted before (exit 134, "terminate called without an active exception"):
    the second Ctrl-C while an evaluation thread is inside the judge (torch.compile candidates of
    a built-in task); 8 s after the first candidate reproduced it without `kernelrl.cli.leave`."""
    db = tmp_path / "run.db"
    proc = subprocess.Popen([sys.executable, "-m", "kernelrl", "optimize", "--tasks", "level1/softmax", "--budget",
                             "2", "--chains", "1", "--db", str(db)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    _wait_for_a_candidate(proc, db)
    time.sleep(after_s)
    proc.send_signal(signal.SIGINT)
    time.sleep(2)
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    code, out, err = _finish(proc, 120)
    assert code == 130, out + err
    assert ABORT not in err and "Traceback" not in err, err
    assert _count(db, "SELECT count(*) FROM runs WHERE status = 'interrupted'") == 1
