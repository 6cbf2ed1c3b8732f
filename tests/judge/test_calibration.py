"""A/A calibration: identical code must measure 1.00, in every role, on tasks of every kind."""

from __future__ import annotations

import pytest

from kernelrl.judge.evaluator import EvalConfig, Evaluator
from kernelrl.tasks.suites import builtin_task

pytestmark = pytest.mark.xdist_group("cpu_judge")  # see conftest.py

# Six kinds and durations of work: elementwise (sub-millisecond at the small size), a reduction,
# a softmax, a matmul, a convolution and a level-3 block.
KINDS = ("level1/gelu", "level1/sum_dim", "level1/softmax", "level1/matmul_square", "level1/conv2d",
         "level3/mlp_block")


def test_calibration_runs_and_reports_every_role(tiny_task, quick_config):
    with Evaluator(quick_config) as ev:
        runs = ev.calibrate(tiny_task, runs=1)
    (run,) = runs
    assert run.task == tiny_task.name and run.rounds >= quick_config.timing.min_rounds
    assert run.b_over_a == pytest.approx(run.speedup_b / run.speedup_a)
    # loose here (a shared machine, two cores); the slow test below holds the +-2 % line
    assert 0.7 < run.speedup_a < 1.4 and 0.7 < run.speedup_b < 1.4


@pytest.mark.slow
@pytest.mark.parametrize("task_name", KINDS)
def test_identical_code_measures_one_within_two_percent_five_times_of_five(task_name, cache_dir):
    with Evaluator(EvalConfig(cache_dir=cache_dir)) as ev:
        runs = ev.calibrate(builtin_task(task_name), runs=5)
    figures = [(round(r.speedup_a, 3), round(r.speedup_b, 3), round(r.b_over_a, 3)) for r in runs]
    print(f"{task_name}: {figures}")
    assert all(r.within(0.02) for r in runs), figures


def test_trusted_copies_are_timed_but_not_spot_checked(tiny_task, quick_config):
    """Calibration's copies are the reference's own code, vouched for by the caller: fetching their
    outputs buys nothing. A member nobody vouched for, identical or not, is spot-checked."""
    from kernelrl.candidate import Candidate
    from kernelrl.judge.group import run_group
    from kernelrl.result import EvalResult

    rewrite = ("import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n"
               "    def __init__(self, features):\n        super().__init__()\n"
               "        self.bias = nn.Parameter(torch.randn(features))\n\n"
               "    def forward(self, x):\n        return torch.clamp(x, min=0.0) * 2.0 + self.bias\n")
    copies = [Candidate(source=tiny_task.source + f"\n\n# copy {c}\nModelNew = Model\n") for c in "ab"]
    copies.append(Candidate(source=rewrite))
    members = {c.hash: (c, [i]) for i, c in enumerate(copies)}
    got: dict[int, EvalResult] = {}
    with Evaluator(quick_config) as ev:
        run_group(ev.context, tiny_task, members, lambda positions, res: got.update({positions[0]: res}),
                  trusted=frozenset(c.hash for c in copies[:2]))
    timings = [got[i].environment.timing for i in range(3)]
    assert all(t is not None for t in timings), [(r.status, r.message[:200]) for r in got.values()]
    assert [t.spot_checks for t in timings if t][:2] == [0, 0]
    assert timings[2] is not None and timings[2].spot_checks >= quick_config.timing.min_spot_checks
