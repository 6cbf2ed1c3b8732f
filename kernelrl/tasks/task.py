"""Tasks: reference PyTorch programs in KernelBench format.

A task file defines `class Model(nn.Module)`, `get_inputs()` and `get_init_inputs()`, usually with
module-level integer constants (batch_size, dim, ...) that fix the problem size. This module loads
one file, a folder of them or a KernelBench checkout (`level1/` ... `level4/`, unchanged), and
instantiates a task at a *size preset* by overriding those constants in a fresh module namespace,
never by editing the file (`kernelrl.tasks.sizes` chooses the constants of `small`,
`kernelrl.tasks.source` substitutes them in the syntax tree).

Guarantees:
- loading never executes a task's module code; only `instantiate` does, each time in a fresh,
  unregistered module object, so two instantiations never share state, with the hub libraries
  set offline (a task that fetches a model config fails at once instead of retrying);
- names are stable: `<folder>/<file stem>` relative to the loaded root.

Does not guarantee that a task's code is safe: it runs wherever `instantiate` is called. The
evaluator calls it only in sandboxed workers (see `kernelrl.judge.reference`).
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import json
import os
import re
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelrl.tasks.source import (
    TaskError,
    compile_task,
    is_task_source,
    module_int_constants,
    module_size_elements,
)

__all__ = ["Size", "Task", "TaskError", "TaskModule", "describe_shapes", "exec_task_module", "leaves",
           "load_task_dir", "load_task_file", "natural_key", "offline_hubs"]

class Size(enum.StrEnum):
    """Size presets: `full` is the file as written, `small` fits a CPU (see `shrink_constants`)."""

    SMALL = "small"
    FULL = "full"


_LEVEL_DIR = re.compile(r"^level(\d+)$")


@dataclass(frozen=True, kw_only=True)
class Task:
    """A reference program: its source and where it came from. Cheap to create and compare."""

    name: str
    source: str
    level: int | None = None
    path: Path | None = None
    suite: str = ""
    # Explicit constant overrides per size preset, e.g. {"small": {"batch_size": 4}}
    presets: dict[str, dict[str, int]] = field(default_factory=dict, compare=False)

    @property
    def source_hash(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()[:16]

    @property
    def identity_hash(self) -> str:
        """What makes two tasks the same task for a stored verdict: the source and the size presets
        (the shapes a preset runs at). The source's hash when there are no presets, so a task
        without them keeps the hash it was stored under."""
        if not self.presets:
            return self.source_hash
        presets = json.dumps(self.presets, sort_keys=True)
        return hashlib.sha256(f"{self.source}\0presets {presets}".encode()).hexdigest()[:16]

    def constants(self) -> dict[str, int]:
        """Size constants, read from the syntax tree (no code runs): module-level integer constants
        and, keyed `name[i]`, integer elements >= 16 of module-level tuple and list literals."""
        return {**module_int_constants(self.source), **module_size_elements(self.source)}


@dataclass(frozen=True, kw_only=True)
class TaskModule:
    """A task executed at one size: the three KernelBench entry points plus the constants used."""

    task: Task
    module: types.ModuleType
    constants: dict[str, int]

    @property
    def Model(self) -> type:  # noqa: N802 - KernelBench's name
        model: type = self.module.Model
        return model

    def get_inputs(self) -> list[Any]:
        return list(self.module.get_inputs())

    def get_init_inputs(self) -> list[Any]:
        return list(self.module.get_init_inputs())


@contextlib.contextmanager
def offline_hubs() -> Iterator[None]:
    """Tasks that build models from a hub config must fail fast here, not retry the network."""
    keys = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update({k: "1" for k in keys})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def exec_task_module(task: Task, constants: dict[str, int]) -> TaskModule:
    """Run the task source, with its integer constants set, in a fresh module."""
    digest = hashlib.sha256(task.source.encode()).hexdigest()[:12]
    mod = types.ModuleType(f"kernelrl_task_{digest}")
    mod.__file__ = str(task.path) if task.path else f"<task {task.name}>"
    try:
        code = compile_task(task.source, constants, mod.__file__)
        with offline_hubs():
            exec(code, mod.__dict__)  # noqa: S102 - tasks are trusted reference programs
    except Exception as e:  # noqa: BLE001
        raise TaskError(f"task {task.name} failed to execute: {type(e).__name__}: {e}") from e
    for name in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(mod, name):
            raise TaskError(f"task {task.name} defines no `{name}` (KernelBench format needs Model, "
                            "get_inputs and get_init_inputs)")
    return TaskModule(task=task, module=mod, constants=dict(constants))


def leaves(x: object) -> list[object]:
    """The leaves of nested lists, tuples and dicts (inputs and outputs of a task)."""
    if isinstance(x, (list, tuple)):
        return [y for item in x for y in leaves(item)]
    if isinstance(x, dict):
        return [y for item in x.values() for y in leaves(item)]
    return [x]


def load_task_file(path: Path, *, name: str | None = None, level: int | None = None, suite: str = "",
                   presets: dict[str, dict[str, int]] | None = None) -> Task:
    path = Path(path)
    if not path.is_file():
        raise TaskError(f"no such task file: {path}")
    source = path.read_text()
    if not is_task_source(source):
        raise TaskError(f"{path} is not a KernelBench-format task (needs Model, get_inputs, get_init_inputs)")
    if level is None:
        m = _LEVEL_DIR.match(path.parent.name)
        level = int(m.group(1)) if m else None
    return Task(name=name or path.stem, source=source, level=level, path=path, suite=suite,
                presets=presets or {})


def load_task_dir(root: Path, *, suite: str = "") -> list[Task]:
    """Every KernelBench-format .py file below `root`, named `<relative dir>/<stem>`.

    A KernelBench checkout works as it is: `KernelBench/level1/*.py` become `level1/<stem>`
    with level 1. Files that are not tasks (helpers, __init__) are skipped.
    """
    root = Path(root)
    if not root.is_dir():
        raise TaskError(f"no such task folder: {root}")
    # A KernelBench repository root holds the problems under KernelBench/levelN
    inner = root / "KernelBench"
    if inner.is_dir() and any(_LEVEL_DIR.match(p.name) for p in inner.iterdir() if p.is_dir()):
        root = inner
    tasks = []
    for path in sorted(root.rglob("*.py"), key=lambda p: natural_key(str(p.relative_to(root)))):
        if path.name.startswith("_") or any(part.startswith(".") for part in path.relative_to(root).parts):
            continue
        source = path.read_text(errors="replace")
        if not is_task_source(source):
            continue
        rel = path.relative_to(root).with_suffix("")
        level = None
        for part in rel.parts[:-1]:
            m = _LEVEL_DIR.match(part)
            if m:
                level = int(m.group(1))
        tasks.append(Task(name=rel.as_posix(), source=source, level=level, path=path, suite=suite or root.name))
    return tasks


def natural_key(s: str) -> tuple[int | str, ...]:
    """Sort key that orders `level1/2_x` before `level1/10_x`."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s))


def describe_shapes(tm: TaskModule) -> list[str]:
    """'float32[16, 1024]'-style descriptions of the inputs (meta device, nothing allocated)."""
    import torch

    with torch.device("meta"):
        inputs = tm.get_inputs()
    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            out.append(f"{str(x.dtype).removeprefix('torch.')}[{', '.join(map(str, x.shape))}]")
        else:
            out.append(f"{type(x).__name__}({x!r})")
    return out
