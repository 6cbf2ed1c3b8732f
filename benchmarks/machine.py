"""What a benchmark ran on: printed first by every GPU-path benchmark, so no figure travels alone.

`describe(device)` returns the device's name, the NVIDIA driver, CUDA (torch's build and nvcc),
torch, Triton, Python and the kernelrl commit; anything that cannot be read is "none" or
"unknown", never guessed. `header(device)` is the same as one printable block.
"""

from __future__ import annotations

import importlib.metadata
import platform
import shutil
import subprocess
import sys
from pathlib import Path


def _run(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def describe(device: str) -> dict[str, str]:
    import torch

    info = {"device": device}
    if device == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["device_name"] = f"{props.name} (sm_{props.major}{props.minor}, {props.total_memory / 2**30:.0f} GiB)"
    else:
        info["device_name"] = _cpu_name()
    smi = shutil.which("nvidia-smi")
    info["driver"] = (_run([smi, "--query-gpu=driver_version", "--format=csv,noheader"]).splitlines() or ["none"])[0] \
        if smi else "none"
    info["cuda_torch"] = torch.version.cuda or "none (CPU build)"
    nvcc = _run(["nvcc", "--version"]) if shutil.which("nvcc") else ""
    info["nvcc"] = next((line.strip() for line in nvcc.splitlines() if "release" in line), "none")
    info["torch"] = torch.__version__
    try:
        info["triton"] = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        info["triton"] = "not installed"
    info["python"] = sys.version.split()[0]
    info["kernelrl_commit"] = _run(["git", "-C", str(Path(__file__).resolve().parent), "rev-parse", "--short", "HEAD"]) \
        or "unknown"
    return info


def header(device: str) -> str:
    return "\n".join(f"# {k}: {v}" for k, v in describe(device).items())
