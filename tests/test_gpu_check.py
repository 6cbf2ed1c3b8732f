"""`benchmarks/gpu_check.sh` on a CPU. The plan (`--dry-run`) fits its budget and says what each step
runs; a rehearsal (`--rehearse`) starts every step, writes its line and stops within its own limit,
writes nothing outside OUT and its cache, and keeps at most 8 files; absent user data is a clear
skip; `--prepare` copies the user's data into the folder a lease carries and refuses data that
lacks what the steps name. And the pytest plugin behind tests.jsonl writes one line per test with
its outcome, as each test ends.

A rehearsal's figures mean nothing (tiny CPU settings, steps cut by a short limit); what is tested
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
SCRIPT = str(ROOT / "benchmarks" / "gpu_check.sh")
PLAN = ["env", "floor", "batch", "spread", "level1", "hacks"]
STEPS = [*PLAN, "workers", "aa", "kernelbench", "throughput", "gpu_tests"]
NAMED = ["level1/28", "level1/48", "level1/13", "level2/54", "level1/3", "level1/32", "level1/23", "level1/42",
         "level1/88"]  # the entries of CUDA-L1's file the steps name
LIMIT = 6  # seconds a step may run in a rehearsal: each starts an interpreter that imports torch, most are cut
KILL_AFTER = 5


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("KERNELBENCH", "CUDA_L1", "KERNELRL_CACHE", "GPU_CHECK_DRY_LIMIT")}
    return {**env, **extra}


def _published(path: Path, names: list[str]) -> Path:
    """A stand-in for CUDA-L1's published file (JSON Lines) with an entry for each of `names`."""
    ref = (ROOT / "tests" / "fixtures" / "tasks" / "elementwise_silu.py").read_text()
    code = (ROOT / "tests" / "fixtures" / "control" / "optional_import.py").read_text()
    rows = [{"level_id": int(n.split("/")[0][5:]), "task_id": int(n.split("/")[1]), "ref_code": ref, "custom_code": code,
             "score_default": 1.5} for n in names]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _no_data(tmp_path: Path) -> Path:
    """An empty data folder: what a checkout without `--prepare`'s .gpu-data has (a prepared one is found by default)."""
    (tmp_path / "no-data").mkdir(exist_ok=True)
    return tmp_path / "no-data"


def test_the_plan_fits_its_budget_and_says_what_each_step_runs(tmp_path):
    done = subprocess.run(["bash", SCRIPT, str(tmp_path / "out"), "--dry-run",
                           "--cuda-l1", str(_published(tmp_path / "h100.json", NAMED))],
                          capture_output=True, text=True, env=_env(), timeout=60)
    assert done.returncode == 0, done.stderr
    lines = {line.split()[0]: line for line in done.stdout.splitlines() if line.startswith("  ")}
    assert list(lines) == STEPS
    limits = [int(lines[name].split()[1]) for name in PLAN]
    assert sum(limits) <= 420 and "eval_throughput.py --cuda-l1" in lines["batch"]
    assert all("optional" in lines[name] for name in STEPS if name not in PLAN)
    assert f"add to {sum(limits)} s of a 420 s budget" in done.stdout
    assert not (tmp_path / "out").exists()  # a plan runs and writes nothing


@pytest.mark.parametrize("args", [["--budget", "300"], ["--limit", "batch=400"]])
def test_a_plan_over_its_budget_is_refused(tmp_path, args):
    done = subprocess.run(["bash", SCRIPT, str(tmp_path / "out"), "--dry-run", *args,
                           "--cuda-l1", str(_published(tmp_path / "h100.json", NAMED))],
                          capture_output=True, text=True, env=_env(), timeout=60)
    assert done.returncode == 3 and "exceed the budget" in done.stderr


