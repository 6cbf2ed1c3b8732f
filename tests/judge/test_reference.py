"""Task code runs in a reference worker, under the evaluation's limits, never in the judge."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from rich.console import Console

from judge_fixtures import quick_timing
from kernelrl.judge.contract import SearchJudge
from kernelrl.judge.evaluator import EvalConfig, Evaluator
from kernelrl.judge.reference import ReferenceFailed
from kernelrl.result import Status
from kernelrl.run_parts import build_run
from kernelrl.search.loop import SearchConfig, run_search
from kernelrl.tasks.task import Task, load_task_file

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
    config = EvalConfig(cache_dir=tmp_path_factory.mktemp("ref-cache"), timeout_s=8.0, roofline=False, timing=quick_timing())
    with Evaluator(config) as ev:
        yield ev


@pytest.mark.parametrize("name,kw,reason", [
    # loading resolves the small size, which already calls get_inputs (on the meta device)
    ("hangs_in_get_inputs", {"inputs": "while True: pass"}, "did not finish while loading within 8 s"),
    ("hangs_at_import", {"module": "while True: pass"}, "did not finish while loading within 8 s"),
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
    # the task's 8 s limit, far below the default 300 s; the slack covers the module evaluator's first
    # workers starting on two busy cores (the first case took 17.1 s once, 14.8 s in a full run)
    assert time.monotonic() - t0 < 8.0 + 12.0


def test_a_good_task_still_runs_after_bad_ones(evaluator):
    res = evaluator.evaluate(task("good"), CANDIDATE)
    assert res.status is Status.CORRECT, res.message


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
    out = subprocess.run([sys.executable, "-m", "kernelrl", "eval", str(path), str(cand), "--timeout", "10"],
                         capture_output=True, text=True, env=env, timeout=120)
    elapsed = time.monotonic() - t0
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "the task's reference fails" in lines[0] and "within 10 s" in lines[0], out.stderr
    assert elapsed < 10 + 15


def test_a_search_goes_on_with_its_other_tasks(tmp_path):
    good = tmp_path / "good.py"
    good.write_text(task("good").source)
    bad = tmp_path / "bad.py"
    bad.write_text(task("bad", module="raise RuntimeError('broken task')").source)
    config = SearchConfig(tasks=(str(good), str(bad)), db_path=tmp_path / "k.db", budget=1, chains=1,
                          baselines=False, eval=EvalConfig(cache_dir=tmp_path / "cache", timeout_s=30, roofline=False,
                                                                       timing=quick_timing()))
    tasks = [load_task_file(good), load_task_file(bad)]
    with build_run(tasks=tasks, eval_config=config.judge_config()) as run:
        assert isinstance(run.judge, SearchJudge)  # the in-process evaluator gives the search everything it uses
        summary = run_search(config, console=Console(file=io.StringIO()), tasks=tasks, judge=run.judge,
                             proposer=run.proposer(config.proposer, **config.proposer_options()))
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
    hanging task would cost its 8 s limit), and in a group whose task fails, a refused member is
    flagged while its group-mate gets the task error."""
    t0 = time.monotonic()
    alone = evaluator.evaluate(task("hangs_but_unread", inputs="while True: pass"), REFUSED)
    assert alone.status is Status.FLAGGED and "dynamic_code" in alone.message, alone.message
    assert time.monotonic() - t0 < 4.0
    assert alone.environment.phases is not None and alone.environment.phases.reference_load_s == 0.0
    refused, ran = evaluator.evaluate_batch([(task("hangs_with_mates", inputs="while True: pass"), REFUSED),
                                             (task("hangs_with_mates", inputs="while True: pass"), CANDIDATE)])
    assert refused.status is Status.FLAGGED and ran.status is Status.TASK_ERROR, (refused.message, ran.message)
