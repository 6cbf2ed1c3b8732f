"""GPU languages judged on a CPU: Triton under its interpreter, CUDA device code through nvcc.

- Triton examples are correct under the interpreter, never timed (`Timing.INTERPRETED`, no
  speedup); the Triton red-team and control fixtures go through tests/checks/test_redteam.py
  like every other fixture.
- CUDA examples' device code compiles with this machine's nvcc for sm_90; a candidate with a
  deliberate device-code error gets `compile_error` with nvcc's first error in its message.
  One nvcc run over torch's headers costs 40-60 s of a core here, so the fast suite compiles a
  broken kernel that includes only `cuda_runtime.h` (~1 s); the examples (torch's implicit
  headers, `ATen/cuda/CUDAContext.h` and the library headers of the `nvcc-check` extra) compile
  under `-m slow`.

CI installs Triton and the CUDA library headers (`.ci/run`: the `triton` and `nvcc-check`
extras): there a missing toolchain is a failure; elsewhere these tests skip.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

from kernelrl.candidate import Candidate, Language
from kernelrl.examples import Example, list_examples
from kernelrl.judge.harness import toolchain
from kernelrl.result import EvalResult, Status, Timing
from kernelrl.tasks.suites import builtin_task

TRITON_EXAMPLES = [e for e in list_examples() if Candidate(source=e.source).language is Language.TRITON]
CUDA_EXAMPLES = [e for e in list_examples() if Candidate(source=e.source).language is Language.CUDA]
# Sizes at which the interpreter (every program instance in Python) takes seconds, not minutes.
INTERPRETER_SIZES = {"level1/rmsnorm": {"tokens": 64, "hidden": 256}}


def _require(what: str, present: bool) -> None:
    if present:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI installs {what} (.ci/run); it is missing")
    pytest.skip(f"needs {what}")


def _has_cuda_headers() -> bool:
    return any(os.path.isfile(os.path.join(d, "cusparse.h")) for d in toolchain.library_include_dirs())


def _judge(example: Example, config) -> EvalResult:
    from kernelrl.judge.evaluator import evaluate

    return evaluate(builtin_task(example.task), Candidate(source=example.source, origin=example.name), config)


def test_every_gpu_language_has_examples():
    assert TRITON_EXAMPLES and len(CUDA_EXAMPLES) >= 2


def test_interpreted_results_carry_no_speed():
    r = EvalResult(task="t", status=Status.CORRECT, timing=Timing.INTERPRETED)
    assert EvalResult.from_dict(r.to_dict()).timing is Timing.INTERPRETED
    assert EvalResult.from_dict({"task": "t", "status": "correct"}).timing is Timing.MEASURED  # older records
    with pytest.raises(ValueError, match="interpreted"):
        EvalResult(task="t", status=Status.CORRECT, timing=Timing.INTERPRETED, speedup=1.5)


@pytest.mark.parametrize("example", TRITON_EXAMPLES, ids=lambda e: e.name)
def test_triton_example_is_correct_under_the_interpreter_and_not_timed(example, quick_config):
    import dataclasses

    _require("Triton (pip install -e '.[triton]')", importlib.util.find_spec("triton") is not None)
    config = dataclasses.replace(quick_config, constants=INTERPRETER_SIZES.get(example.task, {}), roofline=False)
    r = _judge(example, config)
    assert r.status is Status.CORRECT, f"{r.status}: {r.message}\n{r.errors[:2]}"
    assert r.timing is Timing.INTERPRETED and "interpreter" in r.message
    assert r.speedup is None and r.cand_time is None
    assert r.max_abs_err is not None and r.max_abs_err < 1e-3


# The example whose compile the fast suite keeps (the others are `slow`).
SOFTMAX_EXAMPLE = "softmax/cuda_fused"
# A softmax candidate whose kernel misspells an identifier; it includes no torch header, so nvcc
# reaches the error in about a second instead of ~40 s over torch's headers.
BROKEN = r'''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CUDA = """
#include <cuda_runtime.h>
__global__ void scale_kernel(const float* x, float* y, int n) {
    const float inv = 0.5f;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * inv2;
}
"""

_ext = load_inline(name="kernelrl_broken_scale", cpp_sources=["void unused();"], cuda_sources=[_CUDA],
                   no_implicit_headers=True, verbose=False)


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)
'''


@pytest.fixture(scope="module")
def nvcc_results(request, tmp_path_factory) -> dict[str, EvalResult]:
    """The CUDA examples this run selected, and a broken softmax candidate, in one batch.

    A cold nvcc run over torch's headers takes 40-180 s on two shared cores: the batch checks two
    candidates at a time.
    """
    from kernelrl.judge.evaluator import EvalConfig, Evaluator

    _require("nvcc", toolchain.nvcc_path() is not None)
    _require("the CUDA library headers (pip install -e '.[nvcc-check]')", _has_cuda_headers())
    selected = {item.callspec.params["example"].name for item in request.session.items
                if item.module is request.module and hasattr(item, "callspec") and "example" in item.callspec.params}
    softmax = next(e for e in CUDA_EXAMPLES if e.name == SOFTMAX_EXAMPLE)
    items = [(e.name, e.task, e.source) for e in CUDA_EXAMPLES if e.name in selected] + [("broken", softmax.task, BROKEN)]
    config = EvalConfig(cache_dir=tmp_path_factory.mktemp("nvcc-cache"), roofline=False, timeout_s=120,
                        build_timeout_s=900, concurrency=2)
    with Evaluator(config) as ev:
        got = ev.evaluate_batch([(builtin_task(task), Candidate(source=src, origin=name)) for name, task, src in items])
    return {name: r for (name, _, _), r in zip(items, got)}


@pytest.mark.parametrize("example", [pytest.param(e, id=e.name, marks=pytest.mark.slow) for e in CUDA_EXAMPLES])
def test_cuda_example_device_code_compiles_with_nvcc(example, nvcc_results):
    r = nvcc_results[example.name]
    # Nothing CUDA loads with a CPU build of torch: the verdict stays a compile error, saying how far it got.
    assert r.status is Status.COMPILE_ERROR
    assert "device code compiles" in r.message, f"{r.message}\n{r.errors[:1]}"
    assert "sm_90" in r.message or os.environ.get("TORCH_CUDA_ARCH_LIST")


def test_device_code_error_is_a_compile_error_with_nvccs_first_error(nvcc_results):
    r = nvcc_results["broken"]
    assert r.status is Status.COMPILE_ERROR
    assert 'error: identifier "inv2" is undefined' in r.message, r.message
    assert "nvcc refused the device code" in r.errors[0] and "inv2;" in r.errors[0]  # the source line, with a caret
