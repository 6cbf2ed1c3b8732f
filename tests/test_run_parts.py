"""A run's parts: built from their configs on first use, and closed by the builder only when it built them."""

from __future__ import annotations

import contextlib
import io
import json
import socket
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

import kernelrl.proposers as proposers_module
from kernelrl.backends.judges import BackendConfig
from kernelrl.judge.eval_config import EvalConfig
from kernelrl.run_parts import build_run
from kernelrl.store import Database
from kernelrl.tasks.task import Task
from kernelrl.web.config import WatchConfig

TASK = Task(name="double", source="import torch\n\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
            "        return x * 2\n\n\ndef get_inputs():\n    return [torch.randn(8)]\n\n\n"
            "def get_init_inputs():\n    return []\n")


class Closable:
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


class FakeJudge(Closable):
    def evaluate_batch(self, items: Any) -> list[Any]:
        return []

    def profile(self, task: Task) -> None:
        return None


@pytest.fixture
def made(monkeypatch) -> list[tuple[str, dict[str, Any], Closable]]:
    """Every proposer the builder makes, with its spec and options (a double: no model is loaded)."""
    out: list[tuple[str, dict[str, Any], Closable]] = []

    def make(spec: str, **opts: Any) -> Closable:
        out.append((spec, opts, Closable()))
        return out[-1][2]

    monkeypatch.setattr(proposers_module, "make_proposer", make)
    return out


def test_tasks_are_registered_at_the_runs_size_unless_told_not_to(tmp_path: Path) -> None:
    with build_run(tasks=[TASK], eval_config=EvalConfig(size="full"), db_path=tmp_path / "a.db") as run:
        assert run.db is not None
        assert [(t.name, t.size) for t in run.db.tasks()] == [("double", "full")]
    with build_run(tasks=[TASK], eval_config=EvalConfig(), db_path=tmp_path / "b.db", register_tasks=False):
        pass
    with Database(tmp_path / "b.db") as db:
        assert db.tasks() == []
    with build_run(tasks=[TASK], eval_config=EvalConfig()) as run:
        assert run.db is None


def test_the_judge_is_built_on_first_use_and_closed_at_the_end(monkeypatch) -> None:
    import kernelrl.run_parts as run_parts

    built: list[FakeJudge] = []
    monkeypatch.setattr(run_parts, "make_judge", lambda *a, **k: built.append(FakeJudge()) or built[-1])
    with build_run(tasks=[TASK], eval_config=EvalConfig()) as run:
        assert not run.judge_started and built == []  # nothing to judge yet: no worker
        assert run.judge is run.judge and len(built) == 1
        assert built[0].closed == 0
    assert built[0].closed == 1


def test_a_judge_handed_in_is_used_and_never_closed() -> None:
    mine = FakeJudge()
    with pytest.raises(RuntimeError), build_run(tasks=[TASK], eval_config=EvalConfig(), judge=mine) as run:
        assert run.judge is mine and run.reuse_stored
        raise RuntimeError("the run failed")
    assert mine.closed == 0


def test_a_reward_servers_verdicts_are_not_taken_for_stored_local_ones() -> None:
    with build_run(tasks=[TASK], eval_config=EvalConfig(), backend=BackendConfig(url="http://127.0.0.1:9")) as run:
        assert not run.reuse_stored
    with build_run(tasks=[TASK], eval_config=EvalConfig()) as run:
        assert run.reuse_stored


def test_a_proposer_is_built_once_per_spec_and_options_and_closed_even_when_the_run_fails(made) -> None:
    given = Closable()
    with pytest.raises(KeyboardInterrupt), build_run(tasks=[TASK], eval_config=EvalConfig(policy="strict-pytorch"),
                   proposers={"mine": given}) as run:
        a = run.proposer("heuristic")
        assert run.proposer("heuristic") is a
        b = run.proposer("openai:m", temperature=0.5)
        assert run.proposer("openai:m", temperature=0.7) is not b
        assert run.proposer("openai:m", label="mine") is given
        raise KeyboardInterrupt
    assert [(spec, opts) for spec, opts, _ in made] == [
        ("heuristic", {"policy": "strict-pytorch", "device": "cpu"}),
        ("openai:m", {"policy": "strict-pytorch", "device": "cpu", "temperature": 0.5}),
        ("openai:m", {"policy": "strict-pytorch", "device": "cpu", "temperature": 0.7})]
    assert [p.closed for _, _, p in made] == [1, 1, 1] and given.closed == 0


