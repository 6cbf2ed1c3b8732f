"""How a worker builds a program's kernels on each device (a worker imports this; the judge's
side of builds, their folders and sealing, is `kernelrl.judge.isolation.builds`).

In the worker, `SharedHeaders` makes torch's inline loader read the judge's precompiled
`torch/extension.h` for CPU builds, and `exclusive_build_dir` holds the program's build folder
while it loads, so parallel evaluations of one program never race.

On a CPU, in the worker:
- `configure_triton` runs Triton kernels under Triton's interpreter (`TRITON_INTERPRET=1`, set
  before the program is imported, since `triton.jit` reads it when a kernel is decorated): a
  launch copies each tensor argument's storage to the host (the same storage for CPU tensors),
  runs every program instance of the grid in Python on numpy views, and copies the storages
  back, so outputs are real and checkable while times are not the kernel's. On a GPU the
  variable is removed, so Triton always compiles there, whatever the judge's environment says.
- `CudaDeviceCodeCheck` stands in for torch's inline loader for CUDA sources (`load_inline`
  with `cuda_sources`, `load` with `.cu` files): torch's CPU build cannot build a CUDA extension,
  so the `.cu` file torch would write is compiled with the machine's nvcc for one recent GPU
  (`-cubin`, `sm_90` unless TORCH_CUDA_ARCH_LIST names another), with torch's own nvcc flags,
  torch's headers and the CUDA library headers installed beside it (the `nvcc-check` extra).
  Either way the load then fails, so the verdict is a compile error: with nvcc's first errors
  when the device code does not compile, saying that it compiles otherwise. Results are kept in
  the program's build folder, keyed by nvcc's version, the flags and the source.

What cannot be checked without a CUDA build of torch: linking and loading the extension (the
CPU wheel has no libc10_cuda or libtorch_cuda), hence running it, its correctness and its time;
the host compiler's pass over the `.cu` file (`-cubin` stops after the device side: host code
is parsed and type-checked by nvcc's front end, but not compiled by g++); the C++ sources
(`cpp_sources`, the bindings), which are not compiled at all; headers this CUDA toolkit lacks
(cuDNN, CUTLASS, NCCL...: reported as not checkable, not as the program's error).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import inspect
import json
import os
import re
import shlex
import shutil
import subprocess
import sysconfig
import time
from pathlib import Path
from typing import Any, NoReturn

from kernelrl.judge.harness.device import Device


class SharedHeaders:
    """Torch's inline loader in a worker, reading the judge's precompiled headers
    (`kernelrl.judge.isolation.headers`).

    The judge's folder goes first on the C++ include path (`CPATH`, read by every compiler a build
    starts), where GCC finds `torch/extension.h.gch/` and uses a header there only when its own
    check finds it valid for the build. Torch's own precompiled header is kept out: `use_pch` is
    turned off (torch would make one in its own folder, read-only under full containment and
    shared by every process otherwise), and torch's removal of the one in its folder, which it
    does for every build without, does nothing (a worker never deletes files of the install).
    """

    def __init__(self, folder: str | None):
        self.folder = folder

    def install(self) -> None:
        from torch.utils import cpp_extension

        if self.folder:
            before = os.environ.get("CPATH")
            os.environ["CPATH"] = self.folder + (os.pathsep + before if before else "")
        original: Any = cpp_extension.load_inline

        def load_inline(*args: Any, **kwargs: Any) -> Any:
            kwargs["use_pch"] = False
            return original(*args, **kwargs)

        load_inline.__wrapped__ = original  # type: ignore[attr-defined]
        cpp_extension.load_inline = load_inline
        if hasattr(cpp_extension, "remove_extension_h_precompiler_headers"):
            cpp_extension.remove_extension_h_precompiler_headers = lambda: None


class exclusive_build_dir:
    """Hold an exclusive lock on this program's build folder while it loads.

    Torch's loader guards a build with a `lock` file that stays behind when a build is killed
    (a timeout), making every later build of the same source wait forever. The kernel drops
    our lock when its holder dies, so while we hold it any torch `lock` file is stale.
    """

    def __enter__(self) -> None:
        root = os.environ.get("TORCH_EXTENSIONS_DIR")
        self.f = None
        if not root:
            return
        os.makedirs(root, exist_ok=True)
        self.f = open(root.rstrip("/") + ".lock", "w")  # noqa: SIM115
        fcntl.flock(self.f, fcntl.LOCK_EX)
        for stale in Path(root).glob("*/lock"):
            try:
                stale.unlink()
            except OSError:
                pass

    def __exit__(self, *exc: object) -> None:
        if self.f is not None:
            fcntl.flock(self.f, fcntl.LOCK_UN)
            self.f.close()


# -- Triton ------------------------------------------------------------------------------------


def configure_triton(device: Device, source: str) -> None:
    """Triton in this worker: interpreted on a CPU, compiled on a GPU (see the module docstring).

    Runs before the program is imported. Under the interpreter, `triton.autotune` with several
    configs would benchmark each on a GPU driver a CPU lacks; every config is given the same
    time instead, so the first is used (times mean nothing here). Triton is imported for that
    only when the program's text mentions it.
    """
    if device != "cpu":
        os.environ.pop("TRITON_INTERPRET", None)
        return
    os.environ["TRITON_INTERPRET"] = "1"
    if "triton" not in source:
        return
    try:
        from triton.runtime import autotuner
    except ImportError:
        return  # no Triton here: the program's own import fails and says so
    if hasattr(autotuner.Autotuner, "do_bench"):

        def same_time(kernel_call: Any, quantiles: Any = None) -> Any:
            return [1.0] * len(quantiles) if quantiles else 1.0

        autotuner.Autotuner.do_bench = property(lambda self: same_time)


# -- CUDA device code on a machine without CUDA ----------------------------------------------------


class CudaDeviceCodeError(RuntimeError):
    """nvcc refused the program's device code; the message holds its first errors."""


