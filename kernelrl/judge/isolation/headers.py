"""Precompiled torch headers for candidates' C++ builds: made by the judge, read by every worker.

A CPU extension built through torch's inline loader spends most of its build compiling
`torch/extension.h` (on a 2-core machine, a one-function extension: 18 s, 7.5 s with the header
precompiled; with `-O3`: 23.5 s and 11.8 s). GCC uses a precompiled header it finds beside a
header it includes, valid or not by its own check (the same compiler, and the options and macros
the header depends on), and tries every file of a folder named like the header plus `.gch`. So
the judge keeps one folder per toolchain (`include_dir`: the C++ compiler's and torch's versions,
Python's, the machine), holding a copy of torch's `torch/extension.h` and beside it
`torch/extension.h.gch/` with that copy precompiled once per flag set (a *variant*), and a
worker's build finds the folder first on its include path (`CPATH`, set by the worker's harness,
`kernelrl.judge.harness.toolchain`). The copy is the header GCC names the precompiled one after:
a source that includes the header a second time (as every candidate does after the line torch's
loader adds) finds that file, already included, and a build no variant fits compiles it, which
includes what torch's own includes.

Which variants: a C++ candidate's `load_inline` call names its flags (`extra_cflags`); where they
are all in `ALLOWED_FLAGS` (optimisation levels, `-march=native`, OpenMP, fast math and the
like), `wanted` returns them, and the evaluator has the variant made in the background, under the
device's shared lock (`HeaderStore.prepare`), for the next builds with those flags: the build that
asked compiles the header itself. At most `MAX_VARIANTS` per toolchain.

Guarantees:
- nothing of a candidate's text reaches the judge's compiler but flags from `ALLOWED_FLAGS`: the
  judge compiles torch's own header, with torch's build flags (`_torch_flags`) and those;
- a variant appears whole or not at all (compiled aside, checked, then renamed into the folder),
  and is kept only when a probe compile with torch's flags, of a source that includes the header
  twice, succeeds and uses it (GCC's `-H` names it); one that is not is recorded and not made again;
- workers read the store and never write it: under full containment the toolchain's folder is
  bound read-only (`expose`); `usable` refuses a folder or file not owned by the judge or
  writable by others;
- a precompiled header changes how long a build takes, never what it builds: GCC uses one only
  where its own check finds it equivalent, else compiles the header (as without a store).

Does not: make variants for CUDA builds (nvcc's, or the C++ half of a CUDA extension, whose flags
differ) or for flags outside the list; evict (each variant is hundreds of MiB: delete the folder
to reclaim it); protect the store from workers below full containment, which run as the judge's
user (as every cache at those levels).
"""

from __future__ import annotations

import ast
import contextlib
import fcntl
import functools
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sysconfig
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from kernelrl.judge.harness.device import Device
from kernelrl.judge.isolation.builds import toolchain_fingerprint

# Flags a variant may carry: choices of optimisation and target, none that names a file, a plugin
# or a command. Order matters to the compiler's check, so a variant keeps the candidate's order.
ALLOWED_FLAGS = frozenset({
    "-O0", "-O1", "-O2", "-O3", "-Os", "-Ofast", "-g0", "-DNDEBUG", "-w", "-Wall",
    "-march=native", "-mtune=native", "-mavx", "-mavx2", "-mfma", "-mf16c", "-mavx512f",
    "-fopenmp", "-ffast-math", "-fno-math-errno", "-funroll-loops", "-ftree-vectorize",
    "-fno-strict-aliasing", "-std=c++17", "-std=c++20",
})
MAX_VARIANTS = 6
BUILD_TIMEOUT_S = 300
HEADER = "torch/extension.h"
_GCH = f"{HEADER}.gch"
_WORK = ".work"  # locks, records and headers being made: beside the folder GCC reads, never in it


def _compiler() -> str:
    from torch.utils import cpp_extension

    return str(cpp_extension.get_cxx_compiler())  # type: ignore[no-untyped-call]  # torch's function is untyped


def _torch_header() -> Path:
    from torch.utils import cpp_extension

    return Path(cpp_extension.include_paths("cpu")[0]) / HEADER


