"""Which trials get the build allowance on top of the run limit (`kernelrl.judge.trial.compiles`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelrl.candidate import Candidate
from kernelrl.judge.evaluator import EvalConfig
from kernelrl.judge.isolation.builds import build_dir, has_build
from kernelrl.judge.trial import Trial, compiles

PYTORCH = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n"
CPP = "from torch.utils.cpp_extension import load_inline\n" + PYTORCH
TRITON = "import triton\n\n\n@triton.jit\ndef _kernel(x_ptr):\n    pass\n\n\n" + PYTORCH  # a kernel, not only an import


def cached(folder: Path, source: str, device: str) -> bool:
    """What the judge sees for this program's build on this device."""
    return has_build(build_dir(folder, source, device))


def test_pytorch_candidate_does_not_compile(tmp_path: Path):
    assert not compiles(Trial(candidate=Candidate(source=PYTORCH)), build_cached=cached(tmp_path, PYTORCH, "cpu"))


def test_uncached_cpp_candidate_compiles(tmp_path: Path):
    assert compiles(Trial(candidate=Candidate(source=CPP)), build_cached=cached(tmp_path, CPP, "cpu"))


def test_cached_cpp_candidate_does_not_compile(tmp_path: Path):
    folder = build_dir(tmp_path, CPP, "cpu")
    folder.mkdir(parents=True)
    (folder / "ext.so").write_bytes(b"")
    assert not compiles(Trial(candidate=Candidate(source=CPP)), build_cached=cached(tmp_path, CPP, "cpu"))


def test_build_cached_for_another_device_still_compiles(tmp_path: Path):
    folder = build_dir(tmp_path, CPP, "cuda")
    folder.mkdir(parents=True)
    (folder / "ext.so").write_bytes(b"")
    assert compiles(Trial(candidate=Candidate(source=CPP)), build_cached=cached(tmp_path, CPP, "cpu"))


def test_triton_candidate_always_compiles():
    # Its JIT cache is the Triton runtime's: even with a build folder present it counts as cold.
    assert compiles(Trial(candidate=Candidate(source=TRITON)), build_cached=True)


def test_compiled_reference_compiles():
    assert compiles(Trial(candidate=Candidate(source=PYTORCH), compiled_reference=True), build_cached=True)


def test_negative_build_allowance_is_refused():
    with pytest.raises(ValueError, match="build_timeout_s"):
        EvalConfig(build_timeout_s=-1.0)
