"""Shipped example candidates for built-in tasks, each with the verdict the evaluator must give.

Layout: `examples/<task stem>/<what it is>.py`, one candidate per file defining `ModelNew` with
the same constructor and forward signature as the task's `Model`. The manifest below is the one
place that states, per file, the task it targets, the verdict it must get (a `Status` value:
"correct", "incorrect" or "compile_error") and the device it needs ("cpu" or "cuda"). Files are
named by what they are: `cpp_*` (C++ through torch's inline loader, CPU), `cuda_*` (CUDA through
the same loader), `triton_*`, `torch_*` and `channels_last` (PyTorch-level rewrites),
`incorrect_*` (a plausible bug), `build_error` (does not compile).

Guarantees: `list_examples()` returns every manifest entry with an existing file, in manifest
order; each entry's status and device are valid (checked at construction). The tests check that
every file is listed, parses and defines `ModelNew`, and (slow tests) that the evaluator gives
the declared verdict to the CPU examples. Does not guarantee the CUDA and Triton examples were
run here: this machine has no GPU, they are checked on one when available.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kernelrl.judge.harness.device import Device
from kernelrl.result import Status

EXAMPLES_ROOT = Path(__file__).parent
DEVICES = tuple(Device)

# (task name, file relative to EXAMPLES_ROOT, expected status, device)
MANIFEST: tuple[tuple[str, str, str, str], ...] = (
    ("level1/softmax", "softmax/cpp_fused.py", "correct", "cpu"),
    ("level1/softmax", "softmax/incorrect_wrong_axis.py", "incorrect", "cpu"),
    ("level1/softmax", "softmax/cuda_fused.py", "correct", "cuda"),
    ("level1/rmsnorm", "rmsnorm/cpp_fused.py", "correct", "cpu"),
    ("level1/rmsnorm", "rmsnorm/triton_fused.py", "correct", "cuda"),
    ("level2/linear_bias_gelu_scale", "linear_bias_gelu_scale/torch_rewrite.py", "correct", "cpu"),
    ("level2/linear_bias_gelu_scale", "linear_bias_gelu_scale/cpp_fused.py", "correct", "cpu"),
    ("level2/linear_bias_gelu_scale", "linear_bias_gelu_scale/incorrect_missing_scale.py", "incorrect", "cpu"),
    ("level2/linear_bias_gelu_scale", "linear_bias_gelu_scale/cuda_fused.py", "correct", "cuda"),
    ("level2/conv2d_batchnorm_relu", "conv2d_batchnorm_relu/torch_rewrite.py", "correct", "cpu"),
    ("level2/conv2d_batchnorm_relu", "conv2d_batchnorm_relu/channels_last.py", "correct", "cpu"),
    ("level2/layernorm_residual", "layernorm_residual/torch_compile.py", "correct", "cpu"),
    ("operators/shift_group_quant", "shift_group_quant/cpp_fused.py", "correct", "cpu"),
    ("operators/heat3d_stencil", "heat3d_stencil/cpp_fused.py", "correct", "cpu"),
    ("operators/heat3d_stencil", "heat3d_stencil/build_error.py", "compile_error", "cpu"),
    ("operators/heat3d_stencil", "heat3d_stencil/cuda_stencil.py", "correct", "cuda"),
    ("operators/l1_norm_layer", "l1_norm_layer/torch_rewrite.py", "correct", "cpu"),
)


@dataclass(frozen=True, kw_only=True)
class Example:
    """One shipped candidate and the verdict it must get."""

    task: str  # built-in task name, `<folder>/<stem>`
    path: Path
    expected: str  # a kernelrl.result.Status value
    device: str  # "cpu" or "cuda"

    def __post_init__(self) -> None:
        valid = {s.value for s in Status}
        if self.expected not in valid:
            raise ValueError(f"example {self.path}: expected status {self.expected!r} is not one of {sorted(valid)}")
        if self.device not in DEVICES:
            raise ValueError(f"example {self.path}: device {self.device!r} is not one of {DEVICES}")

    @property
    def name(self) -> str:
        return f"{self.path.parent.name}/{self.path.stem}"

    @property
    def status(self) -> Status:
        return Status(self.expected)

    @property
    def source(self) -> str:
        return self.path.read_text()


def list_examples(*, device: str | None = None) -> list[Example]:
    """Manifest entries (optionally only those for one device), in manifest order."""
    if device is not None and device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    out = []
    for task, rel, expected, dev in MANIFEST:
        path = EXAMPLES_ROOT / rel
        if not path.is_file():
            raise FileNotFoundError(f"example listed in the manifest is missing: {path}")
        if device is None or dev == device:
            out.append(Example(task=task, path=path, expected=expected, device=dev))
    return out
