"""Tasks: reference PyTorch programs in KernelBench format.

A task file defines `class Model(nn.Module)`, `get_inputs()` and `get_init_inputs()`, usually with
module-level integer constants (batch_size, dim, ...) that fix the problem size. This module loads
one file, a folder of them, a KernelBench checkout (`level1/` ... `level4/`, unchanged) or a
built-in suite, and instantiates a task at a *size preset* by overriding those constants in a
fresh module namespace, never by editing the file.

Guarantees:
- loading never executes a task's module code; only `instantiate` does, each time in a fresh,
  unregistered module object, so two instantiations never share state, with the hub libraries
  set offline (a task that fetches a model config fails at once instead of retrying);
- `full` is the file exactly as written; `small` shrinks the file's integer constants until the
  inputs and parameters fit a CPU budget (shapes are checked on the meta device, so nothing large
  is ever allocated while shrinking), unless the suite gives explicit small constants; constants
  are substituted in the syntax tree before the module runs, so values derived from them follow;
- names are stable: `<folder>/<file stem>` relative to the loaded root.

Does not guarantee that a shrunk task keeps every property of the original (a constant used as a
head count may change divisibility); the shrink only halves constants >= 16, which keeps
power-of-two structure. A task whose program cannot run on the meta device (it calls `.item()`,
say) keeps the file's sizes at `small`, with a warning. Sizes held in tuples or lists, and
parameters sized by literals inside the model, are not shrunk.
"""

from __future__ import annotations

import ast
import contextlib
import enum
import hashlib
import os
import re
import types
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class Size(enum.StrEnum):
    """Size presets: `full` is the file as written, `small` fits a CPU (see `shrink_constants`)."""

    SMALL = "small"
    FULL = "full"


# Small preset budget: elements over all inputs plus parameters. About 4 MiB of fp32 data per
# input set keeps a reference well under a second on two CPU cores for all but cubic-cost ops.
SMALL_ELEMENT_BUDGET = 1 << 20
# Only constants at least this large are halved: small ones are usually structural
# (kernel sizes, head counts, strides).
_SHRINK_MIN_CONSTANT = 16

_LEVEL_DIR = re.compile(r"^level(\d+)$")


class TaskError(ValueError):
    """A task cannot be loaded or instantiated; the message says why, for a person."""


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

    def constants(self) -> dict[str, int]:
        """Module-level integer constants, read from the syntax tree (no code runs)."""
        return module_int_constants(self.source)

    def instantiate(self, size: str = "small", overrides: dict[str, int] | None = None) -> TaskModule:
        """Execute the task's module with the constants of `size` (plus explicit overrides)."""
        if size not in set(Size):
            raise TaskError(f"unknown size {size!r}; expected one of {', '.join(Size)}")
        consts = resolve_constants(self, size)
        if overrides:
            unknown = set(overrides) - set(self.constants())
            if unknown:
                raise TaskError(f"task {self.name} has no integer constant(s) {sorted(unknown)}")
            consts.update(overrides)
        return exec_task_module(self, consts)


@dataclass(frozen=True, kw_only=True)
class TaskModule:
    """A task executed at one size: the three KernelBench entry points plus the constants used."""

    task: Task
    module: types.ModuleType
    constants: dict[str, int]

    @property
    def Model(self) -> type:  # noqa: N802 - KernelBench's name
        return self.module.Model

    def get_inputs(self) -> list[Any]:
        return list(self.module.get_inputs())

    def get_init_inputs(self) -> list[Any]:
        return list(self.module.get_init_inputs())


def module_int_constants(source: str) -> dict[str, int]:
    """Module-level integer constants, read from the syntax tree (no code runs).

    Reads `a = 3`, `a: int = 3`, `a = b = 3`, `a, b = 3, 4` and literal arithmetic (`2 * 1024`).
    """
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise TaskError(f"task source does not parse: {e}") from e
    out: dict[str, int] = {}
    for node in tree.body:
        out.update(_constant_assignments(node))
    return out


