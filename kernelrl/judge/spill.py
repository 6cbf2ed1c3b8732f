"""The judge's copies of large input sets and reference outputs, kept in files rather than its heap.

A group holds every correctness set and the reference's output on it while it judges candidates
(each candidate is checked on all of them), and the timing pool while it times them. At KernelBench's
full size that is tens of GiB (a level-1 elementwise set is 12 GiB): in the judge's heap it is memory
nothing else can have, and the kernel's OOM killer takes the judge or a worker. A message at or above
`EvalConfig.spill_set_mib` has its tensors written to files in `<cache_dir>/sets` and mapped back
privately: the judge's tensors are then page cache, which the kernel drops when memory runs short
(the file holds the bytes) and reads back when a candidate is sent a set.

Guarantees: a spilled tensor has the dtype, shape and bytes it had, and is contiguous (as every
tensor read from the channel is); the tree keeps its structure and every other value; an in-place
write to a spilled tensor changes only the judge's copy (copy-on-write), never the file; no file is
left once its tensors are gone; a file has no name in the folder (O_TMPFILE), or where the
filesystem has no unnamed files, a name only between its write and its mapping.

Does not: bound the page cache (that is the kernel's, and reclaimable), spill what a worker holds
(a worker holds one set at a time), or save memory where the folder is itself in memory (a tmpfs:
`folder_in_memory` says so, and the judge then keeps sets in its heap; `ReferenceRecord.sets_in_files`
of a result says how many sets were kept in files).

`SetCopies` is the one rule a reference session applies to its sets: which go to files, counted as
they arrive.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from kernelrl.judge.harness.channel import payload_bytes

SPILL_SUBDIR = "sets"
# Smaller tensors stay in the heap: a file and a mapping each cost more than their bytes.
MIN_TENSOR_BYTES = 1 << 20
_MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs", "shm"})


@functools.cache
def folder_in_memory(folder: Path) -> bool:
    """Whether `folder` lies on a filesystem whose pages are memory (tmpfs, ramfs): the longest
    mount point of /proc/self/mounts that contains it decides. Read once per folder in a process
    (every group asks; a cache folder does not change filesystems under a running judge)."""
    path = str(folder.resolve())
    best, kind = "", ""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return False
    for line in mounts:
        parts = line.split()
        if len(parts) < 3:
            continue
        point = parts[1].replace("\\040", " ")
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, parts[2]
    return kind in _MEMORY_FILESYSTEMS


def disk_free(folder: Path) -> int | None:
    """Bytes free where `folder` is (or would be made), None where that cannot be told."""
    for place in (folder, *folder.parents):
        if place.exists():
            try:
                return shutil.disk_usage(place).free
            except OSError:
                return None
    return None


def spill_tensor(t: torch.Tensor, folder: Path) -> torch.Tensor:
    """`t`'s bytes in a file of `folder`, mapped back privately; `t` itself is untouched.

    The file has no name where the filesystem allows (O_TMPFILE): no process that can list or open
    the folder (a candidate under a weaker containment, running as the judge's user) finds the
    reference's outputs there. Elsewhere it is named from its write until its mapping."""
    src = t.detach().contiguous()
    nbytes = src.numel() * src.element_size()
    folder.mkdir(parents=True, exist_ok=True)
    name: str | None = None
    try:
        fd = os.open(folder, os.O_TMPFILE | os.O_RDWR, 0o600)
    except OSError:  # a filesystem without unnamed files
        fd, name = tempfile.mkstemp(dir=folder, prefix="set-")
    try:
        with os.fdopen(os.dup(fd), "wb") as f:
            # Written from a byte view of the tensor itself: no second copy in the heap.
            f.write(src.reshape(-1).view(torch.uint8).numpy().data)
        mapped = torch.from_file(f"/proc/self/fd/{fd}", shared=False, size=nbytes, dtype=torch.uint8)
    finally:
        os.close(fd)
        if name is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name)
    return mapped.view(src.dtype).reshape(src.shape)


def spill(tree: Any, folder: Path) -> tuple[Any, int]:
    """`tree` (lists, tuples, dicts, tensors and plain values, as a channel payload) with every
    dense CPU tensor of `MIN_TENSOR_BYTES` or more spilled to `folder`, the rest as they were; and
    the bytes spilled."""
    written = [0]

    def walk(node: Any) -> Any:
        if isinstance(node, torch.Tensor):
            nbytes = node.numel() * node.element_size()
            plain = node.layout is torch.strided and node.device.type == "cpu" and type(node) is torch.Tensor
            if nbytes < MIN_TENSOR_BYTES or not plain:
                return node
            written[0] += nbytes
            return spill_tensor(node, folder)
        if isinstance(node, list):
            return [walk(v) for v in node]
        if isinstance(node, tuple):
            return tuple(walk(v) for v in node)
        if isinstance(node, dict):
            return {k: walk(v) for k, v in node.items()}
        return node

    return walk(tree), written[0]


class SetCopies:
    """The judge's copies of one reference session's sets (inputs and outputs) and of the values it
    keeps a while: in files of `folder` from `min_bytes` on (`folder` None: every one in the heap),
    as they arrive; how many sets went to files (`in_files`) and the largest set's bytes (`largest`)."""

    def __init__(self, folder: Path | None, min_bytes: int) -> None:
        self.folder = folder
        self.min_bytes = min_bytes
        self.in_files = 0  # sets (correctness and timing) the judge keeps in files
        self.largest = 0  # bytes of the largest input set and its outputs that arrived

    def files_for(self, nbytes: int) -> Path | None:
        """The folder a set (inputs and outputs) or a value of `nbytes` is kept in, or None where it
        stays in the judge's heap: the one rule for the size check and the sets as they arrive."""
        return self.folder if self.folder is not None and nbytes >= self.min_bytes else None

    def keep(self, value: object) -> object:
        """`value` as the judge keeps it for a while (a candidate's first output, until its second
        run is compared with it): in a file where a value that large goes there (`files_for`), else as
        it is."""
        folder = self.files_for(payload_bytes(value))
        return value if folder is None else spill(value, folder)[0]

    def arrived(self, made: list[object], ran: list[object]) -> tuple[list[Any], list[Any]]:
        """One set as the judge keeps it (its inputs `made` and the reference's outputs `ran`): in files
        where a set that large goes there, spilled before the next set arrives, so the judge's heap
        holds one set at a time."""
        size = payload_bytes(made) + payload_bytes(ran)
        self.largest = max(self.largest, size)
        folder = self.files_for(size)
        if folder is None:
            return made, ran
        (made, ran), written = spill((made, ran), folder)
        self.in_files += written > 0
        return made, ran
