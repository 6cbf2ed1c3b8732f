"""Task loading: files, folders, KernelBench checkouts, size presets, overrides and errors."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest
import torch

from kernelrl.tasks.suites import load_task, load_tasks
from kernelrl.tasks.task import Task, TaskError, describe_shapes, load_task_dir, load_task_file

TINY = textwrap.dedent('''
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self, scale):
            super().__init__()
            self.scale = scale

        def forward(self, x):
            return x * self.scale

    batch_size = {batch}
    dim = {dim}

    def get_inputs():
        return [torch.randn(batch_size, dim)]

    def get_init_inputs():
        return [2.0]
''')


def write_task(path: Path, batch: int = 4, dim: int = 8) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(TINY.format(batch=batch, dim=dim))
    return path


def test_load_file_names_and_levels(tmp_path):
    task = load_task_file(write_task(tmp_path / "relu_task.py"))
    assert task.name == "relu_task"
    assert task.level is None
    assert task.constants() == {"batch_size": 4, "dim": 8}
    in_level = load_task_file(write_task(tmp_path / "level2" / "7_scale.py"))
    assert in_level.level == 2
    assert load_task(str(tmp_path / "relu_task.py")).source == task.source


def test_load_folder_skips_helpers(tmp_path):
    write_task(tmp_path / "a.py")
    write_task(tmp_path / "sub" / "b.py")
    (tmp_path / "helpers.py").write_text("def f():\n    return 1\n")
    write_task(tmp_path / "_private.py")
    tasks = load_task_dir(tmp_path)
    assert [t.name for t in tasks] == ["a", "sub/b"]


def test_kernelbench_checkout_layout(tmp_path):
    kb = tmp_path / "KernelBench"
    write_task(kb / "KernelBench" / "level1" / "2_Second.py")
    write_task(kb / "KernelBench" / "level1" / "10_Tenth.py")
    write_task(kb / "KernelBench" / "level1" / "1_First.py")
    write_task(kb / "KernelBench" / "level2" / "3_Fused.py", batch=2)
    # level-4 style file importing a package that is not installed: loading reads source only
    (kb / "KernelBench" / "level4").mkdir()
    (kb / "KernelBench" / "level4" / "1_HF.py").write_text(
        "import not_installed_package_xyz\n" + TINY.format(batch=1, dim=4))
    (kb / "src").mkdir()
    (kb / "src" / "eval_tool.py").write_text("print('not a task')\n")
    tasks = load_tasks(str(kb))
    names = [t.name for t in tasks]
    assert names == ["level1/1_First", "level1/2_Second", "level1/10_Tenth", "level2/3_Fused", "level4/1_HF"]
    assert [t.level for t in tasks] == [1, 1, 1, 2, 4]
    assert tasks[3].instantiate("full").get_inputs()[0].shape == (2, 8)
    with pytest.raises(TaskError, match="failed to execute.*ModuleNotFoundError"):
        tasks[4].instantiate("small")


def test_loading_executes_no_code(tmp_path):
    marker = tmp_path / "ran"
    src = f"open({str(marker)!r}, 'w').close()\n" + TINY.format(batch=4, dim=8)
    path = tmp_path / "side_effect.py"
    path.write_text(src)
    task = load_task_file(path)
    load_tasks([str(tmp_path)])
    assert not marker.exists()
    task.instantiate("full")
    assert marker.exists()


def test_small_shrinks_huge_constant_without_allocating(tmp_path):
    # 2**22 x 2**20 floats = 16 TiB: allocating it would fail, so passing proves shapes came from meta.
    task = load_task_file(write_task(tmp_path / "huge.py", batch=1 << 22, dim=1 << 20))
    start = time.perf_counter()
    tm = task.instantiate("small")
    assert time.perf_counter() - start < 30
    assert tm.constants["batch_size"] * tm.constants["dim"] <= 1 << 20
    assert tm.constants["batch_size"] < 1 << 22 and tm.constants["dim"] < 1 << 20
    x = tm.get_inputs()[0]
    assert tuple(x.shape) == (tm.constants["batch_size"], tm.constants["dim"])
    assert describe_shapes(tm) == [f"float32[{tm.constants['batch_size']}, {tm.constants['dim']}]"]


def test_full_keeps_file_numbers_and_small_keeps_small_tasks(tmp_path):
    task = load_task_file(write_task(tmp_path / "t.py", batch=4096, dim=512))
    assert task.instantiate("full").constants == {"batch_size": 4096, "dim": 512}
    tiny = load_task_file(write_task(tmp_path / "tiny.py", batch=4, dim=8))
    assert tiny.instantiate("small").constants == {"batch_size": 4, "dim": 8}


def test_presets_and_overrides(tmp_path):
    path = write_task(tmp_path / "t.py", batch=4096, dim=512)
    task = load_task_file(path, presets={"small": {"batch_size": 3}})
    assert task.instantiate("small").constants == {"batch_size": 3, "dim": 512}
    tm = task.instantiate("full", overrides={"dim": 5})
    assert tm.get_inputs()[0].shape == (4096, 5)
    with pytest.raises(TaskError, match="no integer constant.*'heads'"):
        task.instantiate("small", overrides={"heads": 2})
    with pytest.raises(TaskError, match="unknown size 'medium'"):
        task.instantiate("medium")


def test_instantiations_do_not_share_state(tmp_path):
    task = load_task_file(write_task(tmp_path / "t.py"))
    a, b = task.instantiate("full"), task.instantiate("full", overrides={"dim": 3})
    assert a.module is not b.module
    assert a.get_inputs()[0].shape == (4, 8) and b.get_inputs()[0].shape == (4, 3)
    model = a.Model(*a.get_init_inputs())
    x = torch.ones(2, 2)
    assert torch.equal(model(x), 2 * x)


def test_constant_expressions_are_read(tmp_path):
    path = tmp_path / "expr.py"
    path.write_text(TINY.format(batch="2 * 1024", dim="1 << 4") + "flag = True\nratio = 0.5\n")
    assert load_task_file(path).constants() == {"batch_size": 2048, "dim": 16}


@pytest.mark.parametrize("content, message", [
    ("import torch\nx = 1\n", "not a KernelBench-format task"),
    ("def broken(:\n", "not a KernelBench-format task"),
])
def test_bad_files_give_clear_errors(tmp_path, content, message):
    path = tmp_path / "bad.py"
    path.write_text(content)
    with pytest.raises(TaskError, match=message):
        load_task_file(path)


def test_missing_paths_and_names(tmp_path):
    with pytest.raises(TaskError, match="no such task file"):
        load_task_file(tmp_path / "absent.py")
    with pytest.raises(TaskError, match="no such task folder"):
        load_task_dir(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TaskError, match="holds no KernelBench-format task files"):
        load_tasks(str(tmp_path / "empty"))
    with pytest.raises(TaskError, match="unknown task 'no_such_task'"):
        load_tasks("no_such_task")


def test_module_that_raises_is_reported(tmp_path):
    path = tmp_path / "raises.py"
    path.write_text("raise RuntimeError('boom at import')\n" + TINY.format(batch=4, dim=8))
    task = load_task_file(path)
    with pytest.raises(TaskError, match="raises failed to execute: RuntimeError: boom at import"):
        task.instantiate("full")


def test_task_from_source_string():
    task = Task(name="inline", source=TINY.format(batch=2, dim=2))
    assert task.instantiate("full").get_inputs()[0].shape == (2, 2)
    assert len(task.source_hash) == 16


def test_load_tasks_mixes_specs(tmp_path):
    path = write_task(tmp_path / "mine.py")
    tasks = load_tasks(f"level1/gelu,{path},operators")
    names = [t.name for t in tasks]
    assert names[0] == "level1/gelu" and names[1] == "mine"
    assert all(n.startswith("operators/") for n in names[2:]) and len(names) >= 7


def test_derived_constants_follow_the_size(tmp_path):
    """`bias_shape = (out_features, 1)` must follow a shrunk `out_features`."""
    src = (
        "import torch\nimport torch.nn as nn\n\n"
        "class Model(nn.Module):\n"
        "    def __init__(self, bias_shape):\n"
        "        super().__init__()\n"
        "        self.bias = nn.Parameter(torch.randn(bias_shape))\n"
        "    def forward(self, x):\n"
        "        return x + self.bias\n\n"
        "rows = cols = 4096\n"
        "depth, width = 2, 8192\n"
        "bias_shape = (rows, 1)\n\n"
        "def get_inputs():\n    return [torch.randn(rows, cols)]\n\n"
        "def get_init_inputs():\n    return [bias_shape]\n"
    )
    path = tmp_path / "derived.py"
    path.write_text(src)
    task = load_task_file(path)
    assert task.constants() == {"rows": 4096, "cols": 4096, "depth": 2, "width": 8192}
    tm = task.instantiate("small")
    assert tm.constants["rows"] < 4096
    assert tm.module.bias_shape == (tm.constants["rows"], 1)
    import torch

    model = tm.Model(*tm.get_init_inputs())
    assert model(*tm.get_inputs()).shape == (tm.constants["rows"], tm.constants["cols"])
    assert torch.Size(tm.get_inputs()[0].shape).numel() <= 1 << 20


def test_structural_constant_is_frozen_and_others_still_shrink(tmp_path):
    """A constant that cannot halve (a reshape needs it exactly) stays; the rest shrink."""
    src = (
        "import torch\nimport torch.nn as nn\n\n"
        "class Model(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.w = nn.Parameter(torch.randn(4096))\n"
        "    def forward(self, x):\n"
        "        return x * self.w\n\n"
        "fixed = 4096\nbatch = 8192\n\n"
        "def get_inputs():\n    return [torch.randn(batch, fixed)]\n\n"
        "def get_init_inputs():\n    return []\n"
    )
    path = tmp_path / "frozen.py"
    path.write_text(src)
    tm = load_task_file(path).instantiate("small")
    assert tm.constants["fixed"] == 4096 and tm.constants["batch"] < 8192


def test_output_dominated_task_shrinks_until_the_output_fits(tmp_path):
    """Tall-skinny matmul: inputs are small, the M x M output is not."""
    src = (
        "import torch\nimport torch.nn as nn\n\n"
        "class Model(nn.Module):\n"
        "    def forward(self, a, b):\n"
        "        return a @ b\n\n"
        "M = 32768\nN = 32\n\n"
        "def get_inputs():\n    return [torch.rand(M, N), torch.rand(N, M)]\n\n"
        "def get_init_inputs():\n    return []\n"
    )
    path = tmp_path / "tall.py"
    path.write_text(src)
    tm = load_task_file(path).instantiate("small")
    assert tm.constants["M"] ** 2 <= 4 * (1 << 20)
