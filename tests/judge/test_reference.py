"""Task code runs in a reference worker, under the evaluation's limits, never in the judge."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from judge_fixtures import quick_timing
from kernelrl.judge.contract import SearchJudge
from kernelrl.judge.evaluator import EvalConfig, Evaluator
from kernelrl.judge.reference import ReferenceFailed
from kernelrl.result import Status
from kernelrl.run_parts import build_run
from kernelrl.search.loop import SearchConfig, run_search
from kernelrl.tasks.task import Task, load_task_file

pytestmark = pytest.mark.xdist_group("cpu_judge")  # see conftest.py

BODY = textwrap.dedent('''
    import os
    import time
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        def forward(self, x):
            return x * 2.0


    n = 64
    {module}

    def get_inputs():
        {inputs}
        return [torch.randn(n)]


    def get_init_inputs():
        return []
''')

CANDIDATE = "import torch.nn as nn\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return x + x\n"


def task(name: str, *, module: str = "", inputs: str = "pass") -> Task:
    return Task(name=name, source=BODY.format(module=module, inputs=inputs))


@pytest.fixture(scope="module")
def evaluator(tmp_path_factory):
    config = EvalConfig(cache_dir=tmp_path_factory.mktemp("ref-cache"), timeout_s=5.0, roofline=False, timing=quick_timing())
    with Evaluator(config) as ev:
        yield ev


@pytest.mark.parametrize("name,kw,reason", [
    # loading resolves the small size, which already calls get_inputs (on the meta device)
    ("hangs_in_get_inputs", {"inputs": "while True: pass"}, "did not finish while loading within 5 s"),
    ("hangs_at_import", {"module": "while True: pass"}, "did not finish while loading within 5 s"),
    ("crashes_at_import", {"module": "import ctypes; ctypes.string_at(0)"}, "worker died while loading"),
    ("exits_in_get_inputs", {"inputs": "os._exit(3)"}, "worker died while loading"),
    ("runs_out_of_memory", {"inputs": "x = torch.ones(1 << 36) if torch.randn(1).device.type == 'cpu' else 0"},
     "failed making inputs"),
])
def test_a_bad_task_is_a_task_error_within_the_limit(evaluator, name, kw, reason):
    t0 = time.monotonic()
    res = evaluator.evaluate(task(name, **kw), CANDIDATE)
    assert res.status is Status.TASK_ERROR and reason in res.message, res.message
    assert "\n" not in res.message
    # the task's 5 s limit, far below the default 300 s; the slack covers the module evaluator's first
    # workers starting on two busy cores (the first case took 17.1 s once under an 8 s limit)
    assert time.monotonic() - t0 < 5.0 + 12.0


def test_a_good_task_still_runs_after_bad_ones(evaluator):
    res = evaluator.evaluate(task("good"), CANDIDATE)
    assert res.status is Status.CORRECT, res.message


def test_a_reference_that_writes_its_inputs_sends_its_sets_as_made(tmp_path):
    # On the host the reference runs on the set itself (no copy beside it). This one doubles its
    # input in place and returns it: the set sent is still the one made from the seed (a
    # candidate is judged on it), and the output is the reference's on that set.
    import torch

    from kernelrl.judge.harness import protocol as P
    from kernelrl.judge.harness.device import Device
    from kernelrl.judge.isolation.sandbox import SandboxConfig, Worker

    source = BODY.replace("return x * 2.0", "return x.mul_(2.0)").format(module="", inputs="pass")
    worker = Worker(config=SandboxConfig(), device=Device.CPU, root=tmp_path)
    try:
        deadline = time.monotonic() + 120
        loaded = worker.request(P.LoadTask(task_source=source, task_name="writes", size="small", presets={},
                                           overrides={}, device="cpu", threads=1, init_seed=0, evict_bytes=0,
                                           profile=False, cache_root=str(tmp_path / "cache")), deadline=deadline)
        assert not loaded.failed, loaded.header.message
        made = worker.request(P.MakeInputs(seeds=[7], perturb=[None], run=True), deadline=deadline)
        assert not made.failed, made.header.message
    finally:
        worker.close()
    torch.manual_seed(7)
    expected = torch.randn(64)
    (x,), (out,) = made.payload["inputs"][0], made.payload["outputs"]
    assert torch.equal(x, expected) and torch.equal(out, 2.0 * expected)


def test_task_code_does_not_see_the_judges_secrets(evaluator, monkeypatch):
    monkeypatch.setenv("KERNELRL_TEST_SECRET", "s3cret")
    snoop = task("snoop", inputs="assert 'KERNELRL_TEST_SECRET' not in os.environ and b's3cret' not in "
                                 "open('/proc/self/environ', 'rb').read()")
    # workers started after the secret was set: a fresh evaluator
    with Evaluator(evaluator.config) as ev:
        res = ev.evaluate(snoop, CANDIDATE)
    assert res.status is Status.CORRECT, res.message


def test_the_cli_ends_a_hanging_task_with_one_line_and_exit_2(tmp_path):
    path = tmp_path / "hang.py"
    path.write_text(task("hang", inputs="while True: pass").source)
    cand = tmp_path / "cand.py"
    cand.write_text(CANDIDATE)
    env = {**os.environ, "KERNELRL_CACHE": str(tmp_path / "cache")}
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "kernelrl", "eval", str(path), str(cand), "--timeout", "5"],
                         capture_output=True, text=True, env=env, timeout=120)
    elapsed = time.monotonic() - t0
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "the task's reference fails" in lines[0] and "within 5 s" in lines[0], out.stderr
    assert elapsed < 5 + 15


def test_a_search_goes_on_with_its_other_tasks(tmp_path):
    good = tmp_path / "good.py"
    good.write_text(task("good").source)
    bad = tmp_path / "bad.py"
    bad.write_text(task("bad", module="raise RuntimeError('broken task')").source)
    config = SearchConfig(tasks=(str(good), str(bad)), db_path=tmp_path / "k.db", budget=1, chains=1,
                          baselines=False, eval=EvalConfig(cache_dir=tmp_path / "cache", timeout_s=30, roofline=False,
                                                                       timing=quick_timing()))
    tasks = [load_task_file(good), load_task_file(bad)]
    with build_run(tasks=tasks, eval_config=config.judge_config(), db_path=config.db_path,
                   record={"task_names": [t.name for t in tasks]}) as run:
        assert isinstance(run.judge, SearchJudge)  # the in-process evaluator gives the search everything it uses
        summary = run_search(config, run)
    by_name = {t.task: t for t in summary.tasks}
    assert by_name["good"].evaluated == 1
    assert by_name["bad"].evaluated == 0 and "broken task" in by_name["bad"].gave_up
    assert any("bad" in e and "broken task" in e for e in summary.errors)


def test_paths_in_this_file_are_not_task_files():
    assert not Path(__file__).name.startswith("task")


def test_baselines_of_several_tasks_are_one_batch_and_a_broken_reference_is_none(evaluator):
    good, other, bad = task("bl_good"), task("bl_other", module="n = 128"), task("bl_bad", module="raise RuntimeError('x')")
    heard: list[tuple[int, object]] = []
    got = evaluator.baselines([good, bad, other, good], compile=False,
                              on_result=lambda i, found: heard.append((i, found)))
    # each position is handed over once, as its group closes, with what the call returns for it
    assert sorted(i for i, _ in heard) == [0, 1, 2, 3]
    assert all(found == got[i] or str(found) == str(got[i]) for i, found in heard)
    assert isinstance(got[1], ReferenceFailed) and "bl_bad" in str(got[1]) and "RuntimeError: x" in str(got[1])
    assert got[0] is not None and got[0].eager_ms > 0 and got[2] is not None and got[2].eager_ms > 0
    assert got[3] is got[0] or got[3] == got[0]  # a task given twice is measured once
    assert evaluator.baseline(good, compile=False) == got[0]  # and what was measured is kept


def test_a_baseline_checks_one_input_set_and_a_candidate_all_of_them(evaluator, monkeypatch):
    """A group of the task's own programs pays no one: one plain set is enough to check the compiled
    reference; the perturbed sets are made only for a candidate (at full size a set is the task's
    whole inputs)."""
    from kernelrl.judge.reference import ReferenceSession

    asked: list[int] = []
    made = ReferenceSession.correctness_sets

    def counted(self, n):  # type: ignore[no-untyped-def]
        asked.append(n)
        return made(self, n)

    monkeypatch.setattr(ReferenceSession, "correctness_sets", counted)
    t = task("bl_sets", module="n = 96")
    evaluator.baselines([t], compile=False)
    assert asked == [1]
    evaluator.evaluate(t, CANDIDATE)
    assert asked == [1, evaluator.config.n_correctness]


REFUSED = "import torch.nn as nn\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return eval('x + x')\n"


def test_a_member_refused_by_reading_keeps_its_verdict_whatever_the_task_does(evaluator):
    """Reading a member needs no reference: a group of refused members never loads it (the
    hanging task would cost its 5 s limit), and in a group whose task fails, a refused member is
    flagged while its group-mate gets the task error."""
    t0 = time.monotonic()
    alone = evaluator.evaluate(task("hangs_but_unread", inputs="while True: pass"), REFUSED)
    assert alone.status is Status.FLAGGED and "dynamic_code" in alone.message, alone.message
    assert time.monotonic() - t0 < 4.0
    assert alone.environment.phases is not None and alone.environment.phases.reference_load_s == 0.0
    refused, ran = evaluator.evaluate_batch([(task("hangs_with_mates", inputs="while True: pass"), REFUSED),
                                             (task("hangs_with_mates", inputs="while True: pass"), CANDIDATE)])
    assert refused.status is Status.FLAGGED and ran.status is Status.TASK_ERROR, (refused.message, ran.message)


# -- reference workers kept between groups (ReferenceKeeper) ------------------------------------

LINEAR = textwrap.dedent('''
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        def __init__(self, features):
            super().__init__()
            self.fc = nn.Linear(features, features)

        def forward(self, x):
            return self.fc(x)


    features = 32
    {module}

    def get_inputs():
        return [torch.randn(8, features)]


    def get_init_inputs():
        {init}
        return [features]
''')


def linear(name: str, *, module: str = "", init: str = "pass") -> Task:
    return Task(name=name, source=LINEAR.format(module=module, init=init))


LINEAR_CANDIDATE = ("import torch.nn as nn\n\nclass ModelNew(nn.Module):\n    def __init__(self, features):\n"
                    "        super().__init__()\n        self.fc = nn.Linear(features, features)\n\n"
                    "    def forward(self, x):\n        return self.fc(x)\n")


def test_a_reseeded_worker_gives_what_a_fresh_load_under_the_same_seed_gives(tmp_path):
    import random

    import torch

    from kernelrl.judge.isolation.pool import WorkerPool
    from kernelrl.judge.reference import ReferenceKeeper, session_for
    from kernelrl.judge.timing.inputs import plain_plan

    config = EvalConfig(cache_dir=tmp_path, timeout_s=60.0, roofline=False)
    t = linear("reseeded")
    pool = WorkerPool(config=config.sandbox, device=config.device, size=0)
    keeper = ReferenceKeeper(size=1)
    sessions = []
    try:
        first = session_for(t, config, pool=pool, rng=random.Random(1))
        sessions.append(first)
        first.load(constants=None, profile=False)
        first_state = first.state()
        keeper.release(t, first)
        again = session_for(t, config, pool=pool, rng=random.Random(2), kept=keeper.take(t))
        fresh = session_for(t, config, pool=pool, rng=random.Random(2))
        sessions += [again, fresh]
        for s in (again, fresh):
            s.load(constants=dict(first.loaded.constants), profile=False)
        assert again.loaded.reseeded and not fresh.loaded.reseeded and pool.started == 2
        assert again.loaded.precision == fresh.loaded.precision and again.loaded.init_inputs == fresh.loaded.init_inputs
        plans = [plain_plan(random.Random(3))]
        (a_in,), (a_out,), _ = again.make(plans, run=True)
        (f_in,), (f_out,), _ = fresh.make(plans, run=True)
        a_state, f_state = again.state(), fresh.state()
        assert a_state is not None and f_state is not None and first_state is not None
        assert all(torch.equal(a_state[k], f_state[k]) for k in f_state)
        assert not torch.equal(a_state["fc.weight"], first_state["fc.weight"])  # the group's own seed
        assert torch.equal(a_in[0], f_in[0]) and torch.equal(a_out, f_out)
    finally:
        for s in sessions:
            s.close()
        keeper.close()
        pool.close()


# Tasks whose worker must not be reused for their next group, each with why.
NOT_REUSED = {
    # the task's code changed a global setting while its first group ran (from the forward's 4th
    # call on: loading, and its profile on the meta device, run it at most twice)
    "flips_a_setting": {"module": "_calls = []\nModel.forward = lambda self, x: (_calls.append(1), setattr("
                                  "torch.backends.cudnn, 'benchmark', len(_calls) > 3), self.fc(x))[2]"},
    # a thread its forward started lives on after the group (asleep: it would burn a core beside
    # the tests' other work; one that uses the CPU while kept: `test_a_kept_worker_that_used_the_cpu...`)
    "thread_after_its_group": {"module": "import threading\n_calls = []\ndef _wait():\n    threading.Event().wait()\n"
                                         "Model.forward = lambda self, x: (_calls.append(1), len(_calls) == 4 and "
                                         "threading.Thread(target=_wait, daemon=True).start(), self.fc(x))[2]"},
    # its get_init_inputs fails when called twice in one process: the reseed fails, a fresh load decides
    "init_once": {"module": "_calls = []", "init": "_calls.append(1); assert len(_calls) == 1"},
    # its kept worker dies before the next group (killed from outside, as the judge sees a death)
    "died_while_kept": {"module": "# its own source: a task of the same source is the same task"},
}


@pytest.fixture(scope="module")
def sessions(tmp_path_factory):
    """(config, pool, keeper) for tests of reference sessions alone: no candidate, no timing."""
    from kernelrl.judge.isolation.pool import WorkerPool
    from kernelrl.judge.reference import ReferenceKeeper

    config = EvalConfig(cache_dir=tmp_path_factory.mktemp("sessions"), timeout_s=30.0, roofline=False)
    pool = WorkerPool(config=config.sandbox, device=config.device, size=2)
    keeper = ReferenceKeeper(size=8)
    yield config, pool, keeper
    keeper.close()
    pool.close()


@pytest.mark.parametrize("name", NOT_REUSED)
def test_a_worker_whose_reseed_would_differ_from_a_fresh_load_is_not_reused(sessions, name):
    """Each task's session runs as a group's does (its load with a profile, five correctness sets),
    then the task's next session loads it: from a fresh worker, which succeeds."""
    import random

    from kernelrl.judge.reference import session_for
    from kernelrl.judge.timing.inputs import correctness_plans

    config, pool, keeper = sessions
    t = linear(name, **NOT_REUSED[name])
    first = session_for(t, config, pool=pool, rng=random.Random(1), kept=keeper.take(t))
    try:
        first.load(constants=None, profile=True)
        first.make(correctness_plans(5, random.Random(2)), run=True)
    finally:
        keeper.release(t, first)
    if name == "died_while_kept":
        dying = keeper.take(t)
        assert dying is not None
        os.killpg(dying.worker.proc.pid, signal.SIGKILL)
        dying.worker.proc.wait(timeout=10)
        keeper.keep(t, dying)
    second = session_for(t, config, pool=pool, rng=random.Random(3), kept=keeper.take(t))
    try:
        second.load(constants=dict(first.loaded.constants), profile=False)
        assert not second.loaded.reseeded and second.worker is not None
        second.make(correctness_plans(2, random.Random(4)), run=True)
    finally:
        second.close()


