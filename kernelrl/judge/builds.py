"""The build cache: where a program's compiled extensions live, keyed by what made them.

A candidate that builds C++ or CUDA through torch's inline loader builds into its own folder,
named by a hash of its source, the toolchain (torch, Python, compiler versions, machine) and
the device; the worker holds a lock on the folder while it loads (`kernelrl.judge.worker`), so a
program judged before loads its cached build, and parallel evaluations of one program never
race.

Guarantees: the key changes whenever the source, the compiler, torch or the device changes; a
folder holds the build of exactly one key.

Does not evict old builds: the cache folder grows until a person clears it.
"""

from __future__ import annotations

import functools
import hashlib
import platform
import subprocess
import sys
from pathlib import Path


@functools.cache
def toolchain_fingerprint(device: str) -> str:
    import torch

    parts = [torch.__version__, sys.version.split()[0], platform.machine(), device]
    for cmd in (["c++", "--version"], ["nvcc", "--version"] if device == "cuda" else None):
        if cmd is None:
            continue
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout
            parts.append(out.strip().splitlines()[0] if out.strip() else "")
        except (OSError, subprocess.TimeoutExpired):
            parts.append(f"{cmd[0]}:missing")
    if device == "cuda" and torch.cuda.is_available():
        parts.append(torch.cuda.get_device_name())
    return "|".join(parts)


def build_key(source: str, device: str) -> str:
    """Content hash naming a program's build folder: source + toolchain + device."""
    return hashlib.sha256(f"{toolchain_fingerprint(device)}\n{source}".encode()).hexdigest()[:24]


def build_dir(cache_dir: Path, source: str, device: str) -> Path:
    return Path(cache_dir) / "extensions" / build_key(source, device)


def has_build(path: Path) -> bool:
    return path.is_dir() and any(path.rglob("*.so"))
