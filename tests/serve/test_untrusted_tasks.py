"""Task sources sent by clients are code from outside: they run only in the evaluator's sandboxed
workers. A task whose module body or get_inputs() hangs, crashes or reads the server's
environment ends with a task_error result, no secret comes back, and the server keeps serving.

The server runs as `kernelrl serve` in a subprocess, with a secret in its environment, judging
through the real evaluator.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from serve_helpers import TOKEN, ServerProcess, fast_client, free_port, write_token_file

from kernelrl.result import Status
from kernelrl.tasks.task import Task

SECRET_NAME = "KERNELRL_SERVE_TEST_SECRET"

TAIL = '''
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2.0


def get_inputs():
    return [torch.randn(8, 16)]


def get_init_inputs():
    return []
'''

CANDIDATE = """
import torch


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2.0
"""

# Looks for the secret everywhere a task could: its own environment, and every process's
# environment and command line it can read through /proc; prints what it found and raises it.
SNOOP = f'''
import os


def snoop():
    found = [os.environ.get("{SECRET_NAME}", "")]
    for pid in os.listdir("/proc"):
        for part in ("environ", "cmdline"):
            try:
                with open(f"/proc/{{pid}}/{{part}}", "rb") as f:
                    text = f.read().decode(errors="replace")
            except OSError:
                continue
            found += [w for w in text.replace("\\0", " ").split() if "SECRET" in w or "token" in w]
            for w in text.replace("\\0", " ").split():
                if w.endswith("token.txt") and os.path.exists(w):
                    found.append(open(w).read())
    print("snooped:", found, flush=True)
    raise RuntimeError("snooped: " + repr(found))
'''


def hostile(kind: str) -> str:
    if kind == "body_crash":
        return "import ctypes\nctypes.string_at(0)\n" + TAIL
    if kind == "inputs_crash":
        return TAIL.replace("    return [torch.randn(8, 16)]", "    import os\n    os._exit(3)")
    if kind == "body_env":
        return SNOOP + "\nsnoop()\n" + TAIL
    if kind == "inputs_env":
        return SNOOP + TAIL.replace("    return [torch.randn(8, 16)]", "    snoop()")
    if kind == "body_hang":
        return "import time\nwhile True:\n    time.sleep(0.1)\n" + TAIL
    if kind == "inputs_hang":
        return TAIL.replace("    return [torch.randn(8, 16)]", "    while True:\n        pass")
    raise ValueError(kind)


@pytest.fixture(scope="module")
def cli_server(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[tuple[ServerProcess, str]]:
    root = tmp_path_factory.mktemp("untrusted")
    write_token_file(root / "token.txt")
    (root / "serve.toml").write_text(f"""
[eval]
timeout_s = 12.0
cache_dir = "{cache_dir}"

[eval.timing]
min_rounds = 5
max_rounds = 40
max_timing_s = 2.0
warmup_calls = 2
min_spot_checks = 2
""")
    secret = "s3cr3t-" + secrets.token_hex(8)
    port = free_port()
    env = {**os.environ, SECRET_NAME: secret}
    server = ServerProcess(["-m", "kernelrl", "serve", "--port", str(port), "--db", str(root / "serve.db"),
                            "--token-file", str(root / "token.txt"), "--config", str(root / "serve.toml")],
                           port=port, log=root / "server.out", env=env).wait_healthy()
    yield server, secret
    server.kill()


def judge_hostile(cli_server: tuple[ServerProcess, str], kinds: list[str]) -> None:
    server, secret = cli_server
    client = fast_client(server.url, token=TOKEN, wait_s=10.0)
    tasks = [Task(name=f"hostile/{k}", source=hostile(k)) for k in kinds]
    results = client.evaluate_batch([(t, CANDIDATE) for t in tasks])
    for kind, res in zip(kinds, results):
        assert res.status is Status.TASK_ERROR, (kind, res.status, res.message)
        text = json.dumps(res.to_dict())
        assert secret not in text and TOKEN not in text, kind
    # The server is alive and still judges: a plain task after the hostile ones.
    plain = Task(name="plain", source=TAIL)
    (res,) = client.evaluate_batch([(plain, CANDIDATE)])
    assert res.status is Status.CORRECT, res.message
    assert server.proc.poll() is None
    assert secret not in server.log.read_text()


def test_the_snooper_finds_a_secret_it_can_see(tmp_path: Path) -> None:
    """The snooping task is able to leak: run where the secret is visible, its error shows it."""
    import subprocess
    import sys

    write_token_file(tmp_path / "token.txt")
    done = subprocess.run([sys.executable, "-c", hostile("body_env"), str(tmp_path / "token.txt")], check=False,
                          capture_output=True, text=True, env={**os.environ, SECRET_NAME: "visible-secret"}, timeout=60)
    assert done.returncode != 0 and "visible-secret" in done.stderr and TOKEN in done.stderr


def test_crashing_and_snooping_tasks_end_in_task_error(cli_server) -> None:
    judge_hostile(cli_server, ["body_crash", "inputs_crash", "body_env", "inputs_env"])


@pytest.mark.slow  # two evaluator timeouts (12 s each) and a plain evaluation: about 30 s
def test_hanging_tasks_end_in_task_error(cli_server) -> None:
    judge_hostile(cli_server, ["body_hang", "inputs_hang"])
