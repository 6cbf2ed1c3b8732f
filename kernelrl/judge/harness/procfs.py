"""A process's descendants, read from /proc: what a worker counts of its own helpers after each call,
and what the judge walks of a sandbox's process tree (`kernelrl.judge.isolation.containment`).

Guarantee: `os.listdir` and `open` are bound when this module is imported, and a worker imports
it before any program code runs, so a program that rebinds them changes nothing here. Imports
nothing of torch or of the judge.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

# Bound at import: the worker counts its own descendants with `descendants` after program code
# ran, which may have rebound `os.listdir` or `open` (the worker imports this module first).
_listdir, _open = os.listdir, open


def _children(pid: int) -> list[int]:
    """`pid`'s children, exited-but-unreaped ones included (the kernel lists them until reaped)."""
    kids: list[int] = []
    try:
        for tid in _listdir(f"/proc/{pid}/task"):
            try:
                with _open(f"/proc/{pid}/task/{tid}/children") as f:
                    kids += [int(k) for k in f.read().split()]
            except OSError:
                continue
    except OSError:
        pass
    return kids


def descendants(pid: int, depth: int = 4) -> Iterator[int]:
    """`pid`'s descendants, nearest first, `depth` generations deep."""
    level = [pid]
    for _ in range(depth):
        level = [k for p in level for k in _children(p)]
        yield from level
