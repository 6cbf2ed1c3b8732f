"""Task loading: files, folders, KernelBench checkouts, size presets, overrides and errors."""

from __future__ import annotations

import textwrap
import time
import warnings
from pathlib import Path

import pytest
import torch

from kernelrl.tasks.sizes import (
    SMALL_ELEMENT_BUDGET,
    SMALL_FLOP_BUDGET,
    SMALL_TENSOR_BUDGET,
    instantiate,
)
from kernelrl.tasks.source import compile_task
from kernelrl.tasks.suites import load_task, load_tasks
from kernelrl.tasks.task import (
    Task,
    TaskError,
    describe_shapes,
    load_task_dir,
    load_task_file,
)

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
    assert instantiate(tasks[3], "full").get_inputs()[0].shape == (2, 8)
    with pytest.raises(TaskError, match="failed to execute.*ModuleNotFoundError"):
        instantiate(tasks[4], "small")


def test_loading_executes_no_code(tmp_path):
    marker = tmp_path / "ran"
    src = f"open({str(marker)!r}, 'w').close()\n" + TINY.format(batch=4, dim=8)
    path = tmp_path / "side_effect.py"
    path.write_text(src)
    task = load_task_file(path)
    load_tasks([str(tmp_path)])
    assert not marker.exists()
    instantiate(task, "full")
    assert marker.exists()


def test_small_shrinks_huge_constant_without_allocating(tmp_path):
    # 2**22 x 2**20 floats = 16 TiB: allocating it would fail, so passing proves shapes came from meta.
    task = load_task_file(write_task(tmp_path / "huge.py", batch=1 << 22, dim=1 << 20))
    start = time.perf_counter()
    tm = instantiate(task, "small")
    assert time.perf_counter() - start < 30
    assert tm.constants["batch_size"] * tm.constants["dim"] <= 1 << 20
    assert tm.constants["batch_size"] < 1 << 22 and tm.constants["dim"] < 1 << 20
    x = tm.get_inputs()[0]
    assert tuple(x.shape) == (tm.constants["batch_size"], tm.constants["dim"])
    assert describe_shapes(tm) == [f"float32[{tm.constants['batch_size']}, {tm.constants['dim']}]"]


def test_full_keeps_file_numbers_and_small_keeps_small_tasks(tmp_path):
    task = load_task_file(write_task(tmp_path / "t.py", batch=4096, dim=512))
    assert instantiate(task, "full").constants == {"batch_size": 4096, "dim": 512}
    tiny = load_task_file(write_task(tmp_path / "tiny.py", batch=4, dim=8))
    assert instantiate(tiny, "small").constants == {"batch_size": 4, "dim": 8}


def test_presets_and_overrides(tmp_path):
    path = write_task(tmp_path / "t.py", batch=4096, dim=512)
    task = load_task_file(path, presets={"small": {"batch_size": 3}})
    assert instantiate(task, "small").constants == {"batch_size": 3, "dim": 512}
    tm = instantiate(task, "full", overrides={"dim": 5})
    assert tm.get_inputs()[0].shape == (4096, 5)
    with pytest.raises(TaskError, match="no integer constant.*'heads'"):
        instantiate(task, "small", overrides={"heads": 2})
    with pytest.raises(TaskError, match="unknown size 'medium'"):
        instantiate(task, "medium")


def test_instantiations_do_not_share_state(tmp_path):
    task = load_task_file(write_task(tmp_path / "t.py"))
    a, b = instantiate(task, "full"), instantiate(task, "full", overrides={"dim": 3})
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
        instantiate(task, "full")


def test_task_from_source_string():
    task = Task(name="inline", source=TINY.format(batch=2, dim=2))
    assert instantiate(task, "full").get_inputs()[0].shape == (2, 2)
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
    tm = instantiate(task, "small")
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
    tm = instantiate(load_task_file(path), "small")
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
    tm = instantiate(load_task_file(path), "small")
    assert tm.constants["M"] ** 2 <= 4 * (1 << 20)


# ---------------------------------------------------------------------------------------------
# Shrink rules beyond plain constants: tuple elements, equal knobs, data-only constants, FLOP and
# tensor budgets, layer literals, models whose __init__ reads values.


def _task(tmp_path: Path, name: str, src: str) -> Task:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(src))
    return load_task_file(path)


def _forward_cost(tm) -> tuple[int, torch.Tensor]:
    """FLOPs of one forward at the task's constants, and its output (run for real on the CPU)."""
    from torch.utils.flop_counter import FlopCounterMode

    model = tm.Model(*tm.get_init_inputs())
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        out = model(*tm.get_inputs())
    return counter.get_total_flops(), out


