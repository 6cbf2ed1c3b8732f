"""The judge's copies of large sets kept in files (kernelrl.judge.spill), one property per test."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from kernelrl.judge.spill import MIN_TENSOR_BYTES, folder_in_memory, spill
from kernelrl.result import Status

pytestmark = pytest.mark.xdist_group("cpu_judge")  # the evaluator test judges (conftest.py)


def _mapped_from(folder: Path) -> list[str]:
    """Lines of this process's memory map naming a file of `folder`."""
    return [line for line in Path("/proc/self/maps").read_text().splitlines() if str(folder) in line]


def test_a_spilled_tree_keeps_its_structure_values_and_dtypes(tmp_path):
    big = MIN_TENSOR_BYTES  # elements: every dtype here is at least a byte
    tree = {"inputs": [torch.randn(big).reshape(64, -1).t(), torch.arange(big, dtype=torch.int64)],
            "output": (torch.randn(big).to(torch.bfloat16), torch.rand(big) > 0.5, torch.randn(8), 3, None, "x")}
    copy = {"inputs": [t.clone() for t in tree["inputs"]], "output": tuple(
        v.clone() if isinstance(v, torch.Tensor) else v for v in tree["output"])}
    got, written = spill(tree, tmp_path)
    assert written == sum(t.numel() * t.element_size() for t in (*tree["inputs"], *tree["output"][:2]))
    for a, b in zip([*got["inputs"], *got["output"][:3]], [*copy["inputs"], *copy["output"][:3]]):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    assert got["output"][2] is tree["output"][2]  # small: left in the heap
    assert got["output"][3:] == (3, None, "x") and isinstance(got["output"], tuple)


def test_a_spilled_tensor_is_a_mapping_of_a_file_and_nothing_stays_on_disk(tmp_path):
    (t,), _ = spill([torch.randn(MIN_TENSOR_BYTES)], tmp_path)
    assert list(tmp_path.iterdir()) == []  # unlinked once mapped
    lines = _mapped_from(tmp_path)
    assert lines and all(line.endswith("(deleted)") for line in lines)
    del t
    assert _mapped_from(tmp_path) == []  # the mapping ends with the tensor


def test_a_write_to_a_spilled_tensor_changes_only_that_tensor(tmp_path):
    src = torch.zeros(MIN_TENSOR_BYTES // 4)
    (a,), _ = spill([src], tmp_path)
    a.add_(1.0)  # copy-on-write: the judge may write its copy, nothing else sees it
    assert torch.equal(a, torch.ones_like(src)) and torch.equal(src, torch.zeros_like(src))


def test_folders_in_memory_are_told_from_folders_on_disk(tmp_path):
    mounts = {line.split()[1]: line.split()[2] for line in Path("/proc/self/mounts").read_text().splitlines()}
    if mounts.get("/dev/shm") != "tmpfs" or mounts.get("/") in (None, "tmpfs", "overlay"):
        pytest.skip("needs /dev/shm on tmpfs and / on a disk")
    assert folder_in_memory(Path("/dev/shm/kernelrl-sets"))
    assert not folder_in_memory(Path("/"))


WIDE_TASK = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.tanh(x) * 0.5


def get_inputs():
    return [torch.randn(512, 1024)]


def get_init_inputs():
    return []
'''


def test_a_judge_keeping_its_sets_in_files_gives_the_same_verdicts(shared_evaluator, tmp_path, quick_config):
    from kernelrl.tasks.task import load_task_file

    path = tmp_path / "wide_tanh.py"
    path.write_text(WIDE_TASK)
    task = load_task_file(path)
    right = WIDE_TASK.replace("class Model(", "class ModelNew(")
    wrong = right.replace("* 0.5", "* 0.51")
    in_files = dataclasses.replace(quick_config, spill_set_mib=0)
    assert quick_config.spill_set_mib is not None and quick_config.spill_set_mib > 4  # a set here is 4 MiB
    for config, files in ((in_files, True), (quick_config, False)):
        ev = shared_evaluator(config)
        ok, bad = ev.evaluate(task, right), ev.evaluate(task, wrong)
        assert ok.status is Status.CORRECT, ok.message
        assert bad.status is Status.INCORRECT, bad.message
        ref = ok.environment.reference
        assert ref is not None
        # every correctness set, and the timing pool's, in files; or none
        assert (ref.sets_in_files >= config.n_correctness) if files else ref.sets_in_files == 0
