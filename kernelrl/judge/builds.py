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

Under full containment (`kernelrl.judge.containment`) a worker cannot see the cache: it builds in
its own scratch, and the judge keeps the build in `sealed/KEY/` instead:
- `seal` copies out of the worker's scratch only torch extension folders (a folder named like an
  extension, holding a shared library) and in them only the files a load needs (`SEALED_NAMES`):
  plain files owned by the worker's uid, on its scratch, within `MAX_SEALED_BYTES` in all; the
  judge writes them, and a manifest of each file's size, SHA-256 and modification time, into
  `sealed/KEY/`, all owned by the judge;
- `unseal`, before a worker loads a program, checks the sealed folder against its manifest
  (nothing missing, nothing more, sizes and hashes equal, owned by the judge and writable by no
  one else) and only then copies it into the worker's scratch; a folder that fails the check is
  a build that is not cached (the worker builds again, and `seal` replaces it).

Does not evict old builds: the cache folder grows until a person clears it.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import platform
import re
import secrets
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

from kernelrl.judge.containment import BUILD_SUBDIR, Scratch

# What a cached torch extension folder may hold: what ninja and the loader read back.
SEALED_NAMES = re.compile(r"^(build\.ninja|\.ninja_log|\.ninja_deps|main\.cpp|cuda\.cu|[A-Za-z0-9_.-]+\.(o|so))$")
_EXTENSION_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_SEALED_BYTES = 1 << 30
MANIFEST = "MANIFEST.json"


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


def sealed_dir(cache_dir: Path, source: str, device: str) -> Path:
    """Where the judge keeps the build of a fully contained worker (see the module docstring)."""
    return Path(cache_dir) / "sealed" / build_key(source, device)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verified(sealed: Path) -> dict[str, dict[str, Any]] | None:
    """The manifest of a sealed build whose files are exactly and only what it lists; else None."""
    try:
        manifest = json.loads((sealed / MANIFEST).read_text())["files"]
        present = {str(p.relative_to(sealed)) for p in sealed.rglob("*") if not p.is_dir()} - {MANIFEST}
        if not isinstance(manifest, dict) or set(manifest) != present:
            return None
        me = os.geteuid()
        for rel, entry in manifest.items():
            folder, _, name = rel.partition("/")
            if not _EXTENSION_NAME.match(folder) or not SEALED_NAMES.match(name):
                return None
            path = sealed / rel
            st = os.lstat(path)
            if (not stat.S_ISREG(st.st_mode) or st.st_uid != me or st.st_mode & 0o022
                    or st.st_size != entry["size"] or _sha256(path) != entry["sha256"]):
                return None
        return manifest
    except (OSError, ValueError, KeyError, TypeError):
        return None


def unseal(sealed: Path, scratch: Scratch) -> bool:
    """Copy a verified sealed build into a worker's scratch, where it builds; False when there is none."""
    manifest = verified(sealed)
    if not manifest:
        return False
    root = scratch.folder(BUILD_SUBDIR, create=True)
    if root is None:
        return False
    try:
        for folder in sorted({rel.partition("/")[0] for rel in manifest}):
            fd = scratch.folder(f"{BUILD_SUBDIR}/{folder}", create=True)
            if fd is None:
                return False
            try:
                for rel, entry in manifest.items():
                    if rel.partition("/")[0] == folder:
                        scratch.write(fd, rel.partition("/")[2], (sealed / rel).read_bytes(), int(entry["mtime_ns"]))
            finally:
                os.close(fd)
        return True
    except OSError:
        return False
    finally:
        os.close(root)


def seal(scratch: Scratch, sealed: Path) -> bool:
    """Keep the torch extensions a worker built (see the module docstring); False when nothing was kept."""
    if verified(sealed):
        return True
    root = scratch.folder(BUILD_SUBDIR)
    if root is None:
        return False
    files: dict[str, tuple[bytes, int]] = {}
    total = 0
    try:
        for folder, st in scratch.entries(root):
            if not stat.S_ISDIR(st.st_mode) or not _EXTENSION_NAME.match(folder):
                continue
            fd = scratch.folder(f"{BUILD_SUBDIR}/{folder}")
            if fd is None:
                continue
            try:
                kept = {}
                for name, fst in scratch.entries(fd):
                    if not stat.S_ISREG(fst.st_mode) or not SEALED_NAMES.match(name):
                        continue  # torch's lock, a precompiled header, anything else: not a build's
                    got = scratch.read(fd, name, MAX_SEALED_BYTES - total)
                    if got is None:
                        return False  # not the worker's own plain file, or too large: keep nothing
                    kept[f"{folder}/{name}"] = got
                    total += len(got[0])
                if any(k.endswith(".so") for k in kept):
                    files.update(kept)
            finally:
                os.close(fd)
    finally:
        os.close(root)
    if not files:
        return False
    return _write_sealed(sealed, files)


def _write_sealed(sealed: Path, files: dict[str, tuple[bytes, int]]) -> bool:
    parent = sealed.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = parent / f".tmp-{sealed.name}-{secrets.token_hex(4)}"
    try:
        manifest = {}
        for rel, (data, mtime_ns) in files.items():
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
            with open(path, "xb") as f:
                f.write(data)
            os.chmod(path, 0o644)
            os.utime(path, ns=(mtime_ns, mtime_ns))
            manifest[rel] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "mtime_ns": mtime_ns}
        (tmp / MANIFEST).write_text(json.dumps({"files": manifest}, indent=1, sort_keys=True))
        if sealed.exists():  # a build that failed its check: replaced
            trash = parent / f".old-{sealed.name}-{secrets.token_hex(4)}"
            os.rename(sealed, trash)
            shutil.rmtree(trash, ignore_errors=True)
        os.rename(tmp, sealed)
        return True
    except OSError:
        return verified(sealed) is not None  # another evaluation sealed the same build first
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class PrecompiledHeaderLoader:
    """Torch's inline loader, with a precompiled torch header for CPU builds.

    Torch keeps one precompiled `torch/extension.h` per install, valid for one set of compiler
    flags; rebuilding it for every new flag set would cost more than it saves. So the header is
    built for the first flag set seen under this cache root, and used only by builds with those
    same flags; other builds compile plainly. Where torch's folder is read-only (full
    containment), a header that is there with the same flags is used, none is made or removed.
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
        remove = getattr(cpp_extension, "remove_extension_h_precompiler_headers", None)
        if remove is not None:
            # Without a precompiled header torch deletes the one in its own folder; under full
            # containment that folder is read-only: the header stays (gcc skips one whose flags differ).
            def keep_when_read_only() -> None:
                try:
                    remove()
                except OSError:
                    pass

            cpp_extension.remove_extension_h_precompiler_headers = keep_when_read_only

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
