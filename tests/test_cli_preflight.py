"""Mistakes are caught before anything starts: one line in the user's words, exit 2, no worker,
model or server started, nothing written."""

from __future__ import annotations

import re
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelrl.cli import main

NOT_A_DB = "not a kernelrl run database"


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every process, evaluator or proposer a command starts is recorded here (and refused)."""
    seen: list[str] = []

    def popen(self: object, args: object, *a: object, **k: object) -> None:
        seen.append(f"process {args!r}")
        raise AssertionError("a process was started")

    monkeypatch.setattr(subprocess.Popen, "__init__", popen)
    import kernelrl.proposers as proposers
    from kernelrl.judge import evaluator

    def evaluator_init(self: object, *a: object, **k: object) -> None:
        seen.append("evaluator")
        raise AssertionError("an evaluator was started")

    def make(*a: object, **k: object) -> None:
        seen.append("proposer")
        raise AssertionError("a proposer was made")

    monkeypatch.setattr(evaluator.Evaluator, "__init__", evaluator_init)
    monkeypatch.setattr(proposers, "make_proposer", make)  # run_parts builds every proposer through it
    yield seen


@pytest.fixture
def busy_port() -> Iterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    yield sock.getsockname()[1]
    sock.close()


def _text_file(tmp_path: Path) -> Path:
    path = tmp_path / "notes.db"
    path.write_text("not a database\n")
    return path


CASES = {
    "turns": (["optimize", "--tasks", "softmax", "--db", "{tmp}/r.db", "--turns", "0"],
              "--turns must be at least 1, got 0"),
    "budget": (["optimize", "--tasks", "softmax", "--db", "{tmp}/r.db", "--budget", "0"], "--budget must be at least 1"),
    "nested": (["optimize", "--tasks", "softmax", "--db", "{tmp}/r.db", "--timing.min-rounds", "0"],
               "--timing.min-rounds"),
    "proposer": (["optimize", "--tasks", "softmax", "--db", "{tmp}/r.db", "--proposer", "nosuch"],
                 "--proposer nosuch: unknown proposer 'nosuch'"),
    "replay": (["optimize", "--tasks", "softmax", "--db", "{tmp}/r.db", "--proposer", "replay:{tmp}/none.jsonl"],
               "no such file or folder"),
    "strict": (["optimize", "--tasks", "softmax", "--db", "{tmp}/r.db", "--policy", "strict"], "strict policy"),
    "task": (["optimize", "--tasks", "nosuch", "--db", "{tmp}/r.db"], "--tasks: unknown task 'nosuch'"),
    "resume": (["optimize", "--tasks", "softmax", "--db", "{tmp}/r.db", "--resume"],
               "--resume: {tmp}/r.db does not exist, so there is no run to continue"),
    "not_a_db": (["optimize", "--tasks", "softmax", "--db", "{notes}"], NOT_A_DB),
    "templates": (["optimize", "--tasks", "softmax", "--db", "{tmp}/r.db", "--templates", "{tmp}/none"],
                  "--templates {tmp}/none: no such folder"),
    "suite": (["tasks", "--suite", "nosuch"], "--suite: unknown suite 'nosuch'; known suites: builtin"),
    "report": (["report", "--db", "{tmp}/none.db"], "--db {tmp}/none.db: no such file"),
    "report_text": (["report", "--db", "{notes}"], NOT_A_DB),
    "export": (["export", "--db", "{notes}"], NOT_A_DB),
    "watch": (["watch", "--db", "{notes}", "--port", "0"], NOT_A_DB),
    "watch_port": (["watch", "--db", "{tmp}/r.db", "--port", "{port}"], "cannot listen on 127.0.0.1:{port}"),
    "watch_range": (["watch", "--db", "{tmp}/r.db", "--port", "70000"], "--port must be in 0-65535"),
    "serve_port": (["serve", "--port", "{port}", "--db", "{tmp}/jobs.db"], "cannot listen on 127.0.0.1:{port}"),
    "optimize_page": (["optimize", "--tasks", "softmax", "--db", "{tmp}/r.db", "--watch.port", "{port}"],
                      "cannot listen on 127.0.0.1:{port}"),
    "optimize_page_range": (["optimize", "--tasks", "softmax", "--db", "{tmp}/r.db", "--watch.port", "70000"],
                            "--watch.port must be"),
    "bench_page": (["bench", "--proposer", "heuristic", "--db", "{tmp}/b.db", "--watch.port", "{port}"],
                   "cannot listen on 127.0.0.1:{port}"),
    "bench_page_no_db": (["bench", "--proposer", "heuristic", "--watch.port", "0"], "this bench keeps none"),
    "serve_tokens": (["serve", "--token-file", "{tmp}/none", "--db", "{tmp}/jobs.db"],
                     "cannot read the token file {tmp}/none"),
    "serve_watch": (["serve", "--watch-db", "{notes}", "--db", "{tmp}/jobs.db"], "--watch-db {notes}: " + NOT_A_DB),
    "collect": (["collect", "--tasks", "level1", "--proposer", "nosuch", "--out", "{tmp}/sft.jsonl", "--splits", "all"],
                "--proposer nosuch: unknown proposer"),
    "bench": (["bench", "--proposer", "nosuch"], "--proposer nosuch: unknown proposer"),
    "bench_task": (["bench", "--proposer", "heuristic", "--tasks", "nosuch"], "--tasks: unknown task 'nosuch'"),
    "bench_opts": (["bench", "--proposer", "hf:model foo=1"], "hf proposer does not take option(s) foo"),
    "calibrate": (["calibrate", "softmax", "--runs", "0"], "--runs must be at least 1, got 0"),
    "eval_timeout": (["eval", "softmax", "{notes}", "--timeout", "-1"], "--timeout must be positive"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_mistake_is_one_line_in_the_users_words_and_nothing_starts(
        case: str, tmp_path: Path, started: list[str], busy_port: int, capsys: pytest.CaptureFixture[str]) -> None:
    notes = _text_file(tmp_path)
    argv, expected = CASES[case]
    fill = {"{tmp}": str(tmp_path), "{notes}": str(notes), "{port}": str(busy_port)}
    for key, value in fill.items():
        argv = [a.replace(key, value) for a in argv]
        expected = expected.replace(key, value)
    before = sorted(p.name for p in tmp_path.iterdir())
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("kernelrl: error: ") and err.count("\n") == 1, err
    assert expected in err
    assert not re.search(r"\b[A-Z]\w*(Config|Error)\b", err), err  # no class names
    assert started == []
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


def test_the_guard_sees_a_start(tmp_path: Path, started: list[str]) -> None:
    """A command that passes every check does reach what it starts first, its proposer (so the
    tests above can fail)."""
    with pytest.raises(AssertionError):
        main(["optimize", "--tasks", "softmax", "--db", str(tmp_path / "r.db"), "--budget", "1"])
    assert started == ["proposer"]
