"""The roofline: measured peaks cached per machine, floors from the task's profile, % of roofline."""

from __future__ import annotations

import textwrap

import pytest

from kernelrl.judge.evaluator import EvalConfig, Evaluator
from kernelrl.judge.harness.profile import TaskProfile
from kernelrl.judge.isolation.sandbox import SandboxConfig
from kernelrl.judge.timing import roofline
from kernelrl.judge.timing.roofline import MachinePeaks, floors, machine_peaks, roofline_pct, save_peaks
from kernelrl.result import Status
from kernelrl.tasks.task import Task

pytestmark = pytest.mark.xdist_group("cpu_judge")  # see conftest.py

MATMUL = Task(name="mm", source=textwrap.dedent('''
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        def forward(self, a, b):
            return a @ b


    n = 128


    def get_inputs():
        return [torch.randn(n, n), torch.randn(n, n)]


    def get_init_inputs():
        return []
'''))
CANDIDATE = "import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n    def forward(self, a, b):\n" \
            "        return torch.matmul(a, b)\n"


def profile(**kw) -> TaskProfile:
    base = dict(task="t", size="small", constants={}, inputs=[], init_args=[], outputs=[], flops=2 * 10**9,
                input_bytes=4 * 10**6, output_bytes=10**6, param_bytes=0, dtype="float32")
    return TaskProfile(**{**base, **kw})


PEAKS = MachinePeaks(device="cpu", name="test", threads=2, bandwidth_gbs=10.0, fp32_tflops=0.1, bf16_tflops=None,
                     source="measured", measured_at=0.0)


def test_floors_take_bytes_and_flops_and_the_tighter_wins():
    f = floors(profile(), PEAKS)
    assert f.memory_ms == pytest.approx(0.5) and f.compute_ms == pytest.approx(20.0) and f.floor_ms == f.compute_ms
    assert roofline_pct(40.0, f) == pytest.approx(50.0)
    elementwise = floors(profile(flops=0), PEAKS)
    assert elementwise.compute_ms is None and elementwise.floor_ms == pytest.approx(0.5)


def test_peaks_are_measured_once_per_machine_and_cached(tmp_path):
    sandbox = SandboxConfig()
    first = machine_peaks(device="cpu", sandbox=sandbox, cache_dir=tmp_path)
    assert first.source == "measured" and first.bandwidth_gbs > 0.1 and first.fp32_tflops > 0
    again = machine_peaks(device="cpu", sandbox=sandbox, cache_dir=tmp_path)
    assert again == first  # read back, not measured again


def test_a_correct_result_reports_its_share_of_the_roofline(quick_config):
    with Evaluator(quick_config) as ev:
        res = ev.evaluate(MATMUL, CANDIDATE)
    assert res.status is Status.CORRECT, res.message
    roof = res.environment.roofline
    assert roof is not None and roof.flops == 2 * 128**3 and roof.min_bytes == 3 * 128 * 128 * 4
    assert res.roofline_pct is not None and res.roofline_pct > 0 and res.ref_roofline_pct is not None
    assert res.to_dict()["roofline_pct"] == res.roofline_pct


# The same product, done slowly: a reference that sleeps demonstrates only a low rate.
SLOW_MATMUL = Task(name="mm_slow", source=MATMUL.source.replace(
    "        return a @ b", "        time.sleep(0.02)\n        return a @ b").replace("import torch\n", "import time\nimport torch\n", 1))


def slow_machine(quick_config, folder: str) -> tuple[MachinePeaks, EvalConfig]:
    """Absurdly low peaks recorded for this machine in a cache folder of their own, and a config using it."""
    slow = MachinePeaks(device="cpu", name="slow", threads=quick_config.sandbox.effective_threads,
                        bandwidth_gbs=1e-4, fp32_tflops=1e-9, bf16_tflops=None, source="measured", measured_at=0.0)
    config = EvalConfig(**{**quick_config.__dict__, "cache_dir": quick_config.cache_dir / folder})
    save_peaks(slow, cache_dir=config.cache_dir)
    return slow, config


def test_faster_than_the_floor_is_flagged_with_both_floors(quick_config, monkeypatch):
    # A machine whose peaks measure absurdly low (recorded, and again when a candidate beats them)
    # and a reference that shows no more than them: the peaks are raised to what the reference
    # demonstrates (about 20 ms a call), and a candidate doing the product in well under a
    # millisecond beats both floors built on them.
    slow, config = slow_machine(quick_config, "peaks-slow")
    monkeypatch.setattr(roofline, "_measure", lambda *a, **k: slow)
    with Evaluator(config) as ev:
        res = ev.evaluate(SLOW_MATMUL, CANDIDATE)
    assert res.status is Status.FLAGGED and res.speedup is None
    (finding,) = [f for f in res.findings if f.rule == "impossible_speedup"]
    assert "memory floor" in finding.message and "compute floor" in finding.message


def test_peaks_are_raised_to_what_the_reference_demonstrates(quick_config):
    # The same absurd peaks with a reference that runs at the machine's real speed: the reference
    # proves the machine faster than recorded, so a candidate as fast as it is not refused.
    _, config = slow_machine(quick_config, "peaks-slow-demonstrated")
    with Evaluator(config) as ev:
        res = ev.evaluate(MATMUL, CANDIDATE)
    assert res.status is Status.CORRECT, res.message
    assert not [f for f in res.findings if f.rule == "impossible_speedup"]
