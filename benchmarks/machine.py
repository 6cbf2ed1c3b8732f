"""What a benchmark ran on: printed first by every GPU-path benchmark, so no figure travels alone.

`describe(device)` returns the device's name, the NVIDIA driver, CUDA (torch's build and nvcc),
torch, Triton, Python, the kernelrl commit and a digest of its source; anything that cannot be
read is "none" or "unknown", never guessed. `header(device)` is the same as one printable block.
"""

from __future__ import annotations

import hashlib
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
    here = str(Path(__file__).resolve().parent)
    commit = _run(["git", "-C", here, "rev-parse", "--short", "HEAD"]) or "unknown"
    # A copied checkout can carry an older .git than its files (the device machines' copies did):
    # the commit then names where the files started, and the digest says which files ran.
    if _run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"]):
        commit += " (files differ from it)"
    info["kernelrl_commit"] = commit
    info["kernelrl_source"] = source_digest()
    return info


def source_digest() -> str:
    """sha256 (12 hex digits) of every kernelrl/*.py file's path and bytes: equal digests, same code."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for f in sorted((root / "kernelrl").rglob("*.py")):
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def header(device: str) -> str:
    return "\n".join(f"# {k}: {v}" for k, v in describe(device).items())
