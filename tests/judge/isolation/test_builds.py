"""Builds on a CPU: Triton configured for the device, the nvcc check's command, flags and errors.

The evaluator-level checks (examples and fixtures judged) are in test_gpu_languages_on_cpu.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kernelrl.judge.harness import toolchain
from kernelrl.judge.isolation import builds


def test_triton_is_interpreted_on_cpu_and_compiled_on_cuda(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    toolchain.configure_triton("cpu", "import torch\n")
    assert os.environ["TRITON_INTERPRET"] == "1"
    # The judge's own environment must not make a GPU run an interpreted one.
    toolchain.configure_triton("cuda", "import triton\n")
    assert "TRITON_INTERPRET" not in os.environ


@pytest.mark.parametrize(("arch_list", "arch"), [("", "90"), ("8.0", "80"), ("9.0a;8.6", "90a"), ("8.6+PTX", "86"),
                                                 ("garbage", "90")])
def test_cuda_arch_follows_torch_cuda_arch_list(monkeypatch, arch_list, arch):
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", arch_list)
    assert toolchain.cuda_arch() == arch


def test_program_flags_keep_options_and_drop_target_and_mode():
    flags = ["-O3", "--use_fast_math", "-arch=sm_80", "-gencode arch=compute_80,code=sm_80", "-c", "-o", "x.o",
             "-Xptxas -v", "--maxrregcount=64"]
    assert toolchain._program_flags(flags) == ["-O3", "--use_fast_math", "-Xptxas", "-v", "--maxrregcount=64"]


def test_nvcc_command_targets_one_gpu_with_torch_flags(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    cmd = toolchain.nvcc_command("nvcc", tmp_path / "cuda.cu", tmp_path / "cuda.cubin", name="ext", arch="90",
                              extra_cuda_cflags=["-O3", "-std=c++17"], extra_include_paths=["inc"])
    assert cmd[:3] == ["nvcc", "-cubin", "-arch=sm_90"]
    assert "-DTORCH_EXTENSION_NAME=ext" in cmd and "-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE" in cmd
    assert "--expt-relaxed-constexpr" in cmd  # torch's own nvcc flags
    assert f"-I{os.path.abspath('inc')}" in cmd
    assert [w for w in cmd if w.startswith("-std=")] == ["-std=c++17"]  # the program's choice, not a second one


def test_first_errors_keep_nvcc_context_and_skip_warnings():
    output = "\n".join([
        "cuda.cu(10): warning #177-D: variable declared but never referenced",
        "cuda.cu(52): error: identifier \"inv2\" is undefined",
        "      y = inv2;",
        "          ^",
        "",
        "ptxas error   : Entry function uses too much shared data",
    ])
    errors = toolchain.first_errors(output)
    assert errors[0].splitlines() == ["cuda.cu(52): error: identifier \"inv2\" is undefined", "      y = inv2;",
                                      "          ^"]
    assert errors[1] == "ptxas error   : Entry function uses too much shared data"
    assert len(errors) == 2


def test_missing_toolkit_header_is_not_the_programs_error():
    refused, report = toolchain._outcome("cuda.cu:4:10: fatal error: cudnn.h: No such file or directory", 1, "nvcc x")
    assert not refused and "<cudnn.h>" in report and report.startswith("cannot check")
    refused, report = toolchain._outcome("cuda.cu(5): error: expected a \";\"", 2, "nvcc x")
    assert refused and "expected a" in report


def test_check_without_nvcc_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(toolchain, "nvcc_path", lambda: None)
    with pytest.raises(toolchain.CudaUnavailable, match="no nvcc"):
        toolchain.check_device_code("__global__ void k() {}", name="ext", work_dir=tmp_path)


def test_a_recorded_check_is_not_compiled_again(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(toolchain, "nvcc_path", lambda: "/bin/true")
    monkeypatch.setattr(toolchain, "nvcc_version", lambda nvcc: "release 0.0, V0.0")
    real_run = toolchain.subprocess.run

    def run(cmd, **kw):
        calls.append(cmd)
        return real_run(["/bin/true"], **kw)

    monkeypatch.setattr(toolchain.subprocess, "run", run)
    for _ in range(2):
        with pytest.raises(toolchain.CudaUnavailable, match="device code compiles"):
            toolchain.check_device_code("__global__ void k() {}", name="ext", work_dir=Path(tmp_path))
    assert len(calls) == 1
    with pytest.raises(toolchain.CudaUnavailable):  # another source: compiled
        toolchain.check_device_code("__global__ void k2() {}", name="ext", work_dir=Path(tmp_path))
    assert len(calls) == 2


def test_the_least_recently_used_sealed_builds_are_evicted_past_the_cap(tmp_path: Path):
    sealed = tmp_path / "sealed"
    for i, name in enumerate(["old", "mid", "new"]):
        (sealed / name / "ext").mkdir(parents=True)
        with open(sealed / name / "ext" / "ext.so", "wb") as f:
            f.truncate(100 << 20)  # sparse: counted by its apparent size
        os.utime(sealed / name, ns=(i * 10**9, i * 10**9))
    assert builds.evict(sealed, keep=sealed / "old", limit=150 << 20) == ["mid", "new"]
    assert sorted(p.name for p in sealed.iterdir()) == ["old"]
    assert builds.evict(sealed, limit=150 << 20) == []


def test_a_build_larger_than_the_cap_is_not_sealed(tmp_path: Path):
    """A sparse 'library' in a worker's build folder: read by its apparent size, refused past the cap."""
    from kernelrl.judge.harness.places import BUILD_SUBDIR
    from kernelrl.judge.isolation.containment import Scratch

    ext = tmp_path / BUILD_SUBDIR / "ext"
    ext.mkdir(parents=True)
    with open(ext / "ext.so", "wb") as f:
        f.truncate(builds.MAX_SEALED_BYTES + 1)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    scratch = Scratch(fd, dev=os.fstat(fd).st_dev, uid=os.geteuid())
    try:
        assert builds.seal(scratch, tmp_path / "cache" / "sealed" / "key") is False
    finally:
        scratch.close()
    assert not (tmp_path / "cache").exists()
