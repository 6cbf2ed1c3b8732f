"""Compiler caches kept across workers (`kernelrl.judge.isolation.compilecache`): what is kept, for whom, and
what is refused. A folder of this test stands in for a worker's scratch (the judge reaches a real
one through `Scratch` the same way: one component at a time, owner and file system checked)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelrl.judge.harness.device import Device
from kernelrl.judge.isolation import compilecache
from kernelrl.judge.isolation.builds import MANIFEST
from kernelrl.judge.isolation.containment import Scratch

INDUCTOR = compilecache.TASK_CACHES["inductor"]
GRAPH = {  # what one CPU compile leaves in inductor's cache, in its layout
    "3g/c3g2mq.cpp": b"extern \"C\" void kernel() {}",
    "3g/c3g2mq.so": b"\x7fELF compiled kernel",
    "yc/cycowj.py": b"# the graph's wrapper module",
    "fxgraph/dm/fdmrhq/ommnul": b"pickled graph entry",
}


def _scratch(root: Path) -> Iterator[Scratch]:
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    scratch = Scratch(fd, dev=os.fstat(fd).st_dev, uid=os.geteuid())
    try:
        yield scratch
    finally:
        scratch.close()


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[Scratch]:
    yield from _scratch(tmp_path / "worker")


@pytest.fixture
def other(tmp_path: Path) -> Iterator[Scratch]:
    yield from _scratch(tmp_path / "other")


def _compiled(root: Path, files: dict[str, bytes], cache: str = INDUCTOR) -> None:
    for rel, data in files.items():
        path = root / cache / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        os.utime(path, ns=(10**18, 10**18))


def test_what_a_worker_compiled_is_kept_and_given_to_the_next_worker_where_it_looks(tmp_path, worker, other):
    _compiled(tmp_path / "worker", GRAPH)
    (tmp_path / "worker" / INDUCTOR / "locks").mkdir()
    (tmp_path / "worker" / INDUCTOR / "locks" / "c3g2mq.lock").write_bytes(b"")
    entry = tmp_path / "cache" / "compiled" / "key"
    assert compilecache.keep(worker, entry, compilecache.TASK_CACHES)
    manifest = json.loads((entry / MANIFEST).read_text())["files"]
    assert sorted(manifest) == sorted(f"inductor/{rel}" for rel in GRAPH)  # the lock file left out
    given = compilecache.give(entry, other)
    assert sorted(given) == sorted(manifest)
    for rel, data in GRAPH.items():
        copied = tmp_path / "other" / INDUCTOR / rel
        assert copied.read_bytes() == data and copied.stat().st_mtime_ns == 10**18


def test_a_program_keeps_only_what_it_compiled_beyond_what_it_was_given(tmp_path, worker, other):
    _compiled(tmp_path / "worker", GRAPH)
    task = tmp_path / "cache" / "compiled" / "task"
    assert compilecache.keep(worker, task, compilecache.TASK_CACHES)
    given = compilecache.give(task, other)
    own = tmp_path / "cache" / "compiled" / "program"
    # the program compiled nothing new: no entry of its own
    assert not compilecache.keep(other, own, compilecache.PROGRAM_CACHES, given=given) and not own.exists()
    # it rewrote a file it was given and compiled a Triton kernel of its own: both are its, not the task's
    (tmp_path / "other" / INDUCTOR / "yc" / "cycowj.py").write_bytes(b"# planted")
    _compiled(tmp_path / "other", {"abc/kernel.json": b"{}"}, cache=compilecache.PROGRAM_CACHES["triton"])
    assert compilecache.keep(other, own, compilecache.PROGRAM_CACHES, given=given)
    assert sorted(json.loads((own / MANIFEST).read_text())["files"]) == ["inductor/yc/cycowj.py", "triton/abc/kernel.json"]
    assert (task / "inductor" / "yc" / "cycowj.py").read_bytes() == GRAPH["yc/cycowj.py"]  # the task's is unchanged


def test_the_tasks_entry_and_a_programs_are_named_apart():
    constants = {"N": 4096}
    source = "class Model: ..."
    task = compilecache.task_entry(Path("/c"), source, constants, Device.CPU)
    assert task != compilecache.program_entry(Path("/c"), source, constants, Device.CPU)  # a candidate cannot name the task's
    assert task != compilecache.task_entry(Path("/c"), source, {"N": 8192}, Device.CPU)  # other shapes, other graphs
    assert (compilecache.program_entry(Path("/c"), source, constants, Device.CPU)
            != compilecache.program_entry(Path("/c"), source + " ", constants, Device.CPU))


def test_a_changed_entry_is_not_given(tmp_path, worker, other):
    _compiled(tmp_path / "worker", GRAPH)
    entry = tmp_path / "cache" / "compiled" / "key"
    assert compilecache.keep(worker, entry, compilecache.TASK_CACHES)
    so = entry / "inductor" / "3g" / "c3g2mq.so"
    so.write_bytes(b"\x7fELF planted kernel!")  # same size, other bytes
    assert compilecache.give(entry, other) == {} and not (tmp_path / "other" / INDUCTOR).exists()
    so.write_bytes(GRAPH["3g/c3g2mq.so"])
    (entry / "inductor" / "extra.py").write_bytes(b"")  # a file the manifest does not list
    assert compilecache.give(entry, other) == {}
    (entry / "inductor" / "extra.py").unlink()
    manifest = json.loads((entry / MANIFEST).read_text())
    manifest["files"]["inductor/../../escape.py"] = manifest["files"].pop("inductor/yc/cycowj.py")
    (entry / MANIFEST).write_text(json.dumps(manifest))
    assert compilecache.give(entry, other) == {}


@pytest.mark.parametrize("plant", ["link", "dot_name", "too_large", "too_deep"])
def test_a_cache_that_breaks_a_rule_is_not_kept(tmp_path, worker, plant):
    root = tmp_path / "worker" / INDUCTOR
    _compiled(tmp_path / "worker", GRAPH)
    if plant == "link":  # a link to a file of the judge's machine
        os.symlink("/etc/hostname", root / "yc" / "hostname.py")
    elif plant == "dot_name":
        (root / "yc" / "..hidden").write_bytes(b"")
    elif plant == "too_large":  # sparse: counted by the size it claims, and not read
        with open(root / "3g" / "huge.so", "wb") as f:
            f.truncate(compilecache.MAX_ENTRY_BYTES + 1)
    else:
        deep = root.joinpath(*["d"] * (compilecache._MAX_DEPTH + 1))
        deep.mkdir(parents=True)
        (deep / "x.py").write_bytes(b"")
    entry = tmp_path / "cache" / "compiled" / "key"
    assert not compilecache.keep(worker, entry, compilecache.TASK_CACHES)
    assert not entry.exists()


def test_an_entry_is_written_once(tmp_path, worker, other):
    _compiled(tmp_path / "worker", GRAPH)
    entry = tmp_path / "cache" / "compiled" / "key"
    assert compilecache.keep(worker, entry, compilecache.TASK_CACHES)
    _compiled(tmp_path / "other", {"yc/cycowj.py": b"# a later worker's other bytes"})
    assert compilecache.keep(other, entry, compilecache.TASK_CACHES)  # a verified entry stays
    assert (entry / "inductor" / "yc" / "cycowj.py").read_bytes() == GRAPH["yc/cycowj.py"]