def _runs(url: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(url + "api/runs", timeout=10) as reply:
        return json.loads(reply.read())["runs"]


def test_the_run_page_is_served_while_the_block_runs_and_shows_it_finished_after(tmp_path: Path, monkeypatch) -> None:
    """While the block runs, and a little after it (so an open page shows the run finished, not
    "running" frozen); then the page's process ends and the port is released."""
    import time

    import kernelrl.web.live as watch

    monkeypatch.setattr(watch, "LINGER_S", 3.0)
    console = Console(file=io.StringIO(), width=200)
    with build_run(tasks=[TASK], eval_config=EvalConfig(), db_path=tmp_path / "a.db", console=console,
                   watch=WatchConfig(port=0)) as run:
        url = run.reporter.page_url
        assert url is not None and url.startswith("http://127.0.0.1:")
        assert f"run page: {url}" in console.file.getvalue()  # said where people read the run
        assert _runs(url) == []  # this very file, live
    with build_run(tasks=[TASK], eval_config=EvalConfig(), db_path=tmp_path / "a.db", console=console,
                   watch=WatchConfig(port=0), record={"proposer": "heuristic"}) as run:
        url = run.reporter.page_url
        assert url is not None
        run_id = run.run_id
        assert [(r["id"], r["status"]) for r in _runs(url)] == [(run_id, "running")]  # the run's row, live
        assert f"run page of run {run_id}: {url}runs/{run_id}" in console.file.getvalue()  # the run's own page
    ended = time.monotonic()
    assert [(r["id"], r["status"]) for r in _runs(url)] == [(run_id, "finished")]  # the run's end, shown
    deadline = ended + 3.0 + 15
    while time.monotonic() < deadline:
        try:
            _runs(url)
        except urllib.error.URLError:
            break  # the port is released once the page has lingered
        time.sleep(0.2)
    else:
        pytest.fail("the run page still answers long after its run ended")
    assert time.monotonic() - ended >= 2.5


def _gone(pid: int, within_s: float) -> bool:
    import os
    import time

    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reaped if it is ours
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state == "Z":  # exited; an orphan waits there for whoever reaps orphans
            return True
        time.sleep(0.05)
    return False


def test_the_run_page_is_a_process_of_its_own_that_ends_with_the_block(tmp_path: Path, monkeypatch) -> None:
    # Not a thread of the run: the judge reads its clock in the run's process.
    import os

    import kernelrl.web.live as watch

    monkeypatch.setattr(watch, "LINGER_S", 1.0)
    with build_run(tasks=[TASK], eval_config=EvalConfig(), db_path=tmp_path / "a.db", watch=WatchConfig(port=0)) as run:
        page = run.reporter.page
        assert page is not None and page.pid is not None and page.pid != os.getpid()
        pid = page.pid
    assert _gone(pid, 15)


_KILLED_RUN = """
import sys, time
from kernelrl.judge.eval_config import EvalConfig
from kernelrl.run_parts import build_run
from kernelrl.tasks.task import Task
from kernelrl.web.config import WatchConfig
import kernelrl.web.live
kernelrl.web.live.LINGER_S = 1.0
with build_run(tasks=[Task(name="t", source=sys.argv[2])], eval_config=EvalConfig(), db_path=sys.argv[1],
               watch=WatchConfig(port=0)) as run:
    print(run.reporter.page.pid, flush=True)
    time.sleep(600)
"""


def test_the_run_page_ends_when_the_runs_process_is_killed(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    run = subprocess.Popen([sys.executable, "-c", _KILLED_RUN, str(tmp_path / "a.db"), TASK.source],
                           stdout=subprocess.PIPE, text=True)
    try:
        assert run.stdout is not None
        pid = int(run.stdout.readline())
        run.send_signal(signal.SIGKILL)
        run.wait(30)
        assert _gone(pid, 15)  # orphaned, it sees its parent gone and stops
    finally:
        run.kill()


def test_a_runs_row_is_closed_as_its_block_ends(tmp_path: Path) -> None:
    from kernelrl.store.records import RunStatus

    def build(**kw: Any) -> contextlib.AbstractContextManager[Any]:
        return build_run(tasks=[TASK], eval_config=EvalConfig(), db_path=tmp_path / "k.db", **kw)

    with build(record={"stage": "bench"}) as run:
        done = run.run_id
        assert run.db is not None and run.db.get_run(done).status is RunStatus.RUNNING
    with pytest.raises(KeyboardInterrupt), build(record={"stage": "bench"}) as run:
        stopped = run.run_id
        raise KeyboardInterrupt
    with pytest.raises(ValueError, match="broke"), build(record={"stage": "bench"}) as run:
        broke = run.run_id
        raise ValueError("broke")
    with build(record={"stage": "bench"}) as run:
        marked = run.run_id
        run.mark_interrupted()  # a search stops on Ctrl-C and returns
    with build() as run:
        assert run.run_id is None  # no record: no row
    with Database(tmp_path / "k.db") as db:
        assert [(r.id, r.status) for r in db.runs()] == [
            (done, RunStatus.FINISHED), (stopped, RunStatus.INTERRUPTED), (broke, RunStatus.FAILED),
            (marked, RunStatus.INTERRUPTED)]
        assert all(r.finished is not None for r in db.runs())


def test_a_row_adopted_from_another_process_is_never_closed_here(tmp_path: Path) -> None:
    """A training rank other than the main one stores under the main one's row; only the main one closes it."""
    from kernelrl.store.records import RunStatus

    with build_run(tasks=[TASK], eval_config=EvalConfig(), db_path=tmp_path / "k.db", record={"stage": "grpo"}) as main:
        with pytest.raises(ValueError), build_run(tasks=[TASK], eval_config=EvalConfig(), db_path=tmp_path / "k.db",
                                                  register_tasks=False) as rank:
            rank.adopt_row(main.run_id)
            assert rank.run_id == main.run_id
            raise ValueError("this rank failed")
        assert main.db is not None and main.db.get_run(main.run_id).status is RunStatus.RUNNING  # not closed by it
        with pytest.raises(ValueError, match="its own row"):
            main.adopt_row(main.run_id + 1)


def test_resume_reopens_the_latest_run_of_the_same_stage(tmp_path: Path) -> None:
    from kernelrl.store.records import RunStatus

    def build(record: dict[str, Any], resume: bool) -> contextlib.AbstractContextManager[Any]:
        return build_run(tasks=[TASK], eval_config=EvalConfig(), db_path=tmp_path / "k.db", record=record,
                         resume=resume)

    with build({"budget": 1}, False) as run:
        search = run.run_id
    with build({"stage": "bench"}, False) as run:
        bench = run.run_id
    with build({"budget": 2}, True) as run:  # a search: the latest run with no stage
        assert (run.run_id, run.resumed) == (search, True)
    with build({"stage": "grpo"}, True) as run:  # none of its stage yet: a new row
        assert run.run_id not in (search, bench) and not run.resumed
    with Database(tmp_path / "k.db") as db:
        assert db.get_run(search).config == {"budget": 2} and db.get_run(search).status is RunStatus.FINISHED
        assert db.get_run(bench).config == {"stage": "bench"}


def test_a_record_needs_the_runs_database() -> None:
    with pytest.raises(ValueError, match="its database"), build_run(tasks=[TASK], eval_config=EvalConfig(),
                                                                    record={"stage": "bench"}):
        pass


def test_a_run_page_needs_the_runs_database() -> None:
    with pytest.raises(ValueError, match="run's database"), build_run(tasks=[TASK], eval_config=EvalConfig(),
                                                                      watch=WatchConfig(port=0)):
        pass


def test_a_taken_port_fails_before_the_judge_or_a_proposer_is_built(tmp_path: Path, monkeypatch, made) -> None:
    import kernelrl.run_parts as run_parts

    built: list[FakeJudge] = []
    monkeypatch.setattr(run_parts, "make_judge", lambda *a, **k: built.append(FakeJudge()) or built[-1])
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    try:
        port = holder.getsockname()[1]
        with pytest.raises(OSError), build_run(tasks=[TASK], eval_config=EvalConfig(), db_path=tmp_path / "a.db",
                                               watch=WatchConfig(port=port)) as run:
            run.judge  # noqa: B018 - never reached
    finally:
        holder.close()
    assert built == [] and made == []


def test_a_run_given_no_console_prints_nothing(tmp_path: Path, capsys) -> None:
    with build_run(tasks=[TASK], eval_config=EvalConfig(), db_path=tmp_path / "a.db", watch=WatchConfig(port=0)) as run:
        run.reporter.say("a notice")
        assert run.reporter.page_url is not None
    assert capsys.readouterr() == ("", "")


def test_watch_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="0-65535"):
        WatchConfig(port=70000)
    with pytest.raises(ValueError, match="host"):
        WatchConfig(port=0, host=" ")
