"""Builds, the judge's side: where a program's compiled extensions live, and how a fully contained
worker's build is sealed and given back (how a worker builds: `kernelrl.judge.harness.toolchain`).

A candidate that builds C++ or CUDA through torch's inline loader builds into its own folder,
named by a hash of its source, the toolchain (torch, Python, compiler versions, machine) and
the device; the worker holds a lock on the folder while it loads (`kernelrl.judge.harness.worker`), so a
program judged before loads its cached build, and parallel evaluations of one program never
race.

Guarantees: the key changes whenever the source, the compiler, torch, the device or the CUDA
architecture built for (`kernelrl.judge.harness.device.cuda_arch_list`: `9.0a` on an H100) changes; a
folder holds the build of exactly one key.

Under full containment (`kernelrl.judge.isolation.containment`) a worker cannot see the cache: it builds in
its own scratch, and the judge keeps the build in `sealed/KEY/` instead:
- `seal` copies out of the worker's scratch only torch extension folders (a folder named like an
  extension, holding a shared library) and in them only the files a load needs (`SEALED_NAMES`):
  plain files owned by the worker's uid, on its scratch, within `MAX_SEALED_BYTES` in all (each
  file counted by its apparent size, so a sparse file counts as what it claims, and none read
  when they claim more); the judge writes them, and a manifest of each file's size, SHA-256 and
  modification time, into `sealed/KEY/`, all owned by the judge;
- `unseal`, before a worker loads a program, checks the sealed folder against its manifest
  (nothing missing, nothing more, sizes and hashes equal, owned by the judge and writable by no
  one else) and only then copies it into the worker's scratch; a folder that fails the check is
  a build that is not cached (the worker builds again, and `seal` replaces it).
- the sealed builds together stay within `MAX_SEALED_CACHE_BYTES` (apparent sizes): after a build
  is sealed, the least recently used others (a sealed folder's modification time is set when it
  is sealed or unsealed) are removed until the rest fits.

Does not evict the unsealed build folders of uncontained workers (`extensions/`): that folder grows
until a person clears it.
"""

from __future__ import annotations

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernelrl.judge.harness.device import Device, cuda_arch_list
from kernelrl.judge.harness.places import BUILD_SUBDIR
from kernelrl.judge.isolation.containment import Scratch

# What a cached torch extension folder may hold: what ninja and the loader read back.
SEALED_NAMES = re.compile(r"^(build\.ninja|\.ninja_log|\.ninja_deps|main\.cpp|cuda\.cu|[A-Za-z0-9_.-]+\.(o|so))$")
_EXTENSION_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# One build (a CPU extension is a few MiB; a CUDA one for a few architectures tens), and all of them.
MAX_SEALED_BYTES = 256 << 20
MAX_SEALED_CACHE_BYTES = 8 << 30
MANIFEST = "MANIFEST.json"


@functools.cache
def toolchain_fingerprint(device: Device) -> str:
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
    if device == "cuda":  # what the build targets: a build for sm_90 is not one for sm_90a
        parts.append(f"arch {cuda_arch_list()}")
    return "|".join(parts)


def build_key(source: str, device: Device) -> str:
    """Content hash naming a program's build folder: source + toolchain + device."""
    return hashlib.sha256(f"{toolchain_fingerprint(device)}\n{source}".encode()).hexdigest()[:24]


def build_dir(cache_dir: Path, source: str, device: Device) -> Path:
    return Path(cache_dir) / "extensions" / build_key(source, device)


def has_build(path: Path) -> bool:
    return path.is_dir() and any(path.rglob("*.so"))


def sealed_dir(cache_dir: Path, source: str, device: Device) -> Path:
    """Where the judge keeps the build of a fully contained worker (see the module docstring)."""
    return Path(cache_dir) / "sealed" / build_key(source, device)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _build_file(rel: str) -> bool:
    """A file a sealed build may hold: one a load needs, in an extension's folder."""
    folder, _, name = rel.partition("/")
    return bool(_EXTENSION_NAME.match(folder) and SEALED_NAMES.match(name))


def verified(sealed: Path, allowed: Callable[[str], bool] = _build_file) -> dict[str, dict[str, Any]] | None:
    """The manifest of a sealed folder whose files are exactly and only what it lists, each named as
    `allowed` accepts (a sealed build's by default), the judge's, writable by no one else and
    unchanged; else None."""
    try:
        manifest = json.loads((sealed / MANIFEST).read_text())["files"]
        present = {str(p.relative_to(sealed)) for p in sealed.rglob("*") if not p.is_dir()} - {MANIFEST}
        if not isinstance(manifest, dict) or set(manifest) != present:
            return None
        me = os.geteuid()
        for rel, entry in manifest.items():
            if not allowed(rel):
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
        os.utime(sealed)  # used now: the last to be evicted
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
                # torch's lock, a precompiled header, anything else: not a build's
                wanted = [(n, fs) for n, fs in scratch.entries(fd) if stat.S_ISREG(fs.st_mode) and SEALED_NAMES.match(n)]
                if total + sum(fs.st_size for _, fs in wanted) > MAX_SEALED_BYTES:
                    return False  # too large by the sizes the files claim (a sparse file too): nothing is read
                for name, _ in wanted:
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
    return write_sealed(sealed, files)


def write_sealed(sealed: Path, files: dict[str, tuple[bytes, int]]) -> bool:
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
        evict(parent, keep=sealed)
        return True
    except OSError:
        return verified(sealed) is not None  # another evaluation sealed the same build first
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _apparent_bytes(folder: Path) -> int:
    total = 0
    for p in folder.rglob("*"):
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            total += st.st_size
    return total


def evict(parent: Path, *, keep: Path | None = None, limit: int | None = None) -> list[str]:
    """Remove the least recently used sealed builds under `parent` until the rest fit in `limit`
    (`MAX_SEALED_CACHE_BYTES`); `keep` is never removed. The names removed."""
    limit = MAX_SEALED_CACHE_BYTES if limit is None else limit
    builds = []
    for p in parent.iterdir():
        try:
            if p.is_dir() and not p.is_symlink():
                builds.append((p.stat().st_mtime_ns, p, _apparent_bytes(p)))
        except OSError:
            continue
    total = sum(b[2] for b in builds)
    removed = []
    for _, path, size in sorted(builds, key=lambda b: b[0]):
        if total <= limit:
            break
        if keep is not None and path == keep:
            continue
        trash = parent / f".old-{path.name}-{secrets.token_hex(4)}"
        try:
            os.rename(path, trash)
        except OSError:
            continue  # another evaluation removed it first
        shutil.rmtree(trash, ignore_errors=True)
        total -= size
        removed.append(path.name)
    return removed
