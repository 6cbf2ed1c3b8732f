"""The reward server under the inputs of issue 32, measured from outside on loopback.

Starts `kernelrl serve` (the real evaluator, one CPU lane, a token, `--watch-db`) from a checkout
(`--root`, this one by default: give an older checkout to measure before a change) in a
subprocess, then, while polling `/healthz` every 50 ms:

- `body`: POSTs `/v1/evaluate` bodies of 16, 32 and 64 KB holding one unterminated string of
  escaped quotes (the pre-parse scan's worst case);
- `candidate`: submits candidates of 16, 32 and 64 KB whose C++ source opens comments and never
  closes them, and waits for their verdicts (the static checks' worst case);
- `login`: POSTs a 64 MiB form body without a length to `/watch/login`;
- `flood`: opens 300 connections that send half a request head and wait, against a server
  limited to 256 open files, and polls `/healthz` for 20 s.

Prints one line per measurement: the answer, its time, the worst `/healthz` latency meanwhile.
Bounded: at most 300 connections, each step under its own timeout.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

TOKEN = "a" * 40
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def serve(root: str, port: int, work: str) -> None:
    """The server (run in a subprocess): the checkout at `root`, its state in `work`."""
    sys.path[:0] = [root, os.path.join(root, "tests")]
    from kernelrl.judge.eval_config import TimingConfig
    from kernelrl.judge.evaluator import EvalConfig
    from kernelrl.serve.config import ServeConfig
    from kernelrl.serve.server import RewardServer
    from watch_fixtures import fill_search_run

    w = Path(work)
    w.mkdir(parents=True, exist_ok=True)
    fill_search_run(w / "run.db")
    tokens = w / "tokens.txt"
    tokens.write_text(f"bench {TOKEN}\n")
    tokens.chmod(0o600)
    timing = TimingConfig(min_rounds=5, max_rounds=40, max_timing_s=2.0, warmup_calls=2, min_spot_checks=2)
    config = ServeConfig(port=port, db_path=w / "serve.db", token_file=tokens, watch_db=w / "run.db",
                         eval=EvalConfig(cache_dir=w / "cache", timeout_s=120, timing=timing))
    RewardServer(config, announce=lambda m: print(m, flush=True)).run()


def worst_healthz_during(url: str, fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """(fn's result, its time, the worst /healthz latency while it ran)."""
    stop, latencies = threading.Event(), []

    def poll() -> None:
        while not stop.is_set():
            t = time.monotonic()
            try:
                httpx.get(url + "/healthz", timeout=120)
                latencies.append(time.monotonic() - t)
            except httpx.HTTPError:
                latencies.append(float("inf"))
            time.sleep(0.05)

    thread = threading.Thread(target=poll)
    thread.start()
    t0 = time.monotonic()
    try:
        result = fn()
    finally:
        elapsed = time.monotonic() - t0
        stop.set()
        thread.join()
    return result, elapsed, max(latencies, default=0.0)


def body(url: str) -> None:
    for kb in (16, 32, 64):
        data = b'{"items": [{"task": "' + b'\\"' * (kb * 512)

        def post(d: bytes = data) -> httpx.Response:
            return httpx.post(url + "/v1/evaluate", content=d, headers={**AUTH, "Content-Type": "application/json"},
                              timeout=600)

        r, el, worst = worst_healthz_during(url, post)
        print(f"body {kb} KB: {r.status_code} in {el:.3f} s; worst /healthz {worst:.3f} s", flush=True)


def candidate(url: str) -> None:
    for kb in (16, 32, 64):
        source = ('import torch\nfrom torch.utils.cpp_extension import load_inline\nsrc = """#include <torch/extension.h>\n'
                  + "/*x" * (kb * 1024 // 3) + '"""\n\nclass ModelNew(torch.nn.Module):\n'
                  "    def forward(self, x):\n        return torch.nn.functional.gelu(x)\n")

        def judge(s: str = source) -> dict[str, Any]:
            r = httpx.post(url + "/v1/evaluate", json={"items": [{"task": "level1/gelu", "candidate": s}]},
                           headers=AUTH, timeout=600)
            job = r.json()["job"]
            for _ in range(20):
                reply: dict[str, Any] = httpx.get(f"{url}/v1/jobs/{job}?wait=30", headers=AUTH, timeout=600).json()
                if reply["state"] in ("done", "failed"):
                    break
            return reply

        reply, el, worst = worst_healthz_during(url, judge)
        status = ((reply.get("results") or [None])[0] or {}).get("status")
        print(f"candidate {kb} KB: {reply['state']} ({status}) in {el:.2f} s; worst /healthz {worst:.3f} s", flush=True)


def login(url: str, pid: int) -> None:
    def chunks() -> Any:
        yield b"token="
        for _ in range(64):
            yield b"x" * (1 << 20)

    t0 = time.monotonic()
    r = httpx.post(url + "/watch/login", content=chunks(), timeout=120, headers={
        "Content-Type": "application/x-www-form-urlencoded", "Origin": url, "Sec-Fetch-Site": "same-origin"})
    peak = Path(f"/proc/{pid}/status").read_text().split("VmHWM:")[1].split()[0]
    print(f"login 64 MiB body: {r.status_code} in {time.monotonic() - t0:.3f} s; server peak RSS "
          f"{int(peak) // 1024} MiB", flush=True)


def flood(url: str, port: int) -> None:
    socks = []
    for _ in range(300):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHo")
            socks.append(s)
        except OSError:
            pass
    answered, worst, tries = 0, 0.0, 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < 20:
        tries += 1
        t = time.monotonic()
        try:
            httpx.get(url + "/healthz", timeout=5)
            answered += 1
            worst = max(worst, time.monotonic() - t)
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    closed = 0
    for s in socks:
        s.settimeout(0.01)
        try:
            closed += s.recv(10) == b""
        except (ConnectionResetError, BrokenPipeError):
            closed += 1
        except OSError:
            pass
        s.close()
    print(f"flood of {len(socks)} slow connections (server: 256 open files): /healthz {answered}/{tries} answered "
          f"in 20 s, worst {worst:.3f} s; {closed} of them closed by the server", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", nargs="*", help="body, candidate, login, flood (default: all)")
    p.add_argument("--root", default=str(Path(__file__).resolve().parent.parent), help="the checkout to serve")
    p.add_argument("--port", type=int, default=18300)
    p.add_argument("--work", default="/tmp/kernelrl-hostile-inputs")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        serve(args.root, args.port, args.work)
        return 0
    unknown = set(args.what) - {"body", "candidate", "login", "flood"}
    if unknown:
        p.error(f"unknown measurement(s): {', '.join(sorted(unknown))}")
    for what in args.what or ["body", "candidate", "login", "flood"]:
        subprocess.run(["rm", "-rf", args.work], check=True)
        limit = "ulimit -n 256; " if what == "flood" else ""
        command = (f"{limit}exec {sys.executable} {Path(__file__).resolve()} --serve --root {args.root} "
                   f"--port {args.port} --work {args.work}")
        with open(f"{args.work}.log", "w") as log:
            server = subprocess.Popen(["bash", "-c", command], stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{args.port}"
        try:
            for _ in range(1200):
                if server.poll() is not None:
                    raise SystemExit(f"the server stopped: see {args.work}.log")
                try:
                    httpx.get(url + "/healthz", timeout=1)
                    break
                except httpx.HTTPError:
                    time.sleep(0.1)
            if what == "body":
                body(url)
            elif what == "candidate":
                candidate(url)
            elif what == "login":
                login(url, server.pid)
            else:
                flood(url, args.port)
        finally:
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