def _torch_flags() -> list[str]:
    """What torch's inline loader compiles a CPU extension's source with, less its name
    (`-DTORCH_EXTENSION_NAME`, which the header does not read): its include folders, the
    header's macro, position-independent code and the language standard."""
    from torch.utils import cpp_extension

    includes = [*cpp_extension.include_paths("cpu"), sysconfig.get_paths()["include"]]
    return ["-DTORCH_API_INCLUDE_EXTENSION_H", *[f for p in includes for f in ("-isystem", p)],
            "-fPIC", "-std=c++20"]


@functools.cache
def toolchain_key() -> str:
    text = f"{toolchain_fingerprint(Device.CPU)}\n{_compiler()}\n{_torch_flags()}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def include_dir(root: Path) -> Path:
    """The folder a worker puts on its include path: this toolchain's headers under the judge's
    headers folder (`EvalConfig.headers_root`)."""
    return Path(root) / toolchain_key()


def variant_name(flags: tuple[str, ...]) -> str:
    return hashlib.sha256(json.dumps(list(flags)).encode()).hexdigest()[:16] + ".gch"


def _strings(node: ast.expr | None) -> tuple[str, ...] | None:
    if not isinstance(node, (ast.List, ast.Tuple)):
        return None
    values = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return tuple(v.strip() for v in values) if len(values) == len(node.elts) else None


def wanted(source: str) -> set[tuple[str, ...]]:
    """The flag sets of `source`'s CPU builds through `load_inline` whose flags are all allowed and
    written as literal lists (a flag set computed at run time is not read)."""
    if "load_inline" not in source:  # every batch's every source comes here: most are not parsed
        return set()
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return set()
    found: set[tuple[str, ...]] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if name != "load_inline":
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        cuda = kw.get("cuda_sources", node.args[2] if len(node.args) > 2 else None)
        if cuda is not None and not (isinstance(cuda, ast.Constant) and not cuda.value):
            continue
        flags = _strings(kw["extra_cflags"]) if "extra_cflags" in kw else ()
        if flags is not None and all(f in ALLOWED_FLAGS for f in flags):
            found.add(flags)
    return found


def usable(folder: Path) -> bool:
    """The store's folder, the copy of torch's header and every precompiled one in it, the judge's
    and writable by no one else, none a link."""
    me = os.geteuid()
    try:
        paths = [folder, folder / "torch", folder / HEADER, folder / _GCH]
        paths += [p for p in (folder / _GCH).iterdir()] if (folder / _GCH).is_dir() else []
        for p in paths:
            if not p.exists():
                continue
            st = os.lstat(p)
            if st.st_uid != me or st.st_mode & 0o022 or stat.S_ISLNK(st.st_mode):
                return False
        return True
    except OSError:
        return False


def shown_headers(root: Path) -> str:
    """The folder a program's builds are given (`LoadProgram.headers_dir`): this toolchain's, where
    an evaluator made it and it is the judge's alone; "" otherwise (builds compile the header)."""
    folder = include_dir(root)
    return str(folder) if folder.is_dir() and usable(folder) else ""