def test_tuple_elements_shrink_and_structural_tuples_stay(tmp_path):
    task = _task(tmp_path, "pool", '''
        import torch
        import torch.nn as nn
        import torch.nn.functional as F

        class Model(nn.Module):
            def __init__(self, kernel_size):
                super().__init__()
                self.kernel_size = kernel_size

            def forward(self, x):
                return F.avg_pool2d(x, self.kernel_size)

        batch_size = 2
        input_shape = (4096, 4096)
        kernel_size = (3, 5)

        def get_inputs():
            return [torch.rand(batch_size, 1, *input_shape)]

        def get_init_inputs():
            return [kernel_size]
    ''')
    assert task.constants() == {"batch_size": 2, "input_shape[0]": 4096, "input_shape[1]": 4096}
    tm = instantiate(task, "small")
    h, w = tm.constants["input_shape[0]"], tm.constants["input_shape[1]"]
    assert h < 4096 and w < 4096 and 2 * h * w <= SMALL_ELEMENT_BUDGET
    assert tm.module.input_shape == (h, w) and tm.module.kernel_size == (3, 5)
    assert tm.get_inputs()[0].shape == (tm.constants["batch_size"], 1, h, w)
    # an element is an override like any constant, and `full` is the file
    assert instantiate(task, "full", overrides={"input_shape[1]": 40}).module.input_shape == (4096, 40)
    assert instantiate(task, "full").module.input_shape == (4096, 4096)


def test_equal_constants_that_must_match_shrink_together(tmp_path):
    """(n, m) * (n,) broadcasts only while m == n: halving either alone breaks the program."""
    task = _task(tmp_path, "pairwise_scale", '''
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def forward(self, a, b):
                return torch.mean(torch.clamp(1 - a * b, min=0))

        n = 32768
        shape = (32768,)

        def get_inputs():
            return [torch.rand(n, *shape), torch.rand(n)]

        def get_init_inputs():
            return []
    ''')
    tm = instantiate(task, "small")
    n, m = tm.constants["n"], tm.constants["shape[0]"]
    assert n == m < 32768 and n * m <= SMALL_ELEMENT_BUDGET
    assert tm.Model()(*tm.get_inputs()).shape == ()


def test_a_huge_intermediate_is_counted(tmp_path):
    """Small inputs, a scalar output, and an n x n broadcast in between."""
    task = _task(tmp_path, "all_pairs", '''
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def forward(self, a, b):
                return (a[:, None] - b[None, :]).abs().mean()

        n = 1 << 16

        def get_inputs():
            return [torch.rand(n), torch.rand(n)]

        def get_init_inputs():
            return []
    ''')
    n = instantiate(task, "small").constants["n"]
    assert n * n <= SMALL_TENSOR_BUDGET and n >= 1024


def test_flop_budget_shrinks_a_forward_that_fits_the_element_budget(tmp_path):
    """Inputs + parameters fit the element budget; eight 3x3 convolutions at 128 x 96 do not fit
    the FLOP budget."""
    task = _task(tmp_path, "conv_loop", '''
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def __init__(self, channels):
                super().__init__()
                self.conv = nn.Conv2d(channels, channels, 3, padding=1)

            def forward(self, x):
                for _ in range(8):
                    x = self.conv(x)
                return x.mean()

        channels = 64
        height = 128
        width = 96

        def get_inputs():
            return [torch.rand(1, channels, height, width)]

        def get_init_inputs():
            return [channels]
    ''')
    full_flops, _ = _forward_cost(instantiate(task, "full"))
    assert full_flops > SMALL_FLOP_BUDGET
    tm = instantiate(task, "small")
    assert tm.constants != task.constants()
    flops, out = _forward_cost(tm)
    assert flops <= SMALL_FLOP_BUDGET and torch.isfinite(out)


FIXED_SPATIAL = """
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self, kernel_size, num_classes):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, kernel_size, padding=kernel_size // 2)
            self.fc = nn.Linear({features}, num_classes)

        def forward(self, x):
            return self.fc({flatten})

    batch_size = 8
    kernel_size = 3
    num_classes = 10

    def get_inputs():
        return [torch.rand(batch_size, 3, 256, 256)]

    def get_init_inputs():
        return [kernel_size, num_classes]
"""


def test_a_batch_below_16_shrinks_when_the_data_costs_and_model_constants_stay(tmp_path):
    """Spatial size fixed by a literal: only the batch can shrink, and only while halving it takes
    a real share off what is over budget. Constants below 16 that reach the model stay."""
    pooled = _task(tmp_path, "pooled", FIXED_SPATIAL.format(features=4, flatten="self.conv(x).mean((2, 3))"))
    tm = instantiate(pooled, "small")
    assert tm.constants == {"batch_size": 4, "kernel_size": 3, "num_classes": 10}  # 4 x 3 x 256 x 256 fits
    assert _forward_cost(tm)[1].shape == (4, 10)
    # 2.6M parameters and 1.6M input elements: a halved batch takes a fifth off, the parameters stay
    flat = _task(tmp_path, "flat", FIXED_SPATIAL.format(features="4 * 256 * 256",
                                                         flatten="torch.flatten(self.conv(x), 1)"))
    assert instantiate(flat, "small").constants == flat.constants()


