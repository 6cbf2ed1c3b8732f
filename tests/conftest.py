"""Shared fixtures: quick evaluator settings, a private build cache, tiny task files, CUDA skip.

Under `-m gpu` (a GPU machine, perhaps with only torch, Triton and pytest), a test module that
cannot be imported because an optional extra is missing is skipped, not a collection error; under
every other selection (CI's fast suite included) a missing extra stays an error.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import verdict_summary
from optional_extras import missing_extra

# The scripted OpenAI-compatible server (tests/openai_server.py) as a fixture for every test.
pytest_plugins = ("openai_server",)

TINY_TASK = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    """y = relu(x) * 2 + bias: elementwise, depends on every input value."""

    def __init__(self, features):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x):
        return torch.relu(x) * 2.0 + self.bias


batch_size = 64
features = 256


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_init_inputs():
    return [features]
'''


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One build cache for the session (C++ builds are slow; tests share them), and with it one
    device lock (`locks/` under it) for every evaluator the tests make.

    Under pytest-xdist the workers' base folders share a parent, and the cache goes there: one
    lock for all of them, so a test timing on a GPU is not disturbed by another worker's checks.
    On the 2026-11-27 H200, 8 workers with a lock each made the idle probe refuse two red-team
    measurements and a plain call read 10.9 ms behind another test's spin.
    """
    env = os.environ.get("KERNELRL_TEST_CACHE")
    if env:
        return Path(env)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = tmp_path_factory.getbasetemp().parent / "kernelrl-cache"
        shared.mkdir(exist_ok=True)
        return shared
    return tmp_path_factory.mktemp("kernelrl-cache")


@pytest.fixture
def device_alone(cache_dir: Path):
    """The tests' CUDA device lock, held exclusively for the test: for gpu tests that put work on
    the device outside an evaluator (a bare worker, a probe, modules run in the test's process),
    so their work lands in no other test's measurement and none lands in theirs."""
    from kernelrl.judge.harness.device import Device
    from kernelrl.judge.timing.devicelock import DeviceLock

    with DeviceLock(cache_dir, Device.CUDA).timing():
        yield


@pytest.fixture
def quick_config(cache_dir: Path):
    """Evaluator settings that judge a tiny task in a few seconds."""
    from judge_fixtures import QUICK_AA_TOLERANCE, quick_timing
    from kernelrl.judge.evaluator import EvalConfig

    return EvalConfig(cache_dir=cache_dir, timeout_s=120, timing=quick_timing(), aa_tolerance=QUICK_AA_TOLERANCE)


@pytest.fixture(scope="session")
def shared_evaluator():
    """evaluator(config): one long-lived Evaluator per distinct config for the whole session, as a
    search or a trainer keeps one. Its warm workers serve the next test, and a task it judged
    before is not loaded again; a test that needs a judge nothing else touched (patched
    internals, a cache it inspects) makes its own. It remembers results: a candidate it judged
    for a task is not judged again."""
    from kernelrl.judge.evaluator import EvalConfig, Evaluator

    made: list[tuple[EvalConfig, Evaluator]] = []

    def get(config: EvalConfig) -> Evaluator:
        for known, ev in made:
            if known == config:
                return ev
        made.append((config, Evaluator(config)))
        return made[-1][1]

    yield get
    for _, ev in made:
        ev.close()


@pytest.fixture(scope="session")
def reference_runner(cache_dir: Path):
    """An evaluator for tests that only run references (degeneracy, profiles): workers stay warm."""
    from kernelrl.judge.evaluator import EvalConfig, Evaluator

    with Evaluator(EvalConfig(cache_dir=cache_dir, roofline=False, concurrency=1)) as ev:
        yield ev


@pytest.fixture
def tiny_task(tmp_path: Path):
    from kernelrl.tasks.task import load_task_file

    path = tmp_path / "tiny_relu_bias.py"
    path.write_text(TINY_TASK)
    return load_task_file(path)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if not (report.failed and isinstance(collector, pytest.Module)
            and "gpu" in (collector.config.option.markexpr or "").replace("not gpu", "")):
        return
    name = missing_extra(str(report.longrepr))
    if name:
        report.outcome = "skipped"
        report.longrepr = (str(collector.path), 0, f"Skipped: needs {name} (an optional extra)")


# `pytest.mark.xdist_group("cpu_judge")` (a module's `pytestmark`): the files whose time is mostly
# evaluations holding the CPU's device lock (`kernelrl.judge.timing.devicelock`: one measurement at a
# time, no checks beside it). Under `-n 2 --dist loadgroup` one worker runs them in turn while the
# other runs the rest, which then seldom waits for that lock.
@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Under loadgroup a test without a group is scheduled alone; a file's tests stay together, so
    # its module fixtures (warm evaluators, a red-team group's verdicts) are made once.
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(str(item.path)))
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# The red-team and control verdicts, printed after the run (`verdict_summary.py`), from every
# xdist worker when there are several.
def pytest_sessionfinish(session: pytest.Session) -> None:
    verdict_summary.send_from_worker(session.config)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's: a worker process ended
def pytest_testnodedown(node: object, error: object) -> None:
    output = getattr(node, "workeroutput", None)
    config = getattr(node, "config", None)
    if isinstance(output, dict) and config is not None:
        verdict_summary.merge_from_worker(config, output)


def pytest_terminal_summary(terminalreporter: object, exitstatus: int, config: pytest.Config) -> None:
    verdict_summary.write(terminalreporter, config)
