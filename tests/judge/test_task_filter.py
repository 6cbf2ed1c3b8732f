"""The degeneracy filter passes every built-in task and flags tasks a constant answer would pass."""

from __future__ import annotations

import textwrap

import pytest

from kernelrl.judge.degeneracy import check_degeneracy, check_tasks
from kernelrl.tasks import suites
from kernelrl.tasks.degeneracy import DegeneracyReport
from kernelrl.tasks.task import Task, TaskError

pytestmark = pytest.mark.xdist_group("cpu_judge")  # see conftest.py


def make_task(name: str, forward: str, inputs: str, consts: str = "n = 1024") -> Task:
    source = textwrap.dedent(f'''
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def forward(self, x):
                {forward}

        {consts}

        def get_inputs():
            return [{inputs}]

        def get_init_inputs():
            return []
    ''')
    return Task(name=name, source=source)


# Three kinds of task in the fast suite (elementwise, reduction, fused GEMM); all of them under -m slow.
_FAST = ("level1/gelu", "level1/sum_dim", "level2/linear_bias_gelu_scale")


@pytest.mark.parametrize("task", [pytest.param(t, marks=() if t.name in _FAST else pytest.mark.slow)
                                  for t in suites.load_suite("builtin")], ids=lambda t: t.name)
def test_builtin_tasks_are_not_degenerate(task, reference_runner):
    report = check_degeneracy(task, evaluator=reference_runner)
    assert not report.degenerate, report.summary()
    assert report.sensitivity > 0.05 and report.output_rel_std > 0.05
    assert not report.zero_passes and not report.constant_passes


DEGENERATE = {
    "zeros_like": ("return torch.zeros_like(x)", "torch.randn(n, n)", "all zeros"),
    "x_minus_x": ("return x - x", "torch.randn(n, n)", "all zeros"),
    "constant": ("return torch.full((16,), 3.0)", "torch.randn(n)", "fixed answer"),
    # mean of 10^6 standard normals is ~1e-3; divided by 100 it is inside atol, so zeros pass
    "tiny_mean": ("return torch.mean(x).reshape(1) / 100", "torch.randn(n)", "all-zero answer"),
    # the output moves by ~1e-7 of its size when x changes completely
    "offset_dominated": ("return 1e6 + 1e-2 * x", "torch.randn(n)", "changes by"),
    "nan": ("return x / 0 * 0", "torch.randn(n)", "NaN or inf"),
    # depends only on the input's shape
    "shape_only": ("return torch.arange(x.shape[0], dtype=torch.float32)", "torch.randn(n)", "fixed answer"),
}


@pytest.mark.parametrize("name", sorted(DEGENERATE))
def test_degenerate_tasks_are_flagged(name, reference_runner):
    forward, inputs, reason = DEGENERATE[name]
    consts = "n = 1000000" if name == "tiny_mean" else "n = 256"
    report = check_degeneracy(make_task(name, forward, inputs, consts), n_inputs=3, evaluator=reference_runner)
    assert report.degenerate, report.summary()
    assert any(reason in r for r in report.reasons), report.reasons


def test_measurements_of_a_plain_task(reference_runner):
    report = check_degeneracy(make_task("double", "return 2 * x", "torch.randn(n)"), n_inputs=3, seed=5,
                              evaluator=reference_runner)
    assert isinstance(report, DegeneracyReport)
    assert not report.degenerate and report.reasons == []
    # two independent N(0, 4) vectors: ||a - b|| / max(||a||, ||b||) is about sqrt(2)
    assert 1.2 < report.sensitivity < 1.6
    assert 1.0 < report.output_rel_std < 1.4
    assert report.mean_abs_output == pytest.approx(2 * (2 / 3.14159) ** 0.5, rel=0.1)
    assert "ok" in report.summary()


def test_integer_output_compared_exactly(reference_runner):
    report = check_degeneracy(make_task("argmax", "return x.argmax(dim=-1)", "torch.randn(64, 32)"),
                              evaluator=reference_runner)
    assert not report.degenerate, report.summary()
    always_zero = check_degeneracy(make_task("argmin_of_zero", "return (x * 0).long().sum(dim=-1)",
                                             "torch.randn(64, 32)"), evaluator=reference_runner)
    assert always_zero.degenerate


def test_perturbed_nonfinite_is_a_note_not_a_reason(reference_runner):
    report = check_degeneracy(make_task("log", "return torch.log(x)", "torch.rand(n) + 0.5"), n_inputs=3,
                              evaluator=reference_runner)
    assert not report.degenerate, report.summary()
    assert report.notes and "non-finite" in report.notes[0]


def test_bad_arguments_and_broken_tasks(reference_runner):
    task = make_task("double", "return 2 * x", "torch.randn(n)")
    with pytest.raises(ValueError, match="n_inputs"):
        check_degeneracy(task, n_inputs=1)
    broken = make_task("broken", "return x @ x", "torch.randn(3, 5)")
    with pytest.raises(TaskError, match="the reference failed making inputs: RuntimeError"):
        check_degeneracy(broken, evaluator=reference_runner)
    results = list(check_tasks([task, broken], n_inputs=2))
    assert isinstance(results[0], DegeneracyReport) and isinstance(results[1], TaskError)
