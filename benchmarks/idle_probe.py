"""The judge's idle probe on a GPU: its latency, and what it costs and decides in one evaluation.

Prints, as JSON lines:
1. `probe`: the probe's latencies (`kernelrl.judge.timing.idle.CudaProbe`, host clock, launch to
   completion) on the idle device, then while `--load` processes burn CPU, then while another
   process holds an idle CUDA context. The calibration threshold `idle.calibrate` would set from
   the idle samples is printed beside them, and how many of each phase's probes it reads busy.
2. `evaluation`: each named example judged once on the GPU (`--examples`), with the idle probe
   and without it (the monitor replaced by None): wall seconds, status, message, every finding's
   rule and message, the group's `device_idle` and its note, and where the timing's time went.

Usage: python benchmarks/idle_probe.py [--probes 200] [--load 8] [--examples rmsnorm/triton_fused softmax/cuda_fused]
Tiny CPU check (no probe there; the evaluations' fields only): --device cpu --examples softmax/cpp_fused --quick
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import machine

from kernelrl.candidate import Candidate
from kernelrl.examples import list_examples
from kernelrl.judge.eval_config import TimingConfig
from kernelrl.judge.evaluator import EvalConfig, Evaluator
from kernelrl.judge.harness.device import Device, visible_device
from kernelrl.judge.timing.idle import CudaProbe, calibrate, classify
from kernelrl.tasks.suites import builtin_task


def _burn(stop_at: float) -> None:
    x = 0
    while time.monotonic() < stop_at:
        x += 1


def _phase(probe: CudaProbe, n: int, name: str, threshold: float | None) -> list[float]:
    ms = [probe() for _ in range(n)]
    q = statistics.quantiles(ms, n=100)
    row = {"measure": "probe", "phase": name, "n": n, "median_ms": round(statistics.median(ms), 4),
           "p90_ms": round(q[89], 4), "p99_ms": round(q[98], 4), "max_ms": round(max(ms), 4)}
    if threshold is not None:
        row["busy_readings"] = sum(m > threshold for m in ms)
    print(json.dumps(row), flush=True)
    return ms


def probe_latencies(n: int, load: int) -> None:
    probe = CudaProbe(visible_device(0))
    try:
        idle = _phase(probe, n, "idle", None)
        cal = calibrate(idle[:21])
        threshold = cal.threshold_ms if cal else None
        print(json.dumps({"measure": "calibration", "from_first": 21,
                          "idle_ms": cal.idle_ms if cal else None, "threshold_ms": threshold}), flush=True)
        if cal is not None:
            print(json.dumps({"measure": "probe", "phase": "idle_reclassified",
                              "busy_readings": sum(classify(m, cal).value == "busy" for m in idle)}), flush=True)
        procs = [mp.Process(target=_burn, args=(time.monotonic() + 30,)) for _ in range(load)]
        for p in procs:
            p.start()
        _phase(probe, n, f"cpu_load_{load}", threshold)
        for p in procs:
            p.terminate()
            p.join()
        holder = subprocess.Popen([sys.executable, "-c", "import torch,time; x=torch.ones(1,device='cuda'); "
                                   "torch.cuda.synchronize(); print('ready', flush=True); time.sleep(60)"],
                                  stdout=subprocess.PIPE)
        assert holder.stdout is not None
        holder.stdout.readline()
        _phase(probe, n, "second_context_idle", threshold)
        holder.kill()
        holder.wait()
    finally:
        probe.close()


def evaluations(names: list[str], cache: Path, *, device: str, quick: bool) -> None:
    examples = {e.name: e for e in list_examples()}
    unknown = sorted(set(names) - set(examples))
    if unknown:
        raise SystemExit(f"idle_probe: no shipped example {', '.join(unknown)}")
    timing = TimingConfig(min_rounds=5, max_rounds=20, max_timing_s=2.0) if quick else TimingConfig()
    for with_probe in (True, False) if device == "cuda" else (False,):
        cfg = EvalConfig(device=Device(device), cache_dir=cache, timing=timing)
        with Evaluator(cfg) as ev:
            if not with_probe:
                ev.context = dataclasses.replace(ev.context, idle=None)
            for name in names:
                ex = examples[name]
                t0 = time.monotonic()
                r = ev.evaluate(builtin_task(ex.task), Candidate(source=ex.source))
                print(json.dumps({"measure": "evaluation", "example": name, "probe": with_probe,
                                  "wall_s": round(time.monotonic() - t0, 2), "result": _short(r.to_dict())},
                                 default=str), flush=True)


def _short(value: object) -> object:
    """The result without its long lists and texts (per-sample times, logs)."""
    if isinstance(value, dict):
        return {k: _short(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_short(v) for v in value[:8]] + ([f"... {len(value)} in all"] if len(value) > 8 else [])
    if isinstance(value, str) and len(value) > 400:
        return value[:400] + "..."
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--probes", type=int, default=200)
    parser.add_argument("--load", type=int, default=8, help="CPU-burning processes in the loaded phase")
    parser.add_argument("--examples", nargs="*", default=["rmsnorm/triton_fused", "softmax/cuda_fused"])
    parser.add_argument("--skip-probe", action="store_true")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--quick", action="store_true", help="short timing (a smoke test, not a measurement)")
    args = parser.parse_args()
    print(machine.header(args.device), flush=True)
    if args.device == "cuda" and not args.skip_probe:
        probe_latencies(args.probes, args.load)
    with tempfile.TemporaryDirectory() as cache:
        evaluations(args.examples, Path(cache), device=args.device, quick=args.quick)


if __name__ == "__main__":
    main()
