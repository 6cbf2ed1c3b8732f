"""Built-in task suites, written for kernelrl (no file is copied from elsewhere).

Layout: `builtin/level1` single operators, `builtin/level2` fused chains, `builtin/level3`
blocks, `builtin/operators` operators taken from papers (counted as level 2). Every file is a
KernelBench-format task whose module constants are its `full` size; `small` comes from
`kernelrl.tasks.sizes.shrink_constants` unless `SMALL_PRESETS` below names explicit constants.

Suites: `builtin` (all), `level1`, `level2`, `level3`, `operators`, and `small`: a quick, varied
subset that the README's main job optimises on a CPU in minutes.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache
from pathlib import Path

from kernelrl.tasks.task import Task, TaskError, load_task_dir, load_task_file

BUILTIN_ROOT = Path(__file__).parent / "builtin"
_FOLDER_LEVEL = {"level1": 1, "level2": 2, "level3": 3, "operators": 2}

# Task names in the quick suite (the README's main job); each is `<folder>/<stem>`.
# Chosen so that each small reference takes roughly 2-50 ms on two CPU cores (long enough to time,
# short enough that an optimisation run over all of them finishes in minutes) and so that the set
# spans the rewrites worth trying: elementwise chains and norms (fusion, torch.compile), a conv
# with batch norm (weight folding, channels_last) and a GEMM epilogue.
SMALL_SUITE: tuple[str, ...] = (
    "level1/softmax",
    "level1/rmsnorm",
    "level1/scaled_residual_add",
    "level2/linear_bias_gelu_scale",
    "level2/conv2d_batchnorm_relu",
    "level2/layernorm_residual",
    "operators/l1_norm_layer",
    "operators/shift_group_quant",
)

# Explicit small-size constants, where the automatic shrink is not the right choice: it halves
# the largest constant first, which for these tasks would shrink a structural size (cache length,
# block size, head_dim, sparsity) into a shape no real workload has, or leave a cubic-cost task
# slow on a CPU.
SMALL_PRESETS: dict[str, dict[str, int]] = {
    # The quick suite's tasks: larger than the automatic 1M-element shrink, so that each small
    # reference takes milliseconds (measured 2-50 ms on two idle cores) and timing noise is small
    # next to the work; still well under a second.
    "level1/softmax": {"rows": 8192, "cols": 1024},
    "level1/rmsnorm": {"tokens": 4096, "hidden": 1024},
    "level1/scaled_residual_add": {"tokens": 4096, "hidden": 1024},
    "level2/linear_bias_gelu_scale": {"batch_size": 1024, "in_features": 1024, "out_features": 1024},
    "level2/conv2d_batchnorm_relu": {"batch_size": 16, "in_channels": 32, "out_channels": 32, "height": 56,
                                     "width": 56},
    "level2/layernorm_residual": {"batch_size": 8, "seq_len": 512, "hidden": 1024},
    "operators/l1_norm_layer": {"batch_size": 32, "channels": 64, "height": 56, "width": 56},
    "operators/shift_group_quant": {"rows": 4096, "cols": 1024},
    "level1/sum_dim": {"batch_size": 16, "reduce_len": 256, "inner": 256},
    # blocks keep a realistic head_dim (64) and ffn = 4 * hidden instead of halving them away
    "level3/attention_block": {"batch_size": 2, "seq_len": 256, "hidden": 256, "num_heads": 4},
    "level3/mlp_block": {"batch_size": 2, "seq_len": 128, "hidden": 256, "ffn": 1024},
    "level3/transformer_encoder_layer": {"batch_size": 2, "seq_len": 128, "hidden": 256, "num_heads": 4,
                                         "ffn": 1024},
    "operators/kv_vq_anchor_attention": {"batch_size": 2, "num_heads": 8, "cache_len": 1024, "head_dim": 64,
                                         "codebook_size": 256},
    "operators/block_sparse_decode": {"batch_size": 2, "num_heads": 8, "cache_len": 2048, "head_dim": 64,
                                      "block_size": 64, "top_k": 8},
    "operators/heat3d_stencil": {"batch_size": 2, "size_x": 32, "size_y": 64, "size_z": 64},
    "operators/sparse_delta_linear": {"batch_size": 512, "in_features": 512, "out_features": 512, "nnz": 2621},
}


def suite_names() -> list[str]:
    return ["builtin", *_FOLDER_LEVEL, "small"]


@cache
def _builtin() -> tuple[Task, ...]:
    tasks = []
    for folder, level in _FOLDER_LEVEL.items():
        for path in sorted((BUILTIN_ROOT / folder).glob("*.py")):
            if path.name.startswith("_"):
                continue
            name = f"{folder}/{path.stem}"
            presets = {"small": SMALL_PRESETS[name]} if name in SMALL_PRESETS else {}
            tasks.append(load_task_file(path, name=name, level=level, suite="builtin", presets=presets))
    return tuple(tasks)


def load_suite(name: str) -> list[Task]:
    tasks = list(_builtin())
    if name == "builtin":
        return tasks
    if name == "small":
        by_name = {t.name: t for t in tasks}
        return [by_name[n] for n in SMALL_SUITE]
    if name in _FOLDER_LEVEL:
        return [t for t in tasks if t.name.startswith(name + "/")]
    import difflib

    close = difflib.get_close_matches(name, list(suite_names()), n=1, cutoff=0.75)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise TaskError(f"unknown suite {name!r}{hint} (known: {', '.join(suite_names())})")


def builtin_task(name: str) -> Task:
    """A built-in task by `<folder>/<stem>` or by its bare stem when that is unambiguous."""
    tasks = _builtin()
    exact = [t for t in tasks if t.name == name]
    if exact:
        return exact[0]
    by_stem = [t for t in tasks if t.name.split("/", 1)[1] == name]
    if len(by_stem) == 1:
        return by_stem[0]
    if len(by_stem) > 1:
        raise TaskError(f"task name {name!r} is ambiguous: {', '.join(t.name for t in by_stem)}")
    import difflib

    names = [t.name for t in tasks] + [t.name.split("/", 1)[1] for t in tasks] + list(suite_names())
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.75)
    hint = f"; did you mean {' or '.join(repr(c) for c in dict.fromkeys(close))}?" if close else ""
    raise TaskError(f"unknown task {name!r}: not a built-in task name, a .py file or a folder{hint} "
                    "(see `kernelrl tasks`)")


def load_tasks(specs: str | Iterable[str]) -> list[Task]:
    """Resolve suite names, built-in task names, files and folders into tasks (order kept).

    `specs` may be a comma-separated string. Raises TaskError naming the first bad spec.
    """
    if isinstance(specs, str):
        specs = [s for s in specs.split(",") if s.strip()]
    out: list[Task] = []
    seen: set[str] = set()
    for spec in specs:
        spec = spec.strip()
        path = Path(spec)
        if spec in suite_names():
            found = load_suite(spec)
        elif path.is_dir():
            found = load_task_dir(path)
            if not found:
                raise TaskError(f"folder {spec} holds no KernelBench-format task files")
        elif path.suffix == ".py" or path.is_file():
            found = [load_task_file(path)]
        else:
            found = [builtin_task(spec)]
        for t in found:
            if t.name not in seen:
                seen.add(t.name)
                out.append(t)
    return out


def load_task(spec: str) -> Task:
    """One task from a built-in name or a file path."""
    path = Path(spec)
    if path.suffix == ".py" or path.is_file():
        return load_task_file(path)
    return builtin_task(spec)