def test_a_tasks_next_batch_reseeds_its_kept_worker_and_says_so(shared_evaluator, quick_config):
    evaluator = shared_evaluator(quick_config)
    t = linear("kept")
    first = evaluator.evaluate(t, LINEAR_CANDIDATE)
    second = evaluator.evaluate(t, LINEAR_CANDIDATE + "# another\n")
    assert first.status is Status.CORRECT and second.status is Status.CORRECT, (first.message, second.message)
    assert first.environment.reference is not None and not first.environment.reference.reseeded
    assert second.environment.reference is not None and second.environment.reference.reseeded


def test_a_task_with_large_input_sets_keeps_no_worker(tmp_path, monkeypatch):
    import random

    import kernelrl.judge.reference as reference
    from kernelrl.judge.isolation.pool import WorkerPool
    from kernelrl.judge.timing.inputs import plain_plan

    config = EvalConfig(cache_dir=tmp_path, timeout_s=60.0, roofline=False)
    pool = WorkerPool(config=config.sandbox, device=config.device, size=0)
    session = reference.session_for(linear("large_sets"), config, pool=pool, rng=random.Random(1))
    try:
        session.load(constants=None, profile=False)
        session.make([plain_plan(random.Random(2))], run=True)
        assert session.sets.largest > 0
        monkeypatch.setattr(reference, "KEEP_MAX_SET_BYTES", session.sets.largest - 1)
        assert session.release() is None and session.worker is None
    finally:
        session.close()
        pool.close()


