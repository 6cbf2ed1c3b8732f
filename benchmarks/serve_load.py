"""Load on the reward server over loopback: N clients, each submitting batches and waiting for them.

Prints throughput (evaluations/s and /hour, batches/s), batch latency percentiles (submit to
last result, as a trainer sees it), losses (batches that failed, results missing or for the
wrong candidate), the client retries by reason, and the server's own counters from /metrics.

Backends:
- `fake` (default): the server in this process with a backend that sleeps `--eval-ms` per item
  on each of `--lanes` lanes and returns a made-up verdict; what is measured is the server
  (HTTP, SQLite job store, dispatch, long polls), against the ideal time items x eval-ms / lanes;
- `evaluator`: the server in this process with the real evaluator on one CPU lane, judging the
  tiny relu task (quick timing settings): real verdicts, a few per second at best on a CPU;
- `--url URL [--token-file F]`: an external server (`kernelrl serve ...`), sent the same tiny task.

Bounded: `--clients` x `--batches` x `--items`, and no batch starts after `--time-limit` seconds.

`--profiles N` (fake backend) then sends N profile requests at once, each costing `--profile-ms`
on a lane, and times `GET /v1/jobs/ID` every 50 ms while they drain: profiles go through the
job queue, so the status of a job must stay fast however many are waiting.

Usage: python benchmarks/serve_load.py [--clients 8] [--batches 25] [--items 4] [--eval-ms 20] [--lanes 2]
                                      [--profiles 40 --profile-ms 500]
Numbers depend on the machine and its load; compare figures from one run.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from kernelrl.backends.api import ItemIn, wire_item
from kernelrl.backends.client import ClientConfig, RewardClient
from kernelrl.candidate import Candidate, source_hash
from kernelrl.judge.harness.profile import TaskProfile
from kernelrl.result import EvalResult, Status
from kernelrl.tasks.task import Task
from kernelrl.web.tokens import client_token

TASK = Task(name="bench/relu_scale", source='''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2.0


def get_inputs():
    return [torch.randn(64, 256)]


def get_init_inputs():
    return []
''')

CANDIDATE = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2.0
'''


class SleepBackend:
    """Costs `eval_s` per item, `lanes` batches at once; verdicts made up (correct, 1x)."""

    def __init__(self, eval_s: float, lanes: int, profile_s: float = 0.0) -> None:
        self.eval_s = eval_s
        self.capacity = lanes
        self.profile_s = profile_s

    def profile(self, task: Task, *, size: object = None) -> TaskProfile:
        time.sleep(self.profile_s)
        return TaskProfile(task=task.name, size=str(size or "small"), constants={}, inputs=["float32[64, 256]"],
                           init_args=[], outputs=["float32[64, 256]"], flops=None, input_bytes=65536,
                           output_bytes=65536, param_bytes=0, dtype="float32")

    def evaluate_batch(self, items: Sequence[tuple[Task, Candidate | str]], *, size: object = None,
                       policy: object = None) -> list[EvalResult]:
        time.sleep(self.eval_s * len(items))
        out = []
        for task, cand in items:
            source = cand.source if isinstance(cand, Candidate) else cand
            out.append(EvalResult(task=task.name, status=Status.CORRECT, message="made up", speedup=1.0,
                                  candidate_hash=source_hash(source)))
        return out

    def close(self) -> None:
        pass


def percentile(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


def run_clients(url: str, token: str | None, args: argparse.Namespace) -> dict:
    latencies: list[float] = []
    outcome: Counter[str] = Counter()
    retried: Counter[str] = Counter()
    lock = threading.Lock()
    stop_at = time.monotonic() + args.time_limit

    def client_loop(c: int) -> None:
        client = RewardClient(url, token=token, config=ClientConfig(wait_s=10.0, backoff_s=0.1, backoff_max_s=5.0))
        try:
            for b in range(args.batches):
                if time.monotonic() > stop_at:
                    with lock:
                        outcome["not_started"] += 1
                    continue
                cands = [f"{CANDIDATE}\n# client {c} batch {b} item {i}\n" for i in range(args.items)]
                t0 = time.monotonic()
                try:
                    results = client.evaluate_batch([(TASK, cand) for cand in cands])
                except Exception as e:  # noqa: BLE001 - a failed request is counted, the load goes on
                    with lock:
                        outcome["failed"] += 1
                        outcome["lost_items"] += len(cands)
                    print(f"client {c} batch {b}: {type(e).__name__}: {e}", file=sys.stderr)
                    continue
                dt = time.monotonic() - t0
                wrong = sum(1 for cand, r in zip(cands, results) if r.candidate_hash != source_hash(cand))
                wrong += len(cands) - len(results)
                with lock:
                    latencies.append(dt)
                    outcome["done"] += 1
                    outcome["items"] += len(results)
                    outcome["lost_items"] += wrong
        finally:
            with lock:
                retried.update(client.retried)
            client.close()

    t0 = time.monotonic()
    threads = [threading.Thread(target=client_loop, args=(c,)) for c in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"wall": time.monotonic() - t0, "latencies": latencies, "outcome": outcome, "retried": retried}


def profile_storm(url: str, token: str | None, job_id: str, n: int) -> dict:
    """`n` clients ask for a profile at once; job status is timed every 50 ms until they are answered."""
    statuses: list[float] = []
    failures: list[str] = []
    client = RewardClient(url, token=token, config=ClientConfig(wait_s=10.0))

    def ask(i: int) -> None:
        try:
            client.profile(Task(name=f"bench/profile-{i}", source=TASK.source))
        except Exception as e:  # noqa: BLE001 - counted and printed, the storm goes on
            failures.append(f"{type(e).__name__}: {e}")

    t0 = time.monotonic()
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    try:
        while any(t.is_alive() for t in threads):
            s0 = time.monotonic()
            client.job(job_id)
            statuses.append(time.monotonic() - s0)
            time.sleep(0.05)
    finally:
        for t in threads:
            t.join()
        client.close()
    return {"wall": time.monotonic() - t0, "statuses": statuses, "failures": failures}


def server_counters(url: str, token: str | None) -> str:
    client = RewardClient(url, token=token)
    try:
        text = client.metrics()
    finally:
        client.close()
    keep = [line for line in text.splitlines() if not line.startswith("#") and
            re.match(r"kernelrl_serve_(evaluations_total|rejected_total|job_retries_total)", line) and
            not line.endswith(" 0")]
    return "\n".join(f"  {line}" for line in keep)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--batches", type=int, default=25, help="per client")
    p.add_argument("--items", type=int, default=4, help="per batch")
    p.add_argument("--backend", choices=("fake", "evaluator"), default="fake")
    p.add_argument("--eval-ms", type=float, default=20.0, help="fake backend: cost of one evaluation")
    p.add_argument("--lanes", type=int, default=2, help="fake backend: batches evaluated at once")
    p.add_argument("--queue-limit", type=int, default=4096)
    p.add_argument("--time-limit", type=float, default=300.0, help="no batch starts after this many seconds")
    p.add_argument("--url", default=None, help="an external server instead of one in this process")
    p.add_argument("--token-file", default=None)
    p.add_argument("--profiles", type=int, default=0, help="then this many profile requests at once (fake backend)")
    p.add_argument("--profile-ms", type=float, default=500.0, help="fake backend: cost of one profile")
    args = p.parse_args(argv)
    if min(args.clients, args.batches, args.items, args.lanes) < 1 or args.profiles < 0:
        p.error("--clients, --batches, --items and --lanes must be >= 1, --profiles >= 0")

    token = client_token(args.token_file) if args.token_file else None
    storm = None
    planned = args.clients * args.batches
    with tempfile.TemporaryDirectory(prefix="serve-load-") as tmp:
        server = None
        if args.url:
            url, what = args.url.rstrip("/"), f"external server {args.url}"
        else:
            from kernelrl.judge.eval_config import TimingConfig
            from kernelrl.judge.evaluator import EvalConfig
            from kernelrl.serve.config import ServeConfig
            from kernelrl.serve.server import RewardServer

            backend = None
            if args.backend == "fake":
                backend = SleepBackend(args.eval_ms / 1000, args.lanes, args.profile_ms / 1000)
                what = f"fake backend ({args.eval_ms:g} ms per evaluation, {args.lanes} lanes)"
            else:
                what = "real evaluator (one CPU lane, quick timing)"
            timing = TimingConfig(min_rounds=5, max_rounds=40, max_timing_s=2.0, warmup_calls=2, min_spot_checks=2)
            config = ServeConfig(port=0, db_path=Path(tmp) / "serve.db", max_pending_items=args.queue_limit,
                                 eval=EvalConfig(cache_dir=Path(tmp) / "cache", timeout_s=120, timing=timing))
            server = RewardServer(config, backend=backend).start_in_thread()
            url = server.url
        print(f"serve_load: {args.clients} clients x {args.batches} batches x {args.items} items on {what}")
        try:
            r = run_clients(url, token, args)
            if args.profiles and args.backend == "fake" and not args.url:
                with RewardClient(url, token=token) as one:
                    job_id = one.submit([one_item()]).job
                    one.wait(job_id)
                storm = profile_storm(url, token, job_id, args.profiles)
            counters = server_counters(url, token)
        finally:
            if server is not None:
                server.stop()

    o, lat = r["outcome"], r["latencies"]
    items_per_s = o["items"] / r["wall"] if r["wall"] > 0 else 0.0
    print(f"batches done {o['done']}/{planned}, failed {o['failed']}, not started (time limit) {o['not_started']}")
    print(f"items returned {o['items']}, lost or mismatched {o['lost_items']}")
    print(f"client retries: {dict(r['retried']) or 'none'}")
    print(f"wall {r['wall']:.2f} s; throughput {items_per_s:.1f} evaluations/s ({items_per_s * 3600:.0f}/hour), "
          f"{o['done'] / r['wall']:.2f} batches/s")
    if args.backend == "fake" and not args.url:
        ideal = o["items"] * args.eval_ms / 1000 / args.lanes
        print(f"ideal wall for the fake lanes {ideal:.2f} s: the server kept them {100 * ideal / r['wall']:.0f} % busy")
    if lat:
        ms = [x * 1000 for x in lat]
        print(f"batch latency ms: p50 {percentile(ms, 50):.0f}, p90 {percentile(ms, 90):.0f}, "
              f"p99 {percentile(ms, 99):.0f}, max {max(ms):.0f}, mean {statistics.fmean(ms):.0f}")
    if storm is not None:
        ms = [x * 1000 for x in storm["statuses"]]
        print(f"{args.profiles} profiles at once ({args.profile_ms:g} ms each, {args.lanes} lanes): answered in "
              f"{storm['wall']:.2f} s, {len(storm['failures'])} failed; GET /v1/jobs/ID during them ({len(ms)} "
              f"requests) ms: p50 {percentile(ms, 50):.1f}, p99 {percentile(ms, 99):.1f}, max {max(ms):.1f}")
        for failure in storm["failures"][:5]:
            print(f"  profile failed: {failure}")
    print("server counters:\n" + counters)
    ok = o["failed"] == 0 and o["lost_items"] == 0 and (storm is None or not storm["failures"])
    return 0 if ok else 1


def one_item() -> ItemIn:
    return wire_item(TASK, CANDIDATE + "\n# status probe\n")


if __name__ == "__main__":
    sys.exit(main())