def _constant_assignments(node: ast.stmt) -> dict[str, int]:
    """Names bound to integer literals by one module-level statement."""
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
        value = _int_literal(node.value)
        return {} if value is None else {node.target.id: value}
    if not isinstance(node, ast.Assign):
        return {}
    if len(node.targets) == 1 and isinstance(node.targets[0], ast.Tuple) and isinstance(node.value, ast.Tuple):
        names, values = node.targets[0].elts, node.value.elts
        ints = [_int_literal(v) for v in values]
        if len(names) == len(values) and all(isinstance(n, ast.Name) for n in names) and None not in ints:
            return {n.id: v for n, v in zip(names, ints)}  # type: ignore[union-attr]
        return {}
    value = _int_literal(node.value)
    if value is None or not all(isinstance(t, ast.Name) for t in node.targets):
        return {}
    return {t.id: value for t in node.targets}  # type: ignore[union-attr]


def _int_literal(node: ast.AST) -> int | None:
    # Accept plain literals and simple arithmetic of literals (e.g. 2 * 1024, 1 << 20)
    try:
        value = ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Add, ast.Sub, ast.LShift, ast.Pow,
                                                                ast.FloorDiv)):
            left, right = _int_literal(node.left), _int_literal(node.right)
            if left is None or right is None:
                return None
            try:
                return int(eval(compile(ast.Expression(node), "<const>", "eval"), {"__builtins__": {}}))
            except Exception:  # noqa: BLE001 - any failure means "not a constant"
                return None
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def _with_constants(source: str, constants: dict[str, int]) -> ast.Module:
    """The task's syntax tree with its constant assignments set to `constants`.

    Substituting before the module runs (rather than rebinding after) keeps derived values
    right: `bias_shape = (out_channels, 1, 1)` follows a shrunk `out_channels`.
    """
    tree = ast.parse(source)
    body: list[ast.stmt] = []
    for node in tree.body:
        found = _constant_assignments(node)
        if found and any(name in constants for name in found):
            for name, value in found.items():
                assign = ast.Assign(targets=[ast.Name(name, ast.Store())], value=ast.Constant(constants.get(name, value)))
                body.append(ast.copy_location(assign, node))
        else:
            body.append(node)
    tree.body = body
    return ast.fix_missing_locations(tree)


@contextlib.contextmanager
def _offline() -> Iterator[None]:
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


def compile_task(source: str, constants: dict[str, int], filename: str) -> types.CodeType:
    """The task's code with its integer constants set: what every process that runs a task runs."""
    return compile(_with_constants(source, constants), filename, "exec")


def exec_task_module(task: Task, constants: dict[str, int]) -> TaskModule:
    """Run the task source, with its integer constants set, in a fresh module."""
    digest = hashlib.sha256(task.source.encode()).hexdigest()[:12]
    mod = types.ModuleType(f"kernelrl_task_{digest}")
    mod.__file__ = str(task.path) if task.path else f"<task {task.name}>"
    try:
        code = compile_task(task.source, constants, mod.__file__)
        with _offline():
            exec(code, mod.__dict__)  # noqa: S102 - tasks are trusted reference programs
    except Exception as e:  # noqa: BLE001
        raise TaskError(f"task {task.name} failed to execute: {type(e).__name__}: {e}") from e
    for name in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(mod, name):
            raise TaskError(f"task {task.name} defines no `{name}` (KernelBench format needs Model, "
                            "get_inputs and get_init_inputs)")
    return TaskModule(task=task, module=mod, constants=dict(constants))


def resolve_constants(task: Task, size: str) -> dict[str, int]:
    base = task.constants()
    if size == "full":
        return dict(base)
    if size in task.presets:
        merged = dict(base)
        merged.update(task.presets[size])
        return merged
    return shrink_constants(task, base)


