"""Per-worker cgroups: every process started inside is counted and ended, whatever its parentage."""

from __future__ import annotations

import subprocess
import time

import pytest

from kernelrl.judge.isolation import cgroup
from kernelrl.judge.isolation.cgroup import Cgroup

pytestmark = pytest.mark.skipif(not cgroup.available(), reason="no writable cgroup v2 hierarchy here")


def test_an_orphan_in_a_session_of_its_own_is_found_counted_and_killed():
    cg = Cgroup.make()
    assert cg is not None
    try:
        # The shell starts a burner in a new session and exits at once: the burner is an orphan,
        # adopted by whoever adopts orphans here, in no process group of the shell's.
        done = subprocess.run(cg.join_argv(["/bin/sh", "-c", "setsid sh -c 'while :; do :; done' &"]),
                              timeout=10)
        assert done.returncode == 0
        time.sleep(0.3)
        pids = cg.pids()
        assert len(pids) == 1
        used = cg.usage_ns()
        assert used is not None and used > 20_000_000  # it burnt CPU, and the cgroup counted it
        assert cg.kill()
        assert cg.pids() == [] and not cg.populated()
        assert (cg.usage_ns() or 0) >= used  # a dead process's CPU stays counted
    finally:
        cg.remove()
    assert not cg.path.exists()
