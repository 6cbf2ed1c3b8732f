"""The build cache: where a program's compiled extensions live, keyed by what made them.

A candidate that builds C++ or CUDA through torch's inline loader builds into its own folder,
named by a hash of its source, the toolchain (torch, Python, compiler versions, machine) and
the device; the worker holds a lock on the folder while it loads (`kernelrl.judge.worker`), so a
program judged before loads its cached build, and parallel evaluations of one program never
race.

Guarantees: the key changes whenever the source, the compiler, torch or the device changes; a
folder holds the build of exactly one key.

In the worker, `PrecompiledHeaderLoader` makes torch's inline loader use a precompiled
`torch/extension.h` for CPU builds, and `exclusive_build_dir` holds the program's build folder
while it loads.

Does not evict old builds: the cache folder grows until a person clears it.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any


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


class PrecompiledHeaderLoader:
    """Torch's inline loader, with a precompiled torch header for CPU builds.

    Torch keeps one precompiled `torch/extension.h` per install, valid for one set of compiler
    flags; rebuilding it for every new flag set would cost more than it saves. So the header is
    built for the first flag set seen under this cache root, and used only by builds with those
    same flags; other builds compile plainly.
    """

    def __init__(self, cache_root: str):
        self.cache_root = cache_root

    def install(self) -> None:
        from torch.utils import cpp_extension

        original = cpp_extension.load_inline
        prepare = getattr(cpp_extension, "_check_and_build_extension_h_precompiler_headers", None)
        loader = self

        def load_inline(*args: Any, **kwargs: Any) -> Any:
            cpu_only = not kwargs.get("cuda_sources") and (len(args) < 3 or not args[2])
            if cpu_only and prepare is not None and "use_pch" not in kwargs:
                kwargs["use_pch"] = loader.prepare_pch(prepare, kwargs.get("extra_cflags"),
                                                      kwargs.get("extra_include_paths"))
            return original(*args, **kwargs)

        load_inline.__wrapped__ = original  # type: ignore[attr-defined]
        cpp_extension.load_inline = load_inline

    def prepare_pch(self, prepare: Any, cflags: Any, include_paths: Any) -> bool:
        import json

        flags = json.dumps([list(cflags or []), list(include_paths or [])])
        try:
            os.makedirs(self.cache_root, exist_ok=True)
            record = os.path.join(self.cache_root, "pch-flags.json")
            # Under a lock: parallel builds must never read a half-written header.
            with open(os.path.join(self.cache_root, "pch.lock"), "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                owner = open(record).read() if os.path.exists(record) else None  # noqa: SIM115 - read once, closed by the collector
                if owner is not None and owner != flags:
                    return False
                prepare(cflags, include_paths)  # a no-op when torch's header matches these flags
                if owner is None:
                    with open(record, "w") as f:
                        f.write(flags)
            return True
        except Exception:  # noqa: BLE001 - no PCH (read-only torch, another compiler): build plainly
            return False


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
