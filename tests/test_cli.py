"""The command line: JSON shapes, exit codes, one-line errors, timeouts honoured.

Commands run in this process (`kernelrl.cli.main`, what `python -m kernelrl` calls after its
import), as a user's shell would see them: the exit status, stdout and stderr. One test starts the
real entry point in a fresh interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from judge_fixtures import QUICK_TIMING


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def run_cli(capsys, monkeypatch) -> Callable[..., Ran]:
    """run_cli(*args, env=...): the command's exit status and what it printed."""
    from kernelrl.cli import main

    def run(*args: str, env: dict[str, str] | None = None) -> Ran:
        with monkeypatch.context() as m:
            for k, v in (env or {}).items():
                m.setenv(k, v)
            capsys.readouterr()
            try:
                code = main(list(args))
            except SystemExit as e:  # argparse's usage errors
                code = e.code if isinstance(e.code, int) else 2
            out = capsys.readouterr()
        return Ran(returncode=code, stdout=out.out, stderr=out.err)

    return run


@pytest.fixture
def files(tmp_path: Path, tiny_task) -> dict[str, Path]:
    task = tiny_task.path
    same = tmp_path / "same.py"
    same.write_text(tiny_task.source.replace("class Model(", "class ModelNew("))
    loop = tmp_path / "loop.py"
    loop.write_text(tiny_task.source.replace("class Model(", "class ModelNew(").replace(
        "return torch.relu(x)", "while True:\n            pass\n        return torch.relu(x)"))
    broken = tmp_path / "broken.py"
    broken.write_text("import torch\nclass Nothing:\n    pass\n")
    answer = tmp_path / "answer.md"
    answer.write_text("Analysis: same program.\n```python\n" + same.read_text() + "```\n")
    return {"task": task, "same": same, "loop": loop, "broken": broken, "answer": answer}


def test_tasks_json_lists_name_and_level():
    out = subprocess.run([sys.executable, "-m", "kernelrl", "tasks", "--json"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0
    rows = json.loads(out.stdout)
    assert len(rows) >= 24 and all({"name", "level"} <= set(r) for r in rows)


def test_eval_json_prints_one_object_with_status_and_speedup(run_cli, files, cache_dir):
    out = run_cli("eval", *QUICK_TIMING, str(files["task"]), str(files["same"]), "--json", env={"KERNELRL_CACHE": str(cache_dir)})
    assert out.returncode == 0, out.stderr
    obj = json.loads(out.stdout)
    assert obj["status"] == "correct" and obj["speedup"] > 0


def test_eval_reads_code_from_an_llm_answer(run_cli, files, cache_dir):
    out = run_cli("eval", *QUICK_TIMING, str(files["task"]), str(files["answer"]), "--json", env={"KERNELRL_CACHE": str(cache_dir)})
    assert out.returncode == 0 and json.loads(out.stdout)["status"] == "correct"


def test_broken_candidate_is_a_compile_error_verdict_exit_zero(run_cli, files, cache_dir):
    out = run_cli("eval", *QUICK_TIMING, str(files["task"]), str(files["broken"]), "--json", env={"KERNELRL_CACHE": str(cache_dir)})
    assert out.returncode == 0
    obj = json.loads(out.stdout)
    assert obj["status"] == "compile_error" and "ModelNew" in obj["message"] and obj["speedup"] is None


@pytest.mark.parametrize("args", [
    ("eval", "no_such_task", "x.py"),
    ("eval", "level1/softmax", "/nonexistent/candidate.py"),
    ("eval", "/nonexistent/task.py", "/nonexistent/candidate.py"),
    ("tasks", "--suite", "no_such_suite"),
    ("report", "--db", "/nonexistent.db"),
])
def test_bad_invocations_exit_2_with_one_line(run_cli, args):
    out = run_cli(*args)
    assert out.returncode == 2
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("kernelrl: error:")


def test_endless_loop_returns_within_timeout(run_cli, files, cache_dir):
    t0 = time.monotonic()
    out = run_cli("eval", *QUICK_TIMING, str(files["task"]), str(files["loop"]), "--json", "--timeout", "5",
                  env={"KERNELRL_CACHE": str(cache_dir)})
    elapsed = time.monotonic() - t0
    assert out.returncode == 0
    assert json.loads(out.stdout)["status"] == "timeout"
    # the limit bounds the candidate's load and checks; the command's own start, two workers'
    # start and the reference add seconds (up to ~18 s were seen on two cores shared with other jobs)
    assert elapsed < 5 + 20


def test_observe_policy_turns_a_static_rejection_into_a_warning(run_cli, files, tmp_path: Path, cache_dir):
    # Reading the environment is refused under `open`; under `observe` static rules only warn and
    # the measurement decides. The same candidate, judged end to end by the command both ways.
    peek = tmp_path / "peek.py"
    peek.write_text("import os\n_HOME = os.environ.get('HOME')\n" + files["same"].read_text())
    verdicts = {}
    for policy in ("open", "observe"):
        out = run_cli("eval", *QUICK_TIMING, str(files["task"]), str(peek), "--json", "--policy", policy,
                      env={"KERNELRL_CACHE": str(cache_dir)})
        assert out.returncode == 0, out.stderr
        verdicts[policy] = json.loads(out.stdout)
    assert verdicts["open"]["status"] == "flagged"
    assert "environment_access" in verdicts["open"]["message"]
    assert verdicts["observe"]["status"] == "correct" and verdicts["observe"]["speedup"] > 0
    warned = {f["rule"] for f in verdicts["observe"]["findings"] if f["severity"] == "warn"}
    assert "environment_access" in warned


def test_eval_of_a_program_without_model_new_decides_before_any_worker_starts(tmp_path, capsys, monkeypatch):
    """Reading the source refuses it: the one-off evaluator starts no warm workers, the reference
    never loads, and the message is printed once."""
    import kernelrl.judge.evaluator as evaluator
    from kernelrl.cli import main

    started: list[int | None] = []
    real = evaluator.Evaluator.__init__

    def counting(self, config=None, *, warm_workers=None):
        started.append(warm_workers)
        real(self, config, warm_workers=warm_workers)

    monkeypatch.setattr(evaluator.Evaluator, "__init__", counting)
    path = tmp_path / "nomodel.py"
    path.write_text("import torch\n\n\nclass Foo(torch.nn.Module):\n    pass\n")
    assert main(["eval", "level1/softmax", str(path)]) == 0
    out = capsys.readouterr().out
    assert started == [0] and "compile_error" in out and out.count("defines no `ModelNew`") == 1