class HeaderStore:
    """The judge's side of the store: makes variants for one cache folder, one at a time."""

    def __init__(self, root: Path, *, hold: Callable[[], contextlib.AbstractContextManager[None]]
                 = contextlib.nullcontext) -> None:
        self.folder = include_dir(root)
        self._hold = hold
        self._queue: list[tuple[str, ...]] = []
        self._seen: set[tuple[str, ...]] = set()
        self._guard = threading.Lock()
        self._thread: threading.Thread | None = None
        for sub in (self.folder / _GCH, self.folder / _WORK):
            sub.mkdir(parents=True, exist_ok=True)
        for p in (self.folder.parent, self.folder, self.folder / "torch", self.folder / _GCH):
            p.chmod(0o755)  # a contained worker's uid walks through to read
        copy = self.folder / HEADER
        original = _torch_header().read_bytes()
        if not copy.is_file() or copy.read_bytes() != original:
            aside = self.folder / _WORK / "extension.h"
            aside.write_bytes(original)
            aside.chmod(0o644)
            os.replace(aside, copy)

    def variants(self) -> list[str]:
        return sorted(p.name for p in (self.folder / _GCH).iterdir() if p.suffix == ".gch")

    def has(self, flags: tuple[str, ...]) -> bool:
        return (self.folder / _GCH / variant_name(flags)).is_file()

    def _refused(self, flags: tuple[str, ...]) -> bool:
        return (self.folder / _WORK / (variant_name(flags) + ".unused")).exists()

    def prepare(self, sources: Iterable[str]) -> None:
        """Have the variants the sources' builds want made in the background (see the module docstring)."""
        asked: set[tuple[str, ...]] = set().union(*(wanted(s) for s in sources))
        with self._guard:  # batches may come from several threads: each flag set is queued once
            new = sorted(f for f in asked - self._seen if not self.has(f) and not self._refused(f))
            self._seen |= asked
            if not new:
                return
            self._queue.extend(new)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._drain, name="kernelrl-headers", daemon=True)
                self._thread.start()

    def wait(self, timeout_s: float | None = None) -> None:
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)

    def _drain(self) -> None:
        while True:
            with self._guard:
                if not self._queue:
                    self._thread = None
                    return
                flags = self._queue.pop(0)
            with self._hold():
                self.make(flags)

    def make(self, flags: tuple[str, ...]) -> bool:
        """Make the variant for `flags` (allowed flags only) unless it is there; True when it is
        there after. Several judges sharing the cache take turns (a lock file)."""
        if not all(f in ALLOWED_FLAGS for f in flags):
            raise ValueError(f"not a flag a precompiled header is made for: {[f for f in flags if f not in ALLOWED_FLAGS]}")
        work, target = self.folder / _WORK, self.folder / _GCH / variant_name(flags)
        with open(work / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if target.is_file():
                return True
            if self._refused(flags) or len(self.variants()) >= MAX_VARIANTS:
                return False
            aside = work / target.name
            cxx = _compiler()
            try:  # from the copy: the file a later include of the header finds
                subprocess.run([cxx, "-x", "c++-header", str(self.folder / HEADER), "-o", str(aside), *_torch_flags(),
                                *flags],
                               capture_output=True, timeout=BUILD_TIMEOUT_S, check=True)
                used = self._probe(cxx, aside, flags)
            except (OSError, subprocess.SubprocessError):
                used = False
            if not used:
                aside.unlink(missing_ok=True)
                (work / (target.name + ".unused")).write_text(json.dumps(list(flags)))
                return False
            aside.chmod(0o644)
            os.replace(aside, target)
            return True

    def _probe(self, cxx: str, made: Path, flags: tuple[str, ...]) -> bool:
        """Whether a source compiled as torch compiles one, including the header twice as a
        candidate's does, builds and uses the header just made (GCC's `-H` marks a used
        precompiled header with `!`). Made in a folder of its own, like the store's: the copy
        of the header beside the new variant alone."""
        probe = self.folder / _WORK / "probe"
        (probe / _GCH).mkdir(parents=True, exist_ok=True)
        for old in (probe / _GCH).iterdir():
            old.unlink()
        shutil.copyfile(self.folder / HEADER, probe / HEADER)
        link = probe / _GCH / made.name
        os.link(made, link)
        source = self.folder / _WORK / "probe.cpp"
        source.write_text(f"#include <{HEADER}>\n#include <{HEADER}>\nint kernelrl_probe() {{ return 1; }}\n")
        try:
            out = subprocess.run([cxx, "-H", "-fsyntax-only", "-DTORCH_EXTENSION_NAME=kernelrl_probe",
                                  *_torch_flags(), *flags, str(source)], capture_output=True, text=True,
                                 timeout=BUILD_TIMEOUT_S, env={**os.environ, "CPATH": str(probe)})
            return out.returncode == 0 and any(line.startswith("! ") and made.name in line
                                               for line in out.stderr.splitlines())
        finally:
            link.unlink(missing_ok=True)