class CudaUnavailable(RuntimeError):
    """Nothing CUDA can be built into a loadable extension here; the message says how far the check went."""


# The GPU the device code is compiled for when TORCH_CUDA_ARCH_LIST does not say: the H100's.
DEFAULT_CUDA_ARCH = "90"
# Flags of the program's that choose the target or the output: the check sets its own.
_TARGET_FLAGS = ("-arch", "--gpu-architecture", "-gencode", "--generate-code", "-code", "--gpu-code", "-o",
                 "--output-file", "-ccbin", "--compiler-bindir")
_MODE_FLAGS = ("-c", "--compile", "-shared", "--shared", "-dc", "--device-c", "-cubin", "-ptx", "-fatbin")
_MISSING_HEADER = re.compile(r"fatal error: ([^:\s]+): No such file or directory|cannot open source file \"([^\"]+)\"")
_ERROR_LINE = re.compile(r"\berror\b|\bfatal\b", re.IGNORECASE)
_EDG_ERROR = re.compile(r"\(\d+\): (error|catastrophic error)")


def nvcc_path() -> str | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and os.access(os.path.join(home, "bin", "nvcc"), os.X_OK):
        return os.path.join(home, "bin", "nvcc")
    return shutil.which("nvcc")


@functools.cache
def nvcc_version(nvcc: str) -> str:
    """nvcc's release line (`Cuda compilation tools, release 13.0, V13.0.88`)."""
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    lines = [line for line in out.splitlines() if "release" in line]
    return lines[0].strip() if lines else out.strip().splitlines()[-1] if out.strip() else "unknown"


def cuda_arch() -> str:
    """The first architecture of TORCH_CUDA_ARCH_LIST as nvcc spells it (`9.0a` -> `90a`), else sm_90's."""
    for entry in re.split(r"[;\s]+", os.environ.get("TORCH_CUDA_ARCH_LIST", "")):
        m = re.fullmatch(r"(\d+)\.(\d+)([a-z]?)(\+PTX)?", entry.strip())
        if m:
            return f"{m.group(1)}{m.group(2)}{m.group(3)}"
    return DEFAULT_CUDA_ARCH