def shrink_constants(task: Task, base: dict[str, int], budget: int = SMALL_ELEMENT_BUDGET) -> dict[str, int]:
    """Halve the largest constants (>= 16) until inputs + parameters fit `budget` elements.

    Sizes are read on the meta device, so a 16k x 16k task costs nothing to inspect. A constant
    whose halving breaks the program (a structural size) is frozen and the next one is tried.
    The fast pass builds the model and its inputs at each step and runs the forward pass once,
    at the end (a recurrent model's forward on meta can take seconds); only if that fails, or
    the outputs turn out to dominate, is the shrink redone with the forward pass (and the
    outputs) counted at every step.
    """
    if _meta_footprint(task, base, forward=True) is None:
        warnings.warn(f"{task.name}: shapes cannot be checked on the meta device; its small size keeps "
                      "the file's constants", stacklevel=2)
        return dict(base)
    fast = _shrink(task, base, budget, forward=False)
    checked = _meta_footprint(task, fast, forward=True)
    # The fast pass does not see outputs: a tall-skinny matmul has small inputs and a huge
    # output. Then, or when the shrunk program fails, shrink again with outputs counted.
    if checked is not None and checked <= 4 * budget:
        return fast
    return _shrink(task, base, budget, forward=True)


def _shrink(task: Task, base: dict[str, int], budget: int, *, forward: bool) -> dict[str, int]:
    consts = dict(base)
    size_now = _meta_footprint(task, consts, forward=forward)
    if size_now is None:
        return consts
    frozen: set[str] = set()
    for _ in range(256):
        if size_now <= budget:
            break
        candidates = [k for k, v in consts.items() if v >= _SHRINK_MIN_CONSTANT and k not in frozen]
        if not candidates:
            break
        biggest = max(candidates, key=lambda k: consts[k])
        trial = {**consts, biggest: consts[biggest] // 2}
        trial_size = _meta_footprint(task, trial, forward=forward)
        if trial_size is None:
            frozen.add(biggest)
            continue
        consts, size_now = trial, trial_size
    return consts


def _meta_footprint(task: Task, consts: dict[str, int], *, forward: bool = True) -> int | None:
    """Elements of inputs + parameters (+ outputs when `forward`), or None if the program fails
    on the meta device."""
    import torch

    try:
        tm = exec_task_module(task, consts)
        with torch.device("meta"):
            init = tm.get_init_inputs()
            model = tm.Model(*init)
            inputs = tm.get_inputs()
            out = model(*inputs) if forward else None
    except Exception:  # noqa: BLE001 - any failure means "cannot judge this size on meta"
        return None
    total = sum(p.numel() for p in model.parameters()) + sum(b.numel() for b in model.buffers())
    for x in leaves(inputs) + leaves(out):
        if isinstance(x, torch.Tensor):
            total += x.numel()
    return total


def leaves(x: Any) -> list[Any]:
    """The leaves of nested lists, tuples and dicts (inputs and outputs of a task)."""
    if isinstance(x, (list, tuple)):
        return [y for item in x for y in leaves(item)]
    if isinstance(x, dict):
        return [y for item in x.values() for y in leaves(item)]
    return [x]


# ---------------------------------------------------------------------------------------------
# Loading


def is_task_source(source: str) -> bool:
    """True when the source defines Model, get_inputs and get_init_inputs at module level."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return {"Model", "get_inputs", "get_init_inputs"} <= names


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


def natural_key(s: str) -> list[Any]:
    """Sort key that orders `level1/2_x` before `level1/10_x`."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


class _RenameModel(ast.NodeTransformer):
    def __init__(self, new: str) -> None:
        self.new = new

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.AST:  # noqa: N802 - ast API
        if node.name == "Model":
            node.name = self.new
        self.generic_visit(node)
        return node

    def visit_Name(self, node: ast.Name) -> ast.AST:  # noqa: N802 - ast API
        if node.id == "Model":
            node.id = self.new
        return node


def embed_reference(source: str, new_name: str = "_Reference") -> str:
    """The reference program with `Model` renamed and its input factories dropped (the evaluator
    takes inputs and init arguments from the task). Module constants stay: forward may read them."""
    tree = ast.parse(source)
    tree.body = [n for n in tree.body
                 if not (isinstance(n, ast.FunctionDef) and n.name in ("get_inputs", "get_init_inputs"))]
    tree = _RenameModel(new_name).visit(tree)
    return ast.unparse(ast.fix_missing_locations(tree))


def input_footprint(task: Task, size: str) -> int | None:
    """Elements of inputs + parameters + outputs at a size (meta device), or None."""
    return _meta_footprint(task, resolve_constants(task, size))


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

