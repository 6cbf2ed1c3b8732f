"""Size presets: the constants a task runs with at `full` (the file as written) and `small`.

Guarantees:
- `small` shrinks the file's sizes (see `kernelrl.tasks.source`) until the task fits a CPU,
  unless the suite gives explicit small constants; literals inside the program shrink only when
  the module-level sizes cannot bring the forward's cost down;
- every shrink is checked on the meta device (nothing large is ever allocated while shrinking):
  the program must still run; at `small` one forward costs at most SMALL_FLOP_BUDGET FLOPs, no
  op writes more than SMALL_TENSOR_BUDGET elements, and inputs + parameters fit
  SMALL_ELEMENT_BUDGET (literals shrink only until 32 times that fits), as far as its sizes can
  shrink.

Does not guarantee that a shrunk task keeps every property of the original (a constant used as a
head count may change divisibility); constants below 16 and tuple elements below 16 (kernel
sizes, strides) never shrink, except a constant that sizes only the data (it leaves parameters
and init arguments unchanged: the batch), which may halve to 1. Nor that a task fits the budgets
when its sizes are structural (Swin's image size must stay a multiple of its windows), nor a time:
budgets are counts, chosen so that a reference runs in about a second or less on one core
(`benchmarks/kernelbench_small.py` measures this on KernelBench). A task whose program cannot
run on the meta device (it calls `.item()` in forward, say) keeps the file's sizes at `small`,
with a warning; an __init__ that reads values of small tensors it builds is run with those
tensors real.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kernelrl.tasks.source import (
    _ELEMENT_KEY,
    _LITERAL_KEY,
    _SHRINK_MIN_CONSTANT,
    _width_literals,
)
from kernelrl.tasks.task import Size, Task, TaskError, TaskModule, exec_task_module, leaves

if TYPE_CHECKING:
    from torch.overrides import TorchFunctionMode

# Small preset budgets. Constants shrink until all three hold (where they can):
# - elements over all inputs plus parameters (plus outputs, when the forward is counted): about
#   4 MiB of fp32 data per input set;
# - FLOPs of one forward, as torch.utils.flop_counter counts them (matmuls, convolutions,
#   attention): element counts miss what a forward costs (a VGG conv stack at 224 x 224, attention
#   over 16k positions). The 25 KernelBench references with the most counted FLOPs ran at 3-67
#   counted GFLOP/s per forward on one core of a two-core machine, so 4 GFLOP is 0.06-1.4 s;
# - the largest tensor any one op writes: a broadcast of two small inputs (`a * b[:, None]`) can
#   be huge while inputs and outputs are not.
SMALL_ELEMENT_BUDGET = 1 << 20


SMALL_FLOP_BUDGET = 4 * 10**9


SMALL_TENSOR_BUDGET = 16 << 20


# Literals inside the program (layer widths) are rewritten only while the FLOP or tensor budget,
# or this many times the element budget, is exceeded once every constant has shrunk.
_HARD_ELEMENT_FACTOR = 32


# Halving steps per shrink, at most (each one runs the task's module on the meta device).
_MAX_STEPS = 256


# Factory calls at most this large run for real when a model cannot be built on the meta device
# alone (its __init__ reads values: `[x.item() for x in torch.linspace(0, 0.1, depth)]`).
_REAL_FACTORY_LIMIT = 4096


def instantiate(task: Task, size: str = "small", overrides: dict[str, int] | None = None) -> TaskModule:
    """Execute a task's module with the constants of `size` (plus explicit overrides), in this process.

    Runs the task's code: the judge never calls this (a reference worker does); tests and tools do.
    """
    if size not in set(Size):
        raise TaskError(f"unknown size {size!r}; expected one of {', '.join(Size)}")
    consts = resolve_constants(task, size)
    if overrides:
        unknown = set(overrides) - set(task.constants())
        if unknown:
            raise TaskError(f"task {task.name} has no integer constant(s) {sorted(unknown)}")
        consts.update(overrides)
    return exec_task_module(task, consts)


def resolve_constants(task: Task, size: str) -> dict[str, int]:
    base = task.constants()
    if size == "full":
        return dict(base)
    if size in task.presets:
        merged = dict(base)
        merged.update(task.presets[size])
        return merged
    return shrink_constants(task, base)


@dataclass(frozen=True)
class _Probe:
    """What one meta-device run of a task at some constants showed."""

    elements: int  # inputs + parameters + buffers (+ outputs when the forward ran)
    flops: int = 0  # of one forward (0 when the forward did not run)
    largest: int = 0  # elements of the largest tensor one op of the forward wrote (views excluded)
    model: tuple[object, ...] = ()  # parameter and buffer shapes and init arguments: what the model is
    inputs: tuple[object, ...] = ()  # input shapes
    shapes: frozenset[tuple[int, ...]] = frozenset()  # the distinct shapes of inputs, parameters, buffers


@dataclass(frozen=True)
class _Budgets:
    elements: int
    flops: int
    tensor: int

    def over(self, p: _Probe) -> list[str]:
        """The measures of `p` over budget (its `_Probe` field names)."""
        limits = {"elements": self.elements, "flops": self.flops, "largest": self.tensor}
        return [k for k, limit in limits.items() if getattr(p, k) > limit]

    def over_hard(self, p: _Probe) -> list[str]:
        """The measures over the limits that justify rewriting literals (see _HARD_ELEMENT_FACTOR)."""
        limits = {"elements": _HARD_ELEMENT_FACTOR * self.elements, "flops": self.flops, "largest": self.tensor}
        return [k for k, limit in limits.items() if getattr(p, k) > limit]


def shrink_constants(task: Task, base: dict[str, int], budget: int = SMALL_ELEMENT_BUDGET, *,
                     flop_budget: int = SMALL_FLOP_BUDGET, tensor_budget: int = SMALL_TENSOR_BUDGET) -> dict[str, int]:
    """Halve the largest size constants until the task fits the small budgets.

    Budgets: `budget` elements of inputs + parameters, `flop_budget` FLOPs of one forward and no
    op writing more than `tensor_budget` elements (see SMALL_ELEMENT_BUDGET). Sizes are read on
    the meta device, so a 16k x 16k task costs nothing to inspect. Each step halves the largest
    knob still open, in this order, and keeps the halving only if the program still runs on meta
    and some measure over budget went down; otherwise the knob is frozen:
    1. constants >= 16: module-level integers and `name[i]` elements of module-level tuples and
       lists (`input_shape = (32768,)`; an element must change some input or parameter shape, so
       `layers = [3, 4, 23, 3]`, block counts, stays). When halving one breaks the program, the
       knobs of equal value are halved together (`batch_size` and `input_shape[0]` both sizing one
       broadcast);
    2. constants below 16 that size only the data (halving them leaves the parameters and init
       arguments as they are: the batch), down to 1, and only while each halving takes at least a
       quarter off a measure over budget;
    3. only while FLOPs, the largest tensor, or 32x the element budget is still exceeded:
       `literal:<v>` knobs, integer literals that size layers inside the program (VGG's
       `nn.Conv2d(64, 128, 3)`); every literal of that value in the code follows.
    The fast pass builds the model and its inputs at each step and runs the forward pass once,
    at the end (a recurrent model's forward on meta can take seconds); only if that fails, or
    the outputs dominate, or the forward is over the FLOP or tensor budget, is the shrink redone
    with the forward pass (and the outputs) counted at every step.
    """
    if _probe(task, base, forward=True, count=False) is None:
        warnings.warn(f"{task.name}: shapes cannot be checked on the meta device; its small size keeps "
                      "the file's constants", stacklevel=2)
        return dict(base)
    budgets = _Budgets(budget, flop_budget, tensor_budget)
    start = {**base, **{k: v for k, v in _width_literals(task.source).items() if k not in base}}
    fast = _shrink(task, start, budgets, forward=False)
    checked = _probe(task, fast, forward=True)
    # The fast pass does not see outputs: a tall-skinny matmul has small inputs and a huge
    # output. Then, or when the shrunk program fails, shrink again from the file's sizes with
    # outputs counted; when only the forward's cost is over, go on from the fast result.
    if checked is None or checked.elements > 4 * budget:
        consts = _shrink(task, start, budgets, forward=True)
    elif checked.flops > flop_budget or checked.largest > tensor_budget:
        consts = _shrink(task, fast, budgets, forward=True)
    else:
        consts = fast
    # literal knobs that stayed at their value are no change: leave them out
    return {k: v for k, v in consts.items() if k in base or not _LITERAL_KEY.match(k) or v != start[k]}


def _shrink(task: Task, base: dict[str, int], budgets: _Budgets, *, forward: bool) -> dict[str, int]:
    consts = dict(base)
    now = _probe(task, consts, forward=forward)
    if now is None:
        return consts
    frozen: set[str] = set()
    for _ in range(_MAX_STEPS):
        over = budgets.over(now)
        if not over:
            break
        tier, data_only = _open_knobs(consts, frozen, now, budgets)
        if not tier:
            break
        key = max(tier, key=lambda k: consts[k])
        trial = {**consts, key: consts[key] // 2}
        probe = _probe(task, trial, forward=forward)
        if probe is None:
            same = [k for k in tier if consts[k] == consts[key]]
            if len(same) > 1:
                trial = {**consts, **{k: consts[k] // 2 for k in same}}
                probe = _probe(task, trial, forward=forward)
        # Below 16 only a data size may halve, and only where the data is what costs: a batch
        # halving that takes 1% off a parameter-bound model is not worth a smaller problem.
        gain = 0.75 if data_only else 1.0
        if probe is None or not any(getattr(probe, m) < gain * getattr(now, m) for m in over):
            frozen.add(key)
            continue
        if data_only and (probe.model != now.model or probe.inputs == now.inputs):
            frozen.add(key)  # it reaches the model: structural after all
            continue
        if _ELEMENT_KEY.match(key) and probe.shapes == now.shapes:
            frozen.add(key)  # not a size: a count (ResNet's blocks per stage) that no shape holds
            continue
        consts, now = trial, probe
    return consts


def _open_knobs(consts: dict[str, int], frozen: set[str], now: _Probe, budgets: _Budgets) -> tuple[list[str], bool]:
    """The knobs the next halving chooses from, and whether they must size only the data (tier 2)."""
    open_ = [k for k in consts if k not in frozen]
    big = [k for k in open_ if consts[k] >= _SHRINK_MIN_CONSTANT and not _LITERAL_KEY.match(k)]
    if big:
        return big, False
    small = [k for k in open_ if 2 <= consts[k] < _SHRINK_MIN_CONSTANT and k.isidentifier()]
    if small:
        return small, True
    if budgets.over_hard(now):
        return [k for k in open_ if consts[k] >= _SHRINK_MIN_CONSTANT and _LITERAL_KEY.match(k)], False
    return [], False


def _probe(task: Task, consts: dict[str, int], *, forward: bool, count: bool = True) -> _Probe | None:
    """Run the task at `consts` on the meta device; None if the program fails there.

    With `forward`, the forward pass runs (under no_grad, as a reference runs) and, with `count`,
    its FLOPs and largest written tensor are counted.
    """
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    try:
        init, model, inputs = _build_on_meta(task, consts)
        out, flops, largest = None, 0, 0
        if forward:
            with torch.device("meta"), torch.no_grad():
                if count:
                    counter, writes = FlopCounterMode(display=False), _write_tracker()
                    with counter, writes:
                        out = model(*inputs)
                    flops, largest = counter.get_total_flops(), writes.largest
                else:
                    out = model(*inputs)
    except Exception:  # noqa: BLE001 - any failure means "cannot judge this size on meta"
        return None
    state = list(model.named_parameters()) + list(model.named_buffers())
    total = sum(t.numel() for _, t in state)
    for x in leaves(inputs) + leaves(out):
        if isinstance(x, torch.Tensor):
            total += x.numel()
    tensors = [t for _, t in state] + [x for x in leaves(inputs) if isinstance(x, torch.Tensor)]
    return _Probe(elements=total, flops=int(flops), largest=int(largest),
                  model=(tuple((n, tuple(t.shape)) for n, t in state), _describe(init)), inputs=_describe(inputs),
                  shapes=frozenset(tuple(t.shape) for t in tensors))


def _describe(values: object) -> tuple[object, ...]:
    """Shapes and dtypes of the tensors, reprs of everything else (to compare two runs)."""
    import torch

    return tuple((tuple(x.shape), str(x.dtype)) if isinstance(x, torch.Tensor) else repr(x) for x in leaves(values))


def _build_on_meta(task: Task, consts: dict[str, int]) -> tuple[list[Any], Any, list[Any]]:
    """(init arguments, model, inputs) of the task at `consts`, all on the meta device.

    A model whose __init__ reads values (`[x.item() for x in torch.linspace(0, 0.1, depth)]`)
    cannot be built on meta alone: it is built again with small factory results real (on the CPU,
    at most _REAL_FACTORY_LIMIT elements each; larger ones stay on meta), then moved to meta. What
    __init__ computes from real tensors runs for real: a fallback, tried only when meta fails.
    """
    import torch
    from torch.utils._pytree import tree_map

    tm = exec_task_module(task, consts)
    try:
        with torch.device("meta"):
            init = tm.get_init_inputs()
            return init, tm.Model(*init), tm.get_inputs()
    except Exception:  # noqa: BLE001, S110 - retried with small tensors real; a second failure propagates
        pass
    tm = exec_task_module(task, consts)  # fresh module state for the second try
    with _small_factories_real():
        init = tm.get_init_inputs()
        model = tm.Model(*init)
        inputs = tm.get_inputs()

    def to_meta(x: object) -> object:
        return x.to("meta") if isinstance(x, torch.Tensor) else x

    return tree_map(to_meta, init), model.to("meta"), tree_map(to_meta, inputs)


def _small_factories_real() -> TorchFunctionMode:
    """A torch function mode: factory calls (torch.zeros, torch.linspace, ...) with no device give
    real CPU tensors up to _REAL_FACTORY_LIMIT elements and meta tensors beyond."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._device import _device_constructors

    constructors = _device_constructors()

    class SmallFactoriesReal(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            kwargs = kwargs or {}
            if func in constructors and kwargs.get("device") is None:
                meta = func(*args, **{**kwargs, "device": "meta"})  # the size, for free
                if isinstance(meta, torch.Tensor) and meta.numel() > _REAL_FACTORY_LIMIT:
                    return meta
            return func(*args, **kwargs)

    return SmallFactoriesReal()


def _write_tracker() -> Any:
    """A dispatch mode that records, as `.largest`, the elements of the largest tensor any op
    writes; views and in-place results (aliases of tensors already counted) are skipped."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class LargestWrite(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch's class is untyped
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            if not any(r.alias_info is not None for r in func._schema.returns):
                for t in tree_leaves(out):
                    if isinstance(t, torch.Tensor):
                        self.largest = max(self.largest, t.numel())
            return out

    return LargestWrite()  # type: ignore[no-untyped-call]


def _meta_footprint(task: Task, consts: dict[str, int], *, forward: bool = True) -> int | None:
    """Elements of inputs + parameters (+ outputs when `forward`), or None if the program fails
    on the meta device."""
    probe = _probe(task, consts, forward=forward, count=False)
    return None if probe is None else probe.elements


def input_footprint(task: Task, size: str) -> int | None:
    """Elements of inputs + parameters + outputs at a size (meta device), or None."""
    return _meta_footprint(task, resolve_constants(task, size))
