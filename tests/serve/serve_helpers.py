"""Helpers for the reward server tests: candidates for the tiny task, a fast client, a fake
evaluator backend, and a way to run a server with it in a subprocess
(`python tests/serve/serve_helpers.py --db ... --port ...`), for the SIGKILL tests.

The fake backend has the backend signature (`evaluate_batch(items, *, size, policy)`) and makes
its verdict from the candidate alone (a made-up speedup from the candidate's hash, so a result
can be matched to its candidate), after `delay_s` per item. It can log every evaluation to a
file (one line per item: process id and candidate hash), so tests can count evaluations across
server processes.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kernelrl.candidate import Candidate, source_hash
from kernelrl.judge.harness.profile import TaskProfile
from kernelrl.result import EvalResult, Status
from kernelrl.tasks.task import TaskError

TOKEN = "test-token-5b1f0c9a2e7d4c13b8f60e95a1d27c4f"  # 32+ characters, as the server requires


def write_token_file(path: Path, text: str = TOKEN) -> Path:
    """A token file as the server wants it: private (mode 0600)."""
    path.write_text(text + "\n")
    path.chmod(0o600)
    return path

# A candidate that is right for the root conftest's tiny task, and one that is wrong (drops the relu).
TINY_CORRECT = """
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x):
        return torch.relu(x) * 2.0 + self.bias
"""
TINY_WRONG = TINY_CORRECT.replace("torch.relu(x) * 2.0", "x * 2.0")


def fast_client(url: str, **settings: Any) -> Any:
    """A client with short backoffs, for servers on this machine."""
    from kernelrl.backends.client import ClientConfig, RewardClient

    token = settings.pop("token", None)
    config = ClientConfig(**{"backoff_s": 0.05, "backoff_max_s": 0.5, "wait_s": 5.0, **settings})
    return RewardClient(url, token=token, config=config)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """A server in a subprocess on a known loopback port (so it can be SIGKILLed and restarted)."""

    def __init__(self, args: Sequence[str], *, port: int, log: Path, env: dict[str, str] | None = None) -> None:
        import subprocess

        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        root = Path(__file__).resolve().parents[2]
        # A script's own folder leads sys.path, not the working directory: without this, the
        # server would import the installed kernelrl rather than this checkout's.
        env = dict(os.environ if env is None else env)
        env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [env.get("PYTHONPATH")])])
        with open(log, "ab") as out:
            self.proc = subprocess.Popen([sys.executable, *args], stdout=out, stderr=subprocess.STDOUT, env=env,
                                         cwd=root)

    def wait_healthy(self, timeout_s: float = 60.0) -> ServerProcess:
        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited ({self.proc.returncode}): {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"the server did not come up in {timeout_s} s: {self.log.read_text()[-2000:]}")

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)


def fake_profile(task_name: str, size: object = "small") -> TaskProfile:
    return TaskProfile(task=task_name, size=str(size), constants={"n": 4}, inputs=["float32[4]"], init_args=[],
                       outputs=["float32[4]"], flops=4, input_bytes=16, output_bytes=16, param_bytes=0,
                       dtype="float32")


def fake_result(task_name: str, candidate: str, size: object = "small", policy: object = "open") -> EvalResult:
    h = source_hash(candidate)
    return EvalResult(task=task_name, status=Status.CORRECT, message=f"fake {h}", speedup=1.0 + int(h[:4], 16) / 65536,
                      candidate_hash=h, size=str(size), policy=str(policy))


class FakeBackend:
    def __init__(self, *, delay_s: float = 0.0, capacity: int = 2, log_path: Path | None = None,
                 gate: threading.Event | None = None, profile_gate: threading.Event | None = None) -> None:
        self.delay_s = delay_s
        self.capacity = capacity
        self.log_path = log_path
        self.gate = gate  # when given, every batch waits for it
        self.profile_gate = profile_gate  # when given, every profile waits for it
        self.evaluated: list[str] = []  # candidate hashes, in order
        self.profiled: list[str] = []  # task names, in order
        self.batches = 0
        self._lock = threading.Lock()

    def profile(self, task: Any, *, size: object = None) -> TaskProfile:
        """A made-up profile; a task whose source holds 'broken' fails like a broken reference."""
        if self.profile_gate is not None:
            self.profile_gate.wait()
        with self._lock:
            self.profiled.append(task.name)
        if "broken" in task.source:
            raise TaskError("Traceback ...\nRuntimeError: broken task")
        return fake_profile(task.name, size or "small")

    def evaluate_batch(self, items: Sequence[tuple[object, Candidate | str]], *, size: object = None,
                       policy: object = None) -> list[EvalResult]:
        if self.gate is not None:
            self.gate.wait()
        time.sleep(self.delay_s * len(items))
        out = []
        for task, cand in items:
            source = cand.source if isinstance(cand, Candidate) else cand
            out.append(fake_result(task.name, source, size or "small", policy or "open"))
        with self._lock:
            self.batches += 1
            self.evaluated.extend(r.candidate_hash for r in out)
            if self.log_path is not None:
                with open(self.log_path, "a") as f:
                    f.write("".join(f"{os.getpid()} {r.candidate_hash}\n" for r in out))
                    f.flush()
                    os.fsync(f.fileno())
        return out

    def close(self) -> None:
        pass


COMPILER_LINE = "main.cpp:4:9: error: 'plus_one' was not declared in this scope"


class ScriptedBackend(FakeBackend):
    """FakeBackend's verdicts, except: a candidate marked BUILD_FAILS does not build, one marked
    WRONG is incorrect."""

    def evaluate_batch(self, items: Sequence[tuple[object, Candidate | str]], *, size: object = None,
                       policy: object = None) -> list[EvalResult]:
        out = super().evaluate_batch(items, size=size, policy=policy)
        for i, (_, cand) in enumerate(items):
            source = cand.source if isinstance(cand, Candidate) else cand
            if "BUILD_FAILS" in source:
                out[i] = EvalResult(task=out[i].task, status=Status.COMPILE_ERROR, message="candidate does not build",
                                    errors=[f"[1/2] c++ -c main.cpp\n{COMPILER_LINE}\nninja: build stopped"],
                                    candidate_hash=out[i].candidate_hash)
            elif "WRONG" in source:
                out[i] = EvalResult(task=out[i].task, status=Status.INCORRECT, candidate_hash=out[i].candidate_hash,
                                    message="output 0 differs on input set 1 (plain): 4 of 4 values",
                                    max_abs_err=1.0, max_rel_err=0.5)
        return out


def main(argv: Sequence[str] | None = None) -> int:
    from kernelrl.serve.config import ServeConfig
    from kernelrl.serve.server import RewardServer

    p = argparse.ArgumentParser()
    p.add_argument("--db", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--delay", type=float, default=0.2)
    p.add_argument("--log", required=True)
    p.add_argument("--capacity", type=int, default=1)
    args = p.parse_args(argv)
    config = ServeConfig(port=args.port, db_path=Path(args.db))
    backend = FakeBackend(delay_s=args.delay, capacity=args.capacity, log_path=Path(args.log))
    RewardServer(config, backend=backend, announce=lambda line: print(line, flush=True)).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