def library_include_dirs() -> list[str]:
    """Include folders of NVIDIA's library wheels (cuBLAS, cuSPARSE, cuSOLVER, cuRAND...).

    torch's `ATen/cuda/CUDAContext.h` includes cuBLAS, cuSPARSE and cuSOLVER headers, which an
    nvcc-only toolkit lacks; the `nvcc-check` extra installs them under `nvidia/`.
    """
    try:
        import nvidia
    except ImportError:
        return []
    found = []
    for root in getattr(nvidia, "__path__", []):
        found += sorted(str(p) for p in Path(root).glob("*/include") if p.is_dir())
    return found


def _program_flags(flags: list[str]) -> list[str]:
    """The program's nvcc flags, as torch's ninja file would split them, less target and mode flags."""
    words = [w for flag in flags for w in shlex.split(str(flag))]
    kept: list[str] = []
    skip = False
    for w in words:
        if skip:
            skip = False
            continue
        if w in _MODE_FLAGS:
            continue
        if w in _TARGET_FLAGS:
            skip = True  # its value follows
            continue
        if any(w.startswith(f + "=") for f in _TARGET_FLAGS):
            continue
        kept.append(w)
    return kept


def nvcc_command(nvcc: str, source: Path, out: Path, *, name: str, arch: str, extra_cuda_cflags: list[str],
                 extra_include_paths: list[str]) -> list[str]:
    """The device side of the command torch's loader would run for `source`, for one GPU.

    `-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE`: the CPU wheel lacks `c10/cuda/impl/cuda_cmake_macros.h`,
    which a CUDA build generates; on Linux its one macro only matters for Windows DLL exports.
    """
    from torch.utils import cpp_extension

    system = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"], *library_include_dirs()]
    program = _program_flags(extra_cuda_cflags)
    cmd = [nvcc, "-cubin", f"-arch=sm_{arch}", "-o", str(out), str(source),
           f"-DTORCH_EXTENSION_NAME={name}", "-DTORCH_API_INCLUDE_EXTENSION_H", "-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE",
           *[f"-I{os.path.abspath(p)}" for p in extra_include_paths],
           *[w for p in system for w in ("-isystem", p)],
           *cpp_extension.COMMON_NVCC_FLAGS, *program]
    if not any(w.startswith("-std=") for w in program):
        cmd.append("-std=c++20")
    return cmd


def first_errors(output: str, *, limit: int = 5) -> list[str]:
    """The compiler's first error lines, each with the source line and caret nvcc prints after it."""
    lines = output.splitlines()
    found = []
    for i, line in enumerate(lines):
        if _ERROR_LINE.search(line) and "warning" not in line.lower():
            context = 2 if _EDG_ERROR.search(line) else 0
            found.append("\n".join(lines[i:i + 1 + context]).rstrip())
            if len(found) >= limit:
                break
    return found


def check_device_code(cu_text: str, *, name: str, extra_cuda_cflags: list[str] | None = None,
                      extra_include_paths: list[str] | None = None, work_dir: Path) -> NoReturn:
    """Compile one `.cu` file's device code with nvcc; always raises (nothing CUDA loads here).

    CudaDeviceCodeError: nvcc refused it (its first errors in the message). CudaUnavailable: it
    compiles, or it could not be checked (no nvcc, a header this toolkit lacks); the message says which.
    """
    nvcc = nvcc_path()
    if nvcc is None:
        raise CudaUnavailable("a CUDA candidate needs --device cuda (no CUDA device here, and no nvcc to check "
                              "its device code)")
    arch = cuda_arch()
    work_dir.mkdir(parents=True, exist_ok=True)
    source, out = work_dir / "cuda.cu", work_dir / "cuda.cubin"
    cmd = nvcc_command(nvcc, source, out, name=name, arch=arch, extra_cuda_cflags=list(extra_cuda_cflags or []),
                       extra_include_paths=list(extra_include_paths or []))
    key = hashlib.sha256(json.dumps([nvcc_version(nvcc), [str(w).replace(str(work_dir), "") for w in cmd],
                                     cu_text]).encode()).hexdigest()[:24]
    record = work_dir / f"check-{key}.json"
    try:
        known = json.loads(record.read_text())
        refused, report = bool(known["refused"]), str(known["report"])
    except (OSError, ValueError, KeyError, TypeError):
        source.write_text(cu_text)
        t0 = time.monotonic()
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=work_dir)
        output = (done.stdout + done.stderr).replace(str(source), "cuda.cu")
        where = f"nvcc {nvcc_version(nvcc).split(',')[-1].strip()}, sm_{arch}, {time.monotonic() - t0:.0f} s"
        refused, report = _outcome(output, done.returncode, where)
        record.write_text(json.dumps({"refused": refused, "report": report}))
    raise CudaDeviceCodeError(report) if refused else CudaUnavailable(report)


