"""What a reference's outputs say about its task, judged without running anything."""

from __future__ import annotations

import pytest
import torch

from kernelrl.tasks.degeneracy import judge_outputs, outputs_degenerate
from kernelrl.tasks.task import TaskError


def _sets(*values: torch.Tensor) -> list[list[torch.Tensor]]:
    return [[v] for v in values]


def test_outputs_that_follow_their_inputs_are_not_degenerate():
    g = torch.Generator().manual_seed(0)
    outs = _sets(*(torch.randn(256, generator=g) for _ in range(6)))
    report = judge_outputs("t", "small", outs, n_inputs=3)
    assert not report.degenerate and report.reasons == [] and report.sensitivity > 0.5
    assert outputs_degenerate(outs) == []


def test_a_constant_output_is_degenerate_with_the_reason_named():
    outs = _sets(*(torch.full((64,), 3.0) for _ in range(6)))
    report = judge_outputs("t", "small", outs, n_inputs=3)
    assert report.degenerate and report.constant_passes
    assert any("fixed answer" in r for r in report.reasons)
    assert outputs_degenerate(outs)


def test_outputs_within_tolerance_of_zero_are_degenerate():
    g = torch.Generator().manual_seed(1)
    outs = _sets(*(1e-6 * torch.randn(64, generator=g) for _ in range(4)))
    report = judge_outputs("t", "small", outs, n_inputs=2)
    assert report.degenerate and report.zero_passes


def test_non_tensor_outputs_are_the_tasks_fault():
    with pytest.raises(TaskError, match="not a tensor"):
        judge_outputs("t", "small", [["x"], ["y"]], n_inputs=2)
    with pytest.raises(ValueError, match="n_inputs"):
        judge_outputs("t", "small", _sets(torch.ones(2)), n_inputs=1)


@pytest.mark.parametrize("where", ["first chunk", "last chunk"])
def test_one_value_outside_the_tolerance_in_any_chunk_tells_outputs_apart(monkeypatch, where):
    # Compared a chunk at a time (the judge holds no float64 copy of a whole output): a value
    # outside the tolerance is seen wherever it lies, and near-zero outputs as zero likewise.
    from kernelrl.tasks import degeneracy

    monkeypatch.setattr(degeneracy, "_CHUNK", 16)
    n = 16 * 3 + 5
    same = [torch.full((n,), 3.0) for _ in range(4)]
    assert outputs_degenerate(_sets(*same))
    odd = [t.clone() for t in same]
    odd[2][1 if where == "first chunk" else n - 1] = 3.1
    assert outputs_degenerate(_sets(*odd)) == []
    nan = [t.clone() for t in same]
    nan[1][1 if where == "first chunk" else n - 1] = float("nan")
    assert outputs_degenerate(_sets(*nan)) == []  # a non-finite output is no evidence either way
    tiny = [torch.full((n,), 1e-6) for _ in range(4)]
    assert any("all-zero" in r for r in outputs_degenerate(_sets(*tiny)))
    tiny[3][1 if where == "first chunk" else n - 1] = 1.0
    assert not any("all-zero" in r for r in outputs_degenerate(_sets(*tiny)))