class _StubProcess:
    def poll(self) -> int | None:
        return None  # its sandbox still runs


class _StubWorker:
    def __init__(self) -> None:
        self.closed = False
        self.cpu_ns = 0
        self.proc = _StubProcess()

    def close(self) -> None:
        self.closed = True

    def cpu_time_ns(self) -> int:
        return self.cpu_ns


def _kept(worker: _StubWorker):  # type: ignore[no-untyped-def]
    from kernelrl.judge.reference import KeptReference

    return KeptReference(worker=worker, precision={}, settings={}, threads=1)  # type: ignore[arg-type]


def test_a_kept_worker_that_used_the_cpu_while_it_waited_is_not_handed_out():
    from kernelrl.judge.reference import ReferenceKeeper

    keeper = ReferenceKeeper(size=2)
    busy, idle = _StubWorker(), _StubWorker()
    keeper.keep(task("busy"), _kept(busy))
    keeper.keep(task("idle"), _kept(idle))
    busy.cpu_ns = 200_000_000  # a thread of the task's ran 0.2 s since it was kept
    assert keeper.take(task("busy")) is None and busy.closed
    taken = keeper.take(task("idle"))
    assert taken is not None and taken.worker is idle and not idle.closed


def test_the_keeper_holds_at_most_its_size_and_closes_what_it_drops():
    from kernelrl.judge.reference import ReferenceKeeper

    keeper = ReferenceKeeper(size=1)
    a, b, c = _StubWorker(), _StubWorker(), _StubWorker()
    keeper.keep(task("a"), _kept(a))
    keeper.keep(task("b"), _kept(b))
    assert a.closed and not b.closed  # the oldest went
    assert keeper.take(task("a")) is None
    taken = keeper.take(task("b"))
    assert taken is not None and taken.worker is b
    keeper.keep(task("b"), taken)
    keeper.close()
    assert b.closed
    keeper.keep(task("c"), _kept(c))  # after close: nothing is held
    assert c.closed and keeper.take(task("c")) is None