def _outcome(output: str, returncode: int, where: str) -> tuple[bool, str]:
    """(whether nvcc refused the program's code, what to tell)."""
    if returncode == 0:
        return False, (f"no CUDA here to link, load and run it (a CPU build of torch, no GPU); its device code "
                       f"compiles ({where}): judge it with --device cuda")
    missing = _MISSING_HEADER.search(output)
    if missing:
        header = missing.group(1) or missing.group(2)
        return False, (f"cannot check its device code here: this CUDA toolkit has no <{header}> ({where}); "
                       "judge it with --device cuda")
    errors = first_errors(output) or [output.strip()[-2000:]]
    return True, f"nvcc refused the device code ({where}):\n" + "\n".join(errors)


class CudaDeviceCodeCheck:
    """Torch's loaders, with CUDA sources compiled by nvcc and refused (see the module docstring).

    Installed in a CPU worker: `load_inline` with `cuda_sources` and `load` with `.cu` files
    compile the device code the way torch would have, then raise; everything else goes to
    torch as before.
    """

    def install(self) -> None:
        from torch.utils import cpp_extension

        inline: Any = cpp_extension.load_inline
        load: Any = cpp_extension.load
        inline_sig, load_sig = inspect.signature(inline), inspect.signature(load)

        def load_inline(*args: Any, **kwargs: Any) -> Any:
            bound = inline_sig.bind(*args, **kwargs)
            cuda = bound.arguments.get("cuda_sources")
            if not cuda:
                return inline(*args, **kwargs)
            parts = [cuda] if isinstance(cuda, str) else list(cuda)
            if not bound.arguments.get("no_implicit_headers", False):
                # what torch's loader puts first in the .cu file it writes
                parts = ["#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>", *parts]
            _check(bound.arguments, "\n".join(parts))

        def load_files(*args: Any, **kwargs: Any) -> Any:
            bound = load_sig.bind(*args, **kwargs)
            sources = bound.arguments.get("sources")
            files = [sources] if isinstance(sources, str) else list(sources or [])
            cu = [f for f in files if str(f).endswith(".cu")]
            if not cu:
                return load(*args, **kwargs)
            for f in cu:  # each .cu file is its own translation unit, as in torch's build
                _check(bound.arguments, Path(f).read_text())
            raise AssertionError("unreachable: a check always raises")

        load_inline.__wrapped__ = inline  # type: ignore[attr-defined]
        load_files.__wrapped__ = load  # type: ignore[attr-defined]
        cpp_extension.load_inline = load_inline
        cpp_extension.load = load_files


def _check(arguments: dict[str, Any], cu_text: str) -> NoReturn:
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    work = Path(root) / "nvcc-check" if root else Path(os.environ.get("TMPDIR", "/tmp")) / "kernelrl-nvcc-check"
    check_device_code(cu_text, name=str(arguments.get("name", "ext")),
                      extra_cuda_cflags=list(arguments.get("extra_cuda_cflags") or []),
                      extra_include_paths=list(arguments.get("extra_include_paths") or []), work_dir=work)
