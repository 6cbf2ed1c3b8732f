"""`benchmarks/gpu_check.sh --dry-run` on a CPU: every step starts, writes its line and stops within its
own limit; the output folder holds at most 8 files; absent user data is a clear skip. And the pytest
plugin behind tests.jsonl writes one line per test with its outcome, as each test ends.

The dry run's figures mean nothing (tiny CPU settings, steps cut by a short limit); what is tested
is that the one GPU command cannot overrun or lose what it measured.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STEPS = ["env", "floor", "workers", "aa", "kernelbench", "cuda_l1", "throughput", "streams", "gpu_tests"]
LIMIT = 6  # seconds a step may run: each starts an interpreter that imports torch, most are cut
KILL_AFTER = 5


def test_gpu_check_dry_run_starts_every_step_and_stops_in_time(tmp_path):
    out = tmp_path / "out"
    checkout = tmp_path / "kb" / "KernelBench" / "level1"
    checkout.mkdir(parents=True)
    (checkout / "1_silu.py").write_text((ROOT / "tests" / "fixtures" / "tasks" / "elementwise_silu.py").read_text())
    cuda_l1 = tmp_path / "h100.json"
    cuda_l1.write_text("")
    env = {k: v for k, v in os.environ.items() if k not in ("KERNELBENCH", "CUDA_L1", "KERNELRL_CACHE")}
    env["GPU_CHECK_DRY_LIMIT"] = str(LIMIT)
    t0 = time.monotonic()
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), str(out), "--dry-run",
                           "--kernelbench", str(checkout.parent.parent)], capture_output=True, text=True, env=env,
                          timeout=len(STEPS) * (LIMIT + KILL_AFTER) + 60)
    wall = time.monotonic() - t0
    assert done.returncode == 0, done.stderr[-2000:]
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == STEPS
    by = {s["step"]: s for s in steps}
    for s in steps:
        assert s["seconds"] <= s["limit_s"] + KILL_AFTER + 1, s
    assert by["kernelbench"]["skipped"] is False and by["kernelbench"]["limit_s"] == LIMIT
    assert by["cuda_l1"]["skipped"] is True and "CUDA_L1" in by["cuda_l1"]["reason"]
    # on a loaded machine a step may be cut by its short limit; one that ended wrote its file
    assert by["env"]["rc"] in (0, 124) and by["floor"]["rc"] in (0, 124)
    assert wall < len(STEPS) * (LIMIT + KILL_AFTER) + 30
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and {"steps.jsonl", "log.txt"} <= set(files)
    if by["env"]["rc"] == 0:
        assert "# torch:" in (out / "env.txt").read_text()
    if by["floor"]["rc"] == 0:
        floors = {json.loads(line)["measure"] for line in (out / "floor.jsonl").read_text().splitlines()}
        assert {"sync", "python_call", "empty_kernel"} <= floors
    if by["streams"]["rc"] == 0:  # the gpu tests collected and skipped on a CPU, one line each
        tests = [json.loads(line) for line in (out / "tests.jsonl").read_text().splitlines()]
        assert any(t["step"] == "streams" and "test_worker_cuda" in t["nodeid"] for t in tests)
    log = (out / "log.txt").read_text()
    for name in STEPS:
        assert f"step {name}" in log


def test_gpu_check_steps_runs_only_the_named_steps_under_their_given_limits(tmp_path):
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("KERNELBENCH", "CUDA_L1", "GPU_CHECK_DRY_LIMIT")}
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), str(out), "--steps", "env,cuda_l1",
                           "--limit", "env=7"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    by = {s["step"]: s for s in map(json.loads, (out / "steps.jsonl").read_text().splitlines())}
    assert list(by) == STEPS
    assert by["env"]["skipped"] is False and by["env"]["limit_s"] == 7
    # a named step whose data is missing still says why; an unnamed one says it was not asked for
    assert by["cuda_l1"]["skipped"] is True and "CUDA_L1" in by["cuda_l1"]["reason"]
    assert all(by[s]["reason"] == "not in --steps" for s in STEPS if s not in ("env", "cuda_l1"))


def test_a_step_killed_before_its_limit_says_so_and_not_that_it_timed_out(tmp_path):
    # what a step's python dies of (the OOM killer's SIGKILL, say) is not its limit: the 2026-11-30
    # lease read such a death as a time-out
    python = tmp_path / "python3"
    python.write_text("#!/bin/sh\nkill -KILL $$\n")
    python.chmod(0o755)
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), str(out), "--dry-run", "--steps", "env"],
                          capture_output=True, text=True, env=dict(os.environ, PYTHON=str(python)), timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    env = json.loads((out / "steps.jsonl").read_text().splitlines()[0])
    assert env["step"] == "env" and env["rc"] == 137 and env["timed_out"] is False
    assert env["reason"] == "ended by signal 9 before its limit"
    assert env["min_mem_available_gib"] > 0 and env["oom_kills"] == 0
    assert "=== step env ended by signal 9" in (out / "log.txt").read_text()


@pytest.mark.parametrize("args", [["--steps", "env,nope"], ["--limit", "nope=3"], ["--limit", "env"]])
def test_gpu_check_refuses_an_unknown_step_or_a_malformed_limit(tmp_path, args):
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), str(tmp_path / "out"), *args],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "gpu_check:" in done.stderr
    assert not (tmp_path / "out" / "steps.jsonl").exists()


def test_gpu_check_needs_an_output_folder():
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], capture_output=True, text=True)
    assert done.returncode == 2 and "usage" in done.stderr


@pytest.mark.parametrize("workers", [None, "2"], ids=["serial", "xdist"])
def test_plugin_writes_one_line_per_test_as_it_ends(tmp_path, workers):
    # gpu_check.sh runs the gpu tests under pytest-xdist where it is installed: still one line a test
    if workers:
        pytest.importorskip("xdist")
    (tmp_path / "test_some.py").write_text(
        "import pytest\n"
        "def test_ok(): pass\n"
        "def test_bad(): assert 1 == 2\n"
        "@pytest.mark.skip(reason='no device')\n"
        "def test_skip(): pass\n"
        "@pytest.mark.xfail(strict=True)\n"
        "def test_xf(): assert 0\n"
        "@pytest.fixture\n"
        "def boom(): raise RuntimeError('setup broke')\n"
        "def test_err(boom): pass\n")
    (tmp_path / "test_broken.py").write_text("import no_such_module_here\n")
    target = tmp_path / "tests.jsonl"
    env = dict(os.environ, GPU_CHECK_TESTS=str(target), GPU_CHECK_STEP="s1",
               PYTHONPATH=str(ROOT / "benchmarks"))
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "gpu_check_plugin", "-p", "no:cacheprovider",
                    *(["-n", workers] if workers else []),
                    "--continue-on-collection-errors", "-c", os.devnull, str(tmp_path)],
                   capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    lines = [json.loads(line) for line in target.read_text().splitlines()]
    rows = {r["nodeid"].split("::")[-1]: r for r in lines}
    assert len(lines) == len(rows)  # no test written twice
    assert {k: r["outcome"] for k, r in rows.items()} == {
        "test_ok": "passed", "test_bad": "failed", "test_skip": "skipped", "test_xf": "xfailed",
        "test_err": "error", "test_broken.py": "collection_error"}
    assert "no device" in rows["test_skip"]["message"] and "setup broke" in rows["test_err"]["message"]
    assert "no_such_module_here" in rows["test_broken.py"]["message"]
    assert all(r["step"] == "s1" for r in rows.values())


BLOCKER = '''
import importlib.abc, sys
class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("httpx", "vllm"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _Block())
'''


def _collect(tmp_path: Path, *marks: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "blk"), str(ROOT / "tests"), str(ROOT)]))
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "block_extras", "-p", "conftest", "-p",
                           "no:cacheprovider", "-c", os.devnull, "--collect-only", "-q", *marks, str(tmp_path / "t")],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)


def test_gpu_selection_skips_modules_whose_optional_extra_is_missing(tmp_path):
    """`pytest -m gpu` on a machine without vllm or httpx collects the rest; elsewhere it is an error."""
    (tmp_path / "blk").mkdir()
    (tmp_path / "blk" / "block_extras.py").write_text(BLOCKER)
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "test_needs_vllm.py").write_text("import vllm\ndef test_a(): pass\n")
    (tmp_path / "t" / "test_needs_httpx.py").write_text("from httpx import Client\ndef test_b(): pass\n")
    (tmp_path / "t" / "test_gpu_here.py").write_text("import pytest\n@pytest.mark.gpu\ndef test_c(): pass\n")
    (tmp_path / "t" / "test_broken.py").write_text("import not_an_extra_at_all\n")
    gpu = _collect(tmp_path, "-m", "gpu")
    assert "test_gpu_here.py::test_c" in gpu.stdout
    assert "ERROR collecting t/test_needs_vllm.py" not in gpu.stdout and "ERROR collecting t/test_needs_httpx.py" \
        not in gpu.stdout
    assert "1 error" in gpu.stdout and "not_an_extra_at_all" in gpu.stdout  # a missing non-extra stays an error
    (tmp_path / "t" / "test_broken.py").unlink()
    gpu = _collect(tmp_path, "-m", "gpu")
    assert gpu.returncode == 0, gpu.stdout[-2000:]
    fast = _collect(tmp_path, "-m", "not slow and not gpu")
    assert fast.returncode != 0 and "No module named 'vllm'" in fast.stdout
