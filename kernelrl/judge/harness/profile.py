"""Task profiles: what the judge knows about a task at one size, measured where task code may run.

A `TaskProfile` is computed inside a reference worker (`profile_task`, on the meta device, so
nothing large is allocated) and sent to the judge as plain data; the search, the prompts and the
roofline use it instead of running task code themselves.

Guarantees: every field is plain data (JSON round trip through `to_dict` / `from_dict`);
`flops` counts what `torch.utils.flop_counter` knows (matmuls, convolutions, attention;
elementwise work counts 0), None when the forward cannot run on the meta device; the byte counts
are the minimum any program must move: every input read once, every output written once, every
parameter and buffer read once.

Does not guarantee the FLOP count is complete for custom or data-dependent operators: the
compute floor it gives is a lower bound, which is what a floor must be.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any


@dataclass(frozen=True, kw_only=True)
class TaskProfile:
    task: str
    size: str
    constants: dict[str, int]
    inputs: list[str]  # 'float32[16, 1024]' per input
    init_args: list[str]
    outputs: list[str]
    flops: int | None
    input_bytes: int
    output_bytes: int
    param_bytes: int
    dtype: str  # the dominant floating dtype of the inputs ('float32' when none)
    # what the heuristic rewrites need to know about the model
    conv2d: bool = False
    conv3d: bool = False
    training_dependent: bool = True  # behaves differently under .eval() (batch norm, dropout)
    tensor_inputs_only: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def min_bytes(self) -> int:
        return self.input_bytes + self.output_bytes + self.param_bytes

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TaskProfile:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def describe(values: object) -> list[str]:
    """Tensors as 'dtype[shape]', everything else as its repr."""
    import torch

    out = []
    for x in values if isinstance(values, (list, tuple)) else [values]:
        if isinstance(x, torch.Tensor):
            out.append(f"{str(x.dtype).removeprefix('torch.')}[{', '.join(map(str, x.shape))}]")
        else:
            out.append(repr(x) if isinstance(x, (int, float, str, bool, type(None))) else f"{type(x).__name__}")
    return out


def profile_task(module: ModuleType, *, task: str, size: str, constants: dict[str, int], init_inputs: Sequence[object],
                 source: str) -> TaskProfile:
    """Profile a task module (already run with its constants). Runs task code: workers only."""
    import torch
    from torch import nn

    from kernelrl.tasks.task import leaves

    notes: list[str] = []
    text_train = bool(re.search(r"dropout|batch_?norm|\.training\b|instance_?norm|rrelu", source, re.IGNORECASE))
    flops: int | None = None
    try:
        with torch.device("meta"):
            model = module.Model(*init_inputs)
            inputs = list(module.get_inputs())
            from torch.utils.flop_counter import FlopCounterMode

            counter = FlopCounterMode(display=False)
            with counter, torch.no_grad():
                out = model(*inputs)
            flops = int(counter.get_total_flops())
    except Exception as e:  # noqa: BLE001 - a task that cannot run on meta is described from its text
        notes.append(f"not profiled on the meta device: {type(e).__name__}: {str(e)[:200]}")
        return TaskProfile(task=task, size=size, constants=dict(constants), inputs=[], init_args=describe(init_inputs),
                           outputs=[], flops=None, input_bytes=0, output_bytes=0, param_bytes=0, dtype="float32",
                           conv2d=bool(re.search(r"conv(transpose)?2d", source, re.IGNORECASE)),
                           conv3d=bool(re.search(r"conv(transpose)?3d", source, re.IGNORECASE)),
                           training_dependent=True, tensor_inputs_only=False, notes=notes)

    def nbytes(xs: object) -> int:
        return sum(t.numel() * t.element_size() for t in leaves(xs) if isinstance(t, torch.Tensor))

    mods = list(model.modules()) if isinstance(model, nn.Module) else []
    train_types = (nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm,
                   nn.modules.dropout._DropoutNd, nn.RNNBase, nn.MultiheadAttention, nn.RReLU)
    params = nbytes(list(model.parameters()) + list(model.buffers())) if isinstance(model, nn.Module) else 0
    floats = [t for t in leaves(inputs) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    dtype = str(max(floats, key=lambda t: t.numel()).dtype).removeprefix("torch.") if floats else "float32"
    return TaskProfile(
        task=task, size=size, constants=dict(constants), inputs=describe(inputs), init_args=describe(init_inputs),
        outputs=describe(leaves(out)), flops=flops, input_bytes=nbytes(inputs), output_bytes=nbytes(out),
        param_bytes=params, dtype=dtype,
        conv2d=any(isinstance(m, nn.Conv2d | nn.ConvTranspose2d) for m in mods),
        conv3d=any(isinstance(m, nn.Conv3d | nn.ConvTranspose3d) for m in mods),
        training_dependent=text_train or any(isinstance(m, train_types) for m in mods),
        tensor_inputs_only=bool(inputs) and all(isinstance(x, torch.Tensor) for x in inputs),
        notes=notes,
    )