def test_a_plan_without_data_skips_what_needs_it_and_counts_only_what_runs(tmp_path):
    done = subprocess.run(["bash", SCRIPT, str(tmp_path / "out"), "--dry-run", "--data", str(_no_data(tmp_path))],
                          capture_output=True, text=True,
                          env=_env(), timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = {line.split()[0]: line for line in done.stdout.splitlines() if line.startswith("  ")}
    assert "skipped: no CUDA-L1 kernels" in lines["batch"] and "skipped" in lines["level1"]
    assert "skipped" not in lines["env"]


def test_prepare_copies_the_data_a_lease_carries_and_refuses_data_without_the_named_kernels(tmp_path):
    data = tmp_path / "data"
    done = subprocess.run(["bash", SCRIPT, "--prepare", str(data), "--cuda-l1",
                           str(_published(tmp_path / "h100.json", NAMED))], capture_output=True, text=True,
                          env=_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    assert (data / "h100.json").read_text() == (tmp_path / "h100.json").read_text()
    short = subprocess.run(["bash", SCRIPT, "--prepare", str(tmp_path / "d2"), "--cuda-l1",
                            str(_published(tmp_path / "short.json", NAMED[:3]))], capture_output=True, text=True,
                           env=_env(), timeout=120)
    assert short.returncode == 2 and "level2/54" in short.stderr and "level1/13" not in short.stderr


@pytest.mark.slow  # 23 s: every step started on the CPU; the plan and its budget are checked in the fast suite
def test_a_rehearsal_starts_every_step_stops_in_time_and_writes_only_under_out(tmp_path):
    out, cache, tmp = tmp_path / "out", tmp_path / "cache", tmp_path / "tmp"
    tmp.mkdir()
    data = tmp_path / "data"
    data.mkdir()
    _published(data / "h100.json", NAMED)
    env = _env(GPU_CHECK_DRY_LIMIT=str(LIMIT), TMPDIR=str(tmp))
    t0 = time.monotonic()
    done = subprocess.run(["bash", SCRIPT, str(out), "--rehearse", "--data", str(data), "--cache", str(cache)],
                          capture_output=True, text=True, env=env, timeout=len(PLAN) * (LIMIT + KILL_AFTER) + 60)
    wall = time.monotonic() - t0
    assert done.returncode == 0, done.stderr[-2000:]
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == STEPS
    by = {s["step"]: s for s in steps}
    for s in steps:
        assert s["seconds"] <= s["limit_s"] + KILL_AFTER + 1, s
    for name in PLAN:
        assert by[name]["skipped"] is False and by[name]["limit_s"] == LIMIT, by[name]
    assert all(by[name]["reason"] == "optional, not in --steps" for name in STEPS if name not in PLAN)
    # on a loaded machine a step may be cut by its short limit; one that ended wrote its file
    assert by["env"]["rc"] in (0, 124) and by["floor"]["rc"] in (0, 124)
    assert wall < len(PLAN) * (LIMIT + KILL_AFTER) + 30
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and {"steps.jsonl", "log.txt"} <= set(files) and ".work" not in files
    assert list(tmp.iterdir()) == []  # the judge's and every tool's temporary files went under OUT
    if by["env"]["rc"] == 0:
        assert "# torch:" in (out / "env.txt").read_text()
    if by["floor"]["rc"] == 0:
        floors = {json.loads(line)["measure"] for line in (out / "floor.jsonl").read_text().splitlines()}
        assert {"sync", "python_call", "empty_kernel"} <= floors
    log = (out / "log.txt").read_text()
    for name in PLAN:
        assert f"step {name}" in log
    assert "eval_throughput.py --cuda-l1" in log and str(data / "h100.json") in log


def test_gpu_check_steps_runs_only_the_named_steps_under_their_given_limits(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(["bash", SCRIPT, str(out), "--steps", "env,level1", "--limit", "env=7", "--data",
                           str(_no_data(tmp_path)),
                           "--cache", str(tmp_path / "cache")], capture_output=True, text=True, env=_env(), timeout=120,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    by = {s["step"]: s for s in map(json.loads, (out / "steps.jsonl").read_text().splitlines())}
    assert list(by) == STEPS
    assert by["env"]["skipped"] is False and by["env"]["limit_s"] == 7
    # a named step whose data is missing still says why; an unnamed one says it was not asked for
    assert by["level1"]["skipped"] is True and "CUDA_L1" in by["level1"]["reason"]
    assert all(by[s]["reason"] in ("not in --steps", "optional, not in --steps") for s in STEPS if s not in ("env", "level1"))


def test_a_step_killed_before_its_limit_says_so_and_not_that_it_timed_out(tmp_path):
    # what a step's python dies of (the OOM killer's SIGKILL, say) is not its limit: the 2026-11-30
    # lease read such a death as a time-out
    python = tmp_path / "python3"
    python.write_text("#!/bin/sh\nkill -KILL $$\n")
    python.chmod(0o755)
    out = tmp_path / "out"
    done = subprocess.run(["bash", SCRIPT, str(out), "--rehearse", "--steps", "env", "--cache", str(tmp_path / "c")],
                          capture_output=True, text=True, env=_env(PYTHON=str(python)), timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    env = json.loads((out / "steps.jsonl").read_text().splitlines()[0])
    assert env["step"] == "env" and env["rc"] == 137 and env["timed_out"] is False
    assert env["reason"] == "ended by signal 9 before its limit"
    assert env["min_mem_available_gib"] > 0 and env["oom_kills"] == 0
    assert "=== step env ended by signal 9" in (out / "log.txt").read_text()


@pytest.mark.parametrize("args", [["--steps", "env,nope"], ["--limit", "nope=3"], ["--limit", "env"],
                                  ["--budget", "soon"]])
def test_gpu_check_refuses_an_unknown_step_or_a_malformed_limit(tmp_path, args):
    done = subprocess.run(["bash", SCRIPT, str(tmp_path / "out"), *args], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "gpu_check:" in done.stderr
    assert not (tmp_path / "out" / "steps.jsonl").exists()


def test_gpu_check_needs_an_output_folder():
    done = subprocess.run(["bash", SCRIPT], capture_output=True, text=True)
    assert done.returncode == 2 and "usage" in done.stderr


def test_the_realistic_batch_is_eight_candidates_a_task_of_every_kind_and_one_hang(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import eval_throughput
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    cuda = '#include <torch/extension.h>\n__global__ void k() {}\n'
    path = _published(tmp_path / "h100.json", NAMED[:4])
    rows = [dict(json.loads(line), custom_code=f"SRC = {cuda!r}\n") for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    items = eval_throughput.kernelbench_batch(path, NAMED[:4])
    assert len(items) == 32 and [i.kind for i in items].count("hangs") == 1
    for k in range(4):
        group = items[8 * k:8 * (k + 1)]
        assert len({i.task.name for i in group}) == 1 and len({i.candidate.source for i in group}) == 8
        assert {i.candidate.origin.split(":")[1] for i in group} >= {"cuda", "cuda-2", "triton", "inference_mode",
                                                                      "renamed", "incorrect", "raises"}
    triton = next(i.candidate for i in items if i.candidate.origin.endswith(":triton"))
    compile(triton.source, "triton", "exec")
    assert "@triton.jit" in triton.source and "class ModelNew(_Reference)" in triton.source
    with pytest.raises(eval_throughput.AuditInputError, match="level1/1"):
        eval_throughput.kernelbench_batch(path, ["level1/1"])


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
