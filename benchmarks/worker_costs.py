"""What a worker and the judge spend on every candidate besides the candidate: fingerprints,
comparisons, and torch.compile's first use in a forked worker, with and without the zygote's preload.

Prints, on this machine, one process at a time:
- `content_digest` (the worker's input and output fingerprints, BLAKE3) and SHA-256 over the same
  bytes, in GB/s;
- `output_digest` (the judge's fingerprint of each correctness output) and `compare_outputs`
  (one per correctness run and spot check) on an fp32 output, in ms;
- the CPU of a first `torch.compile` (the call and the first forward of a one-kernel model) in a
  process forked from an interpreter that imported the worker module only, and from one that also
  ran the zygote's preload (`kernelrl.judge.isolation.zygote._preload`), in a worker's inductor
  settings; the compiler's child processes counted apart (with inductor's ISA check, which the
  judge's workers skip once it verified the machine).

Usage: python benchmarks/worker_costs.py [--mib 48] [--repeats 5] [--forks 2]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

from kernelrl.judge.isolation.inductor import BASE_ENV

# A worker's torch.compile settings, before torch reads them (inductor's ISA check is not skipped
# here: workers skip it once the judge verified the machine, so the compiler's CPU below includes it).
os.environ.update(BASE_ENV)

import torch  # noqa: E402

from kernelrl.judge.harness import compare  # noqa: E402


def _best(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def hashing(mib: int, repeats: int) -> None:
    x = torch.randn(mib << 18)  # fp32: 4 bytes an element
    gb = x.numel() * 4 / 1e9

    def sha256() -> None:
        h = hashlib.sha256(usedforsecurity=False)
        flat = x.reshape(-1)
        for i in range(0, flat.numel(), compare._CHUNK):
            h.update(flat[i:i + compare._CHUNK].view(torch.uint8).numpy().data)

    print(f"fingerprints of {mib} MiB (best of {repeats}):")
    print(f"  content_digest (BLAKE3)   {gb / _best(lambda: compare.content_digest(x), repeats):5.2f} GB/s")
    print(f"  SHA-256, same chunks      {gb / _best(sha256, repeats):5.2f} GB/s")
    y = x + torch.randn_like(x) * 1e-6
    print(f"  output_digest             {_best(lambda: compare.output_digest(x), repeats) * 1e3:6.1f} ms")
    print(f"  compare_outputs (passes)  {_best(lambda: compare.compare_outputs(y, x), repeats) * 1e3:6.1f} ms")


def _first_compile() -> tuple[float, float, float]:
    """In a fresh fork: (the compile call's wall s, this process's CPU s, its children's CPU s)."""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="kernelrl-costs-")
    t = time.perf_counter()
    model = torch.compile(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU()))
    model(torch.randn(4, 64))
    wall = time.perf_counter() - t
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


def forked_compiles(forks: int) -> None:
    import kernelrl.judge.harness.worker  # noqa: F401 - what the zygote imports first
    from kernelrl.judge.isolation import zygote

    print(f"a first torch.compile in a forked process ({forks} forks each; CPU of the process, of its compiler):")
    for preload in (False, True):
        if preload:
            t = time.process_time()
            zygote._preload()
            print(f"  the preload itself: {time.process_time() - t:.2f} s of CPU, once per zygote")
        rows = []
        for _ in range(forks):
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(r)
                os.write(w, json.dumps(_first_compile()).encode())
                os._exit(0)
            os.close(w)
            with os.fdopen(r) as f:
                rows.append(json.loads(f.read()))
            os.waitpid(pid, 0)
        wall, own, kids = (statistics.median(c) for c in zip(*rows))
        print(f"  {'with' if preload else 'without'} the preload: {wall:5.2f} s wall, {own:5.2f} s CPU, "
              f"compiler {kids:5.2f} s (medians)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--forks", type=int, default=2)
    args = parser.parse_args(argv)
    if args.mib < 1 or args.repeats < 1 or args.forks < 1:
        parser.error("--mib, --repeats and --forks must be >= 1")
    torch.set_num_threads(1)  # a worker's
    print(f"# {' '.join(sys.argv)}\ntorch {torch.__version__}, {os.cpu_count()} cores")
    hashing(args.mib, args.repeats)
    forked_compiles(args.forks)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
