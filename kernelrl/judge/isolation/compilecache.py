"""Compiler caches kept across workers: what torch.compile compiled, sealed like a build.

A fully contained worker compiles in its own scratch (`kernelrl.judge.isolation.containment`), and its
caches die with it, so every torch.compile in a fresh worker starts cold: about 6 s of a 2-core
machine for a one-kernel graph, 1.3 s when inductor finds its compiled graph in its cache
(`benchmarks/README.md`). The judge keeps what workers compiled (inductor's cache, with the Triton
kernels inductor builds on a GPU; and a program's own Triton cache) in two kinds of entry under
`compiled/` of its cache folder:

- **the task's**: what the task's own reference compiled under torch.compile (the compiled
  baseline), keyed by the reference's source, its constants, the device and the toolchain. It is
  written only from a worker that ran the task's own program, never a candidate's, and every
  worker that loads a program of the task gets it: a candidate that compiles the reference's
  graph (the reference wrapped in torch.compile, the commonest rewrite) finds it compiled;
- **a program's**: what a candidate compiled, keyed by its source, the task's constants, the
  device and the toolchain; written from that program's worker, and given only to a worker that
  loads the same source.

So a candidate reads its own entries and its task's, and writes no other's: a program that plants
a poisoned graph in its cache finds it again only in its own next evaluation.

Copies follow the sealed builds' rules (`kernelrl.judge.isolation.builds`): out of a worker, only plain
files owned by its uid on its scratch, through `Scratch` (never a link, never another file
system), with names of letters, digits, `_`, `-` and `.` (not leading), at most `_MAX_DEPTH`
folders deep and `MAX_ENTRY_BYTES` in all (apparent sizes, so a sparse file counts as what it
claims); inductor's lock files are left out. The judge writes them with a manifest of each
file's size, SHA-256 and modification time, and before copying an entry into a worker checks it
against that manifest (nothing missing, nothing more, owned by the judge, writable by no one
else); an entry that fails is not used and the next worker's compile replaces it. An entry is
written once: the first complete one stays. Entries together stay within
`builds.MAX_SEALED_CACHE_BYTES`, the least recently used removed first.

Does not apply to workers without full containment: those compile into the evaluator's cache
folder itself (`cache_root`), shared by every worker of the evaluator, as before. Does not make a
hit certain: inductor decides, by its own key (graph, shapes, its config), whether an entry is
the graph it is asked for.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from kernelrl.judge.harness.device import Device
from kernelrl.judge.harness.places import BUILD_SUBDIR, CACHE_SUBDIR
from kernelrl.judge.isolation.builds import toolchain_fingerprint, verified, write_sealed
from kernelrl.judge.isolation.containment import Scratch

# The caches kept, by the name they have in an entry and where they are in a worker's scratch.
# The task's entry keeps inductor's (its compiled graphs); a program's also its own Triton cache.
TASK_CACHES = {"inductor": f"{CACHE_SUBDIR}/inductor"}
PROGRAM_CACHES = {**TASK_CACHES, "triton": f"{BUILD_SUBDIR}/triton"}
# One entry in all (a CPU graph is a few hundred KiB; a GPU one with its Triton kernels a few MiB).
MAX_ENTRY_BYTES = 256 << 20
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_MAX_DEPTH = 6
_SKIPPED = {"locks"}  # inductor's lock files: empty, and the next compile makes its own


def _key(kind: str, source: str, constants: dict[str, int], device: Device) -> str:
    text = f"{kind}\n{toolchain_fingerprint(device)}\n{json.dumps(constants, sort_keys=True)}\n{source}"
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def task_entry(cache_dir: Path, task_source: str, constants: dict[str, int], device: Device) -> Path:
    """Where the task's own compiled graphs are kept (written only from its reference's worker)."""
    return Path(cache_dir) / "compiled" / _key("task", task_source, constants, device)


def program_entry(cache_dir: Path, source: str, constants: dict[str, int], device: Device) -> Path:
    """Where one program's compiled graphs are kept (written only from a worker running that source)."""
    return Path(cache_dir) / "compiled" / _key("program", source, constants, device)