def test_list_elements_that_size_nothing_stay(tmp_path):
    """`depths = (32,)` counts layers; halving it changes no shape, so the width shrinks instead."""
    task = _task(tmp_path, "deep", '''
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def __init__(self, width, depths):
                super().__init__()
                self.net = nn.Sequential(*[nn.Linear(width, width) for _ in range(depths[0])])

            def forward(self, x):
                return self.net(x)

        width = 256
        depths = (32,)

        def get_inputs():
            return [torch.rand(8, width)]

        def get_init_inputs():
            return [width, depths]
    ''')
    tm = instantiate(task, "small")
    assert tm.constants == {"width": 128, "depths[0]": 32}


LITERAL_MLP = '''
    import torch
    import torch.nn as nn

    class {name}(nn.Module):
        def __init__(self, num_classes):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                                     nn.Linear(4096, num_classes))

        def forward(self, x):
            return self.net(x.view(-1, 4096))

    batch_size = 4
    num_classes = 10

    def get_inputs():
        return [torch.rand(batch_size, 64, 64)]

    def get_init_inputs():
        return [num_classes]
'''


def test_layer_literals_shrink_only_past_the_hard_limits(tmp_path):
    """33.6M parameters sized by literals: past 32x the element budget, so the literal 4096 halves
    and every 4096 in the code follows (64 x 64 is not a layer literal and stays)."""
    task = _task(tmp_path, "literal_mlp", LITERAL_MLP.format(name="Model"))
    tm = instantiate(task, "small")
    width = tm.constants["literal:4096"]
    assert width < 4096 and set(tm.constants) == {"batch_size", "num_classes", "literal:4096"}
    model = tm.Model(*tm.get_init_inputs())
    params = sum(p.numel() for p in model.parameters())
    assert params <= 32 * SMALL_ELEMENT_BUDGET and model.net[0].in_features == width
    # The batch stays (parameters are what costs). The inputs keep their literal 64 x 64 = 4096
    # elements per row: x.view(-1, width) regroups them.
    assert tm.constants["batch_size"] == 4 and tm.get_inputs()[0].shape == (4, 64, 64)
    assert _forward_cost(tm)[1].shape == (4 * 4096 // width, 10)
    # A copy of the program (a candidate's) compiled with the same constants gets the same widths.
    ns: dict = {}
    exec(compile_task(textwrap.dedent(LITERAL_MLP.format(name="ModelNew")), tm.constants, "<cand>"), ns)  # noqa: S102
    assert ns["ModelNew"](10).net[0].weight.shape == model.net[0].weight.shape
    # a small model keeps its literals
    small = _task(tmp_path, "small_mlp", LITERAL_MLP.format(name="Model").replace("4096", "256")
                  .replace("64, 64", "16, 16"))
    assert instantiate(small, "small").constants == {"batch_size": 4, "num_classes": 10}


def test_init_that_reads_tensor_values_still_shrinks(tmp_path):
    """`x.item()` on a tensor built in __init__ cannot run on meta alone (Swin's drop-path rates)."""
    task = _task(tmp_path, "reads_values", '''
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def __init__(self, dim, depth):
                super().__init__()
                self.rates = [x.item() for x in torch.linspace(0, 0.1, depth)]
                self.layers = nn.ModuleList(nn.Linear(dim, dim) for _ in range(depth))

            def forward(self, x):
                for layer, rate in zip(self.layers, self.rates):
                    x = x + (1 - rate) * layer(x)
                return x

        tokens = 4096
        dim = 2048
        depth = 2

        def get_inputs():
            return [torch.rand(tokens, dim)]

        def get_init_inputs():
            return [dim, depth]
    ''')
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "cannot be checked on the meta device"
        tm = instantiate(task, "small")
    assert tm.constants["tokens"] < 4096 and tm.constants["dim"] < 2048 and tm.constants["depth"] == 2
    assert _forward_cost(tm)[1].shape == (tm.constants["tokens"], tm.constants["dim"])


def test_a_misspelt_task_or_suite_name_gets_a_did_you_mean():
    from kernelrl.tasks.suites import builtin_task, load_suite

    with pytest.raises(TaskError, match=r"did you mean 'level1/softmax'\?"):
        builtin_task("level1/sofmax")
    with pytest.raises(TaskError, match=r"did you mean 'softmax'\?"):
        builtin_task("sofmax")
    with pytest.raises(TaskError, match=r"did you mean 'small'\?"):
        load_suite("smal")
    with pytest.raises(TaskError) as far:
        builtin_task("zzzz_nothing_like_it")
    assert "did you mean" not in str(far.value)