def _cache_file(rel: str) -> bool:
    """A file an entry may hold: plain names, at most `_MAX_DEPTH` folders deep."""
    parts = rel.split("/")
    return len(parts) <= _MAX_DEPTH + 1 and all(_NAME.match(p) for p in parts)


def _verified(entry: Path) -> dict[str, dict[str, Any]] | None:
    """The manifest of an entry whose files are exactly what it lists, the judge's and unchanged; else None."""
    return verified(entry, _cache_file)


def give(entry: Path, scratch: Scratch) -> dict[str, str]:
    """Copy a verified entry into a worker's scratch (each cache where that worker looks for it):
    what was copied, by name and SHA-256 ({} when there is no entry or it could not be copied).
    Files already there are left as they are."""
    manifest = _verified(entry)
    if not manifest:
        return {}
    given: dict[str, str] = {}
    try:
        for rel, want in sorted(manifest.items()):
            cache, _, inner = rel.partition("/")
            if cache not in PROGRAM_CACHES or not inner:
                return {}
            folder, _, name = f"{PROGRAM_CACHES[cache]}/{inner}".rpartition("/")
            fd = scratch.folder(folder, create=True)
            if fd is None:
                return {}
            try:
                scratch.write(fd, name, (entry / rel).read_bytes(), int(want["mtime_ns"]))
            except FileExistsError:
                pass  # the task's entry and the program's both hold it: the same compiled graph
            finally:
                os.close(fd)
            given[rel] = str(want["sha256"])
        os.utime(entry)  # used now: the last to be evicted
        return given
    except OSError:
        return {}


def keep(scratch: Scratch, entry: Path, caches: dict[str, str], *, given: dict[str, str] | None = None) -> bool:
    """Seal what a worker compiled into `entry` (once: a verified entry stays), less the files it
    was `given` unchanged (another entry holds them); False when nothing was kept (nothing
    compiled, or something that breaks the module docstring's rules)."""
    if _verified(entry):
        return True
    files: dict[str, tuple[bytes, int]] = {}
    budget = [MAX_ENTRY_BYTES]
    for name, where in caches.items():
        if not _collect(scratch, where, name, 0, files, budget):
            return False
    for rel, sha in (given or {}).items():
        if rel in files and hashlib.sha256(files[rel][0]).hexdigest() == sha:
            del files[rel]
    return bool(files) and write_sealed(entry, files)


def _collect(scratch: Scratch, where: str, rel: str, depth: int, files: dict[str, tuple[bytes, int]],
             budget: list[int]) -> bool:
    """Read the plain files under the scratch's folder `where` into `files` (named `rel/...`);
    True when there is no such folder, False when it breaks a rule (keep nothing then)."""
    folder = scratch.folder(where)
    if folder is None:
        return True
    try:
        entries = scratch.entries(folder)
        if sum(st.st_size for _, st in entries if stat.S_ISREG(st.st_mode)) > budget[0]:
            return False  # too large by the sizes the files claim: nothing is read
        for name, st in entries:
            if not _NAME.match(name):
                return False
            if stat.S_ISDIR(st.st_mode):
                if depth == 0 and name in _SKIPPED:
                    continue
                if depth >= _MAX_DEPTH or not _collect(scratch, f"{where}/{name}", f"{rel}/{name}", depth + 1,
                                                       files, budget):
                    return False
            elif stat.S_ISREG(st.st_mode):
                got = scratch.read(folder, name, budget[0])
                if got is None:
                    return False  # not the worker's own plain file, or too large
                files[f"{rel}/{name}"] = got
                budget[0] -= len(got[0])
            else:
                return False  # a link, a socket, a device: not a compiler's cache
        return True
    finally:
        os.close(folder)
