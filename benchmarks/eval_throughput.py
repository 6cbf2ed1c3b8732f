"""Evaluator throughput on a GRPO-shaped batch, against a naive loop, measured side by side.

The batch: 4 tasks x 8 candidates, as one GRPO step's groups would be: per task, 2 C++
candidates with distinct sources (each a separate build), 3 PyTorch-level rewrites (two of them
the same program with different comments: identical code in one group), 1 incorrect, 1 that
raises, 1 that hangs. Three ways to judge it, each with a cold build cache of its own:

- naive: a serial, in-process loop that builds each candidate afresh (torch's inline loader, no
  cache, no precompiled header), checks 5 input sets and times 50 calls of reference and
  candidate; a hang is cut by an alarm after the same limits as the evaluator's (`--timeout`,
  plus `--build-timeout` for a C++ candidate); no isolation, no defences;
- one by one: one `Evaluator`, `evaluate` per candidate (each its own timing group);
- batched: one `Evaluator`, `evaluate_batch` over the whole batch (one timing group per task).

Prints wall time and candidates/hour of each path, the ratio to the naive loop, whether the two
evaluator paths agree on every verdict, how far apart the identical pair measured in each group, and where
each evaluator path's time went: every phase of its timing groups summed (reference load and
outputs, candidate checks with their worker waits, loads and correctness runs, the A/A copy's checks
and samples, the timing pool, setup, samples, spot checks, stray-process checks, verdicts), in
seconds and as a share of the groups' time. Then the same on the PyTorch-only half (no C++
candidate).

On a GPU (`--device cuda`, issue 25 item 7) the compiled candidates are the shipped CUDA and
Triton examples of each task (`TASKS_CUDA`) and the figure is candidates per hour per GPU (one
evaluator, one GPU); the naive loop runs on the GPU too, synchronising after its timed loops.
`--warm` measures with a warm build cache, as a trainer sees it after its first steps: a first,
unmeasured pass of each evaluator path builds every candidate into the path's cache folder, and
the measured pass is a fresh evaluator (no result cache) over the same batch. `--limit N` takes
the first N tasks. `--kept-references 0,8` measures each evaluator path once per value of
`EvalConfig.kept_references` (0: every group starts a worker for its task's reference; the one-by-one
path judges each task's candidates as groups of one, so it shows what keeping those workers saves).
A machine header (device, driver, CUDA, torch, Triton) is printed first.

`--cuda-l1 FILE --tasks level1/20,level2/12,...` (issue 57, the lease's realistic batch): the tasks
are KernelBench problems as CUDA-L1's published file holds them (the user's copy, carried to the
machine, never shipped) at `--size full`, 8 candidates each: the published CUDA kernel and a second
build of it, a Triton candidate (the reference's forward, its output passed through a Triton copy
kernel: a Triton build and launch of its own), a PyTorch rewrite, the reference renamed, one
incorrect, one that raises, and on the first task only one that hangs (the others get a second
renamed copy). With `--warm`, the first (cold) pass is printed too: cold then warm in one run.
`--headers-dir DIR` gives every evaluator path the judge's precompiled torch headers from DIR
(`EvalConfig.headers_dir`), as a machine keeps them across runs; without it each path starts with
none and has them made as its C++ candidates ask (the number at each path's start is printed).
`--cache-dir` keeps the build caches in a folder of the user's (a lease's cache that a second
command reuses); by default they are temporary and removed at the end.

Usage: python benchmarks/eval_throughput.py [--timeout 20] [--build-timeout 240] [--only all|pytorch|both]
       [--paths naive,one,batched] [--device cpu|cuda] [--warm] [--limit N] [--kept-references N[,N]]
       [--cuda-l1 FILE --tasks level1/20,... --size full] [--cache-dir DIR]
Numbers depend on the machine and its load; compare ratios from one run on a quiet machine.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import machine
import torch

from kernelrl.candidate import Candidate, Language
from kernelrl.checks.audit import AuditInputError, read_entries, select
from kernelrl.examples import list_examples
from kernelrl.judge.eval_config import TimingConfig
from kernelrl.judge.evaluator import EvalConfig, Evaluator
from kernelrl.judge.harness.compare import compare_outputs
from kernelrl.judge.harness.device import Device
from kernelrl.judge.isolation.headers import include_dir
from kernelrl.judge.timing.throughput import Throughput
from kernelrl.proposers.heuristic import Rewrite, render_rewrite, task_traits
from kernelrl.result import EvalResult, Status
from kernelrl.tasks.sizes import instantiate
from kernelrl.tasks.suites import builtin_task
from kernelrl.tasks.task import Size, Task

TASKS = ("level1/softmax", "level1/rmsnorm", "level2/linear_bias_gelu_scale", "operators/shift_group_quant")
# On a GPU: tasks with a shipped CUDA or Triton example, the batch's compiled candidates.
TASKS_CUDA = ("level1/softmax", "level1/rmsnorm", "level2/linear_bias_gelu_scale", "operators/heat3d_stencil")


@dataclass(frozen=True)
class Item:
    task: Task
    candidate: Candidate
    kind: str  # cpp (any compiled candidate: C++, CUDA, Triton), rewrite, twin, incorrect, raises, hangs


def renamed(task: Task, body_patch: tuple[str, str] | None = None) -> str:
    """The reference as a ModelNew, optionally with one line of its forward changed."""
    src = re.sub(r"\bclass Model\(", "class ModelNew(", task.source, count=1)
    if body_patch:
        old, new = body_patch
        src = src.replace(old, new, 1)
    return src


def forward_return(task: Task) -> str:
    """The first `return` line inside the reference's forward (to patch it)."""
    body = task.source[task.source.index("def forward"):]
    return next(line for line in body.splitlines() if line.strip().startswith("return "))


def tasks_for(device: str) -> tuple[str, ...]:
    return TASKS_CUDA if device == "cuda" else TASKS


def compiled_example(name: str, device: str) -> str:
    """The task's shipped compiled candidate: C++ on a CPU, CUDA (or Triton) on a GPU."""
    if device == "cpu":
        return next(e.source for e in list_examples(device="cpu") if e.task == name and e.name.endswith("cpp_fused"))
    return next(e.source for e in list_examples(device="cuda") if e.task == name and e.expected == "correct")


def second_sample(source: str) -> str:
    """The same kernel as another sample: a comment more in its compiled text, so a build of its own."""
    for anchor in ("#include <torch/extension.h>", "@triton.jit"):
        if anchor in source:
            return source.replace(anchor, f"{anchor}\n// sample 2" if anchor.startswith("#") else
                                  f"# sample 2\n{anchor}", 1)
    include = re.search(r"#include\s*[<\"][^>\"\n]+[>\"]", source)  # any compiled text's first include
    if include:
        return source[:include.end()] + "\n// sample 2" + source[include.end():]
    raise ValueError("no place for a second sample's comment")


# A Triton candidate for any task: the reference's forward, its output passed through a Triton copy
# kernel. Correct by construction and slower than the reference; what it brings to the batch is a
# Triton build and launch (what a policy's Triton answers cost the judge), not a speedup.
_TRITON_EPILOGUE = """

import triton
import triton.language as tl


@triton.jit
def _copy_kernel(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)


class ModelNew(_Reference):
    def forward(self, *args):
        out = super().forward(*args).contiguous()
        res = torch.empty_like(out)
        n = out.numel()
        _copy_kernel[(triton.cdiv(n, 1024),)](out, res, n, BLOCK=1024)
        return res
"""


def triton_epilogue(task: Task) -> str:
    """The reference as `_Reference` and a `ModelNew` that copies its output through a Triton kernel."""
    return re.sub(r"\bclass Model\(", "class _Reference(", task.source, count=1) + _TRITON_EPILOGUE


def kernelbench_batch(path: Path, names: list[str]) -> list[Item]:
    """The lease's realistic batch: each named task of CUDA-L1's published file (its `ref_code`, a
    KernelBench problem) with 8 candidates: the published CUDA kernel, a second build of it, a Triton
    candidate, a PyTorch rewrite, the reference renamed, one incorrect, one that raises, and on the
    first task one that hangs (the others a second renamed copy). Raises AuditInputError when a named
    task is missing or has no published code."""
    entries = {e.name: e for e in select(read_entries(path), only=names)}
    missing = [n for n in names if n not in entries or not entries[n].code or entries[n].task is None]
    if missing:
        raise AuditInputError(f"{path}: no published kernel with its task for {', '.join(missing)}")
    items = []
    for k, name in enumerate(names):
        entry = entries[name]
        task, cuda = entry.task, entry.code
        assert task is not None and cuda is not None  # checked above
        ret = forward_return(task)
        indent = ret[: len(ret) - len(ret.lstrip())]
        last = (Item(task, Candidate(source=renamed(task, (ret, f"{indent}while True:\n{indent}    pass\n{ret}")),
                                     origin=f"{name}:hangs"), "hangs") if k == 0 else
                Item(task, Candidate(source=renamed(task) + "\n# the same program, a third sample\n",
                                     origin=f"{name}:renamed-3"), "twin"))
        items += [
            Item(task, Candidate(source=cuda, origin=f"{name}:cuda"), "cpp"),
            Item(task, Candidate(source=second_sample(cuda), origin=f"{name}:cuda-2"), "cpp"),
            Item(task, Candidate(source=triton_epilogue(task), origin=f"{name}:triton"), "cpp"),
            Item(task, Candidate(source=render_rewrite(task, Rewrite(inference_mode=True), task_traits(task)),
                                 origin=f"{name}:inference_mode"), "rewrite"),
            Item(task, Candidate(source=renamed(task), origin=f"{name}:renamed"), "twin"),
            Item(task, Candidate(source=renamed(task, (ret, ret.replace("return ", "return 1.01 * (", 1) + ")")),
                                 origin=f"{name}:incorrect"), "incorrect"),
            Item(task, Candidate(source=renamed(task, (ret, f"{indent}raise RuntimeError('boom')\n{ret}")),
                                 origin=f"{name}:raises"), "raises"),
            last,
        ]
    return items


def batch(device: str = "cpu", limit: int | None = None) -> list[Item]:
    items = []
    for name in tasks_for(device)[:limit]:
        task = builtin_task(name)
        cpp = compiled_example(name, device)
        # A second build of the same kernel: a distinct source (a different comment in the
        # compiled text), so it is a build of its own, as two samples of a policy would be.
        cpp2 = second_sample(cpp)
        assert cpp2 != cpp, name
        traits = task_traits(task)
        rewrite = render_rewrite(task, Rewrite(inference_mode=True), traits)
        ret = forward_return(task)
        indent = ret[: len(ret) - len(ret.lstrip())]
        items += [
            Item(task, Candidate(source=cpp, origin=f"{name}:cpp"), "cpp"),
            Item(task, Candidate(source=cpp2, origin=f"{name}:cpp-2"), "cpp"),
            Item(task, Candidate(source=rewrite, origin=f"{name}:inference_mode"), "rewrite"),
            Item(task, Candidate(source=renamed(task), origin=f"{name}:renamed"), "twin"),
            Item(task, Candidate(source=renamed(task) + "\n# the same program, another sample\n",
                                 origin=f"{name}:renamed-2"), "twin"),
            Item(task, Candidate(source=renamed(task, (ret, ret.replace("return ", "return 1.01 * (", 1) + ")")),
                                 origin=f"{name}:incorrect"), "incorrect"),
            Item(task, Candidate(source=renamed(task, (ret, f"{indent}raise RuntimeError('boom')\n{ret}")),
                                 origin=f"{name}:raises"), "raises"),
            Item(task, Candidate(source=renamed(task, (ret, f"{indent}while True:\n{indent}    pass\n{ret}")),
                                 origin=f"{name}:hangs"), "hangs"),
        ]
    return items


# ---------------------------------------------------------------------------------------------
# The naive loop


class _Alarm(Exception):
    pass


@contextlib.contextmanager
def alarm(seconds: float):
    def ring(signum, frame):  # noqa: ANN001
        raise _Alarm()

    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def naive(items: list[Item], timeout_s: float, build_timeout_s: float,
          device: str = "cpu", size: str = "small") -> tuple[float, list[str]]:
    """Serial, uncached, in-process: what a simple evaluation script does."""

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    verdicts = []
    t0 = time.monotonic()
    for i, item in enumerate(items):
        os.environ["TORCH_EXTENSIONS_DIR"] = tempfile.mkdtemp(prefix="naive-ext-")  # builds afresh
        tm = instantiate(item.task, size)
        verdict = "correct"
        try:
            compiles = item.candidate.language is not Language.PYTORCH
            with alarm(timeout_s + (build_timeout_s if compiles else 0.0)):
                path = Path(tempfile.mkdtemp()) / f"cand_{i}.py"
                path.write_text(item.candidate.source)
                spec = importlib.util.spec_from_file_location(f"naive_cand_{i}", path)
                if spec is None or spec.loader is None:
                    raise ImportError(f"cannot load {path}")
                mod = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(mod)
                torch.manual_seed(0)
                ref = tm.Model(*tm.get_init_inputs()).to(device)
                torch.manual_seed(0)
                new = mod.ModelNew(*tm.get_init_inputs()).to(device)
                with torch.no_grad():
                    for s in range(5):
                        torch.manual_seed(100 + s)
                        inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in tm.get_inputs()]
                        got, want = new(*inputs), ref(*inputs)
                        if not compare_outputs(got.cpu(), want.cpu()).ok:
                            verdict = "incorrect"
                    for model in (ref, new):
                        for _ in range(3):
                            model(*inputs)
                        sync()
                        for _ in range(50):
                            model(*inputs)
                        sync()
        except _Alarm:
            verdict = "timeout"
        except Exception:  # noqa: BLE001 - a failing candidate is still judged
            verdict = "error"
        verdicts.append(verdict)
    return time.monotonic() - t0, verdicts


# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Setting:
    """What every evaluator path of one run shares."""

    timeout_s: float
    build_timeout_s: float
    device: str = "cpu"
    size: str = "small"
    cache_root: Path  # each evaluator path's build cache is a folder of its own under it
    headers_dir: Path | None = None  # precompiled headers shared by every path (None: each path's own, cold)


def config(s: Setting, label: str, kept: int | None = None) -> EvalConfig:
    cache = s.cache_root / re.sub(r"[^a-z0-9]+", "-", f"{label}-kept{kept}".lower())
    cache.mkdir(parents=True, exist_ok=True)
    cfg = EvalConfig(device=Device(s.device), size=Size(s.size), cache_dir=cache, headers_dir=s.headers_dir,
                     timeout_s=s.timeout_s, build_timeout_s=s.build_timeout_s, timing=TimingConfig(max_timing_s=6.0))
    return cfg if kept is None else dataclasses.replace(cfg, kept_references=kept)


def one_by_one(items: list[Item], cfg: EvalConfig) -> tuple[float, list[EvalResult]]:
    t0 = time.monotonic()
    with Evaluator(cfg) as ev:
        results = [ev.evaluate(i.task, i.candidate) for i in items]
    return time.monotonic() - t0, results


def batched(items: list[Item], cfg: EvalConfig) -> tuple[float, list[EvalResult]]:
    t0 = time.monotonic()
    with Evaluator(cfg) as ev:
        results = ev.evaluate_batch([(i.task, i.candidate) for i in items])
    return time.monotonic() - t0, results


def twins(items: list[Item], results: list[EvalResult]) -> list[str]:
    out = []
    for name in dict.fromkeys(i.task.name for i in items):
        pair = [r for i, r in zip(items, results) if i.task.name == name and i.kind == "twin"]
        first, second = (pair[0].speedup, pair[1].speedup) if len(pair) == 2 else (None, None)
        if first and second:
            diff = abs(first / second - 1) * 100
            out.append(f"{name}: {first:.3f} vs {second:.3f} ({diff:.1f} % apart)")
        else:
            out.append(f"{name}: " + ", ".join(r.status.value for r in pair))
    return out


def phase_table(results: list[EvalResult], wall_s: float) -> list[str]:
    """Where an evaluator path's time went: every phase summed over its timing groups, in seconds and
    as a share of the groups' summed time (`kernelrl.judge.timing.throughput`)."""
    t = Throughput.of(results, wall_s)
    lines = [f"    {t.groups} groups, {t.group_wall_s:.1f} s of group time in {t.wall_s:.1f} s of wall time"]
    lines += [f"    {name:26s} {sec:8.1f} s  {share:6.1%}" if share is not None else f"    {name:26s} {sec:8.1f} s"
              for name, sec, share in t.split()]
    return lines


PATHS = ("naive", "one", "batched")


def run(label: str, items: list[Item], setting: Setting, paths: tuple[str, ...], warm: bool = False,
        kept: tuple[int | None, ...] = (None,)) -> None:
    print(f"\n== {label}: {len(items)} candidates ({dict(Counter(i.kind for i in items))})"
          + (", cold build cache, then warm" if warm else ", cold build cache"), flush=True)
    rate = "candidates/hour/GPU" if setting.device == "cuda" else "candidates/hour"
    rows = []
    results: dict[str, list[EvalResult]] = {}
    tables: dict[str, list[str]] = {}

    def row(name: str, wall: float, verdicts: list[str]) -> None:
        rows.append((name, wall, dict(Counter(verdicts))))
        print(f"  {name:24s} {wall:7.1f} s  {len(items) / wall * 3600:7.0f} {rate}  {rows[-1][2]}", flush=True)

    for path in paths:
        if path == "naive":
            wall, verdicts = naive(items, setting.timeout_s, setting.build_timeout_s, setting.device, setting.size)
            row("naive serial loop", wall, verdicts)
            continue
        judge = one_by_one if path == "one" else batched
        for k in kept:  # the first setting's results are the ones compared below
            cfg = config(setting, f"{label}-{path}", k)
            made = sorted(include_dir(cfg.headers_root).glob("torch/extension.h.gch/*.gch"))
            print(f"  precompiled torch headers at the start of the {path} path: {len(made)}", flush=True)
            name = f"evaluator, {'one by one' if path == 'one' else 'batched'}"
            name += f", kept {cfg.kept_references}" if len(kept) > 1 else ""
            if warm:  # the cold pass fills cfg.cache_dir's build cache; the warm one is a fresh evaluator
                wall, got = judge(items, cfg)
                tables.setdefault(name + ", cold", phase_table(got, wall))
                row(name + ", cold", wall, [r.status.value for r in got])
                name += ", warm"
            wall, got = judge(items, cfg)
            results.setdefault(path, got)
            tables.setdefault(name, phase_table(got, wall))
            row(name, wall, [r.status.value for r in got])
    if "naive" in paths:
        base = rows[0][1]
        print("  against the naive loop: " + ", ".join(f"{name} {base / w:.2f}x" for name, w, _ in rows[1:]))
    one, many = results.get("one"), results.get("batched")
    if one and many:
        agree = [(i.candidate.origin, a.status.value, b.status.value) for i, a, b in zip(items, one, many)
                 if a.status is not b.status]
        print(f"  verdicts of one-by-one and batched: {'identical' if not agree else f'{len(agree)} differ: {agree}'}")
    for path, got in results.items():
        print(f"  identical programs ({'one by one' if path == 'one' else 'one group, batched'}): "
              + "; ".join(twins(items, got)))
    for name, lines in tables.items():
        print(f"  where the time went, {name}:")
        print("\n".join(lines))
    if many:
        builds = [r.build_time_s for i, r in zip(items, many) if i.kind == "cpp" and r.build_time_s]
        if builds:
            print(f"  C++ builds (batched): {len(builds)}, {min(builds):.1f}-{max(builds):.1f} s each, "
                  f"{sum(builds):.1f} s in all")
    for path, got in results.items():
        for i, r in zip(items, got):
            if r.status is not Status.CORRECT:
                print(f"    [{path}] {i.candidate.origin}: {r.status.value}: {r.message[:90]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=20.0,
                        help="per-candidate limit (seconds) without a build, every path: what a hang costs")
    parser.add_argument("--build-timeout", type=float, default=240.0,
                        help="added to --timeout for a C++ candidate, every path; a cold build must fit in it")
    parser.add_argument("--only", choices=("all", "pytorch", "both"), default="both")
    parser.add_argument("--paths", default=",".join(PATHS),
                        help=f"which of {', '.join(PATHS)} to run (comma-separated); ratios need naive")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--warm", action="store_true", help="measure evaluator paths with a warm build cache")
    parser.add_argument("--limit", type=int, default=None, help="only the first N tasks")
    parser.add_argument("--cuda-l1", type=Path, default=None,
                        help="CUDA-L1's published kernels (the user's copy): the batch is --tasks from it")
    parser.add_argument("--tasks", default="level1/28,level1/48,level1/13,level2/54",
                        help="with --cuda-l1: the batch's tasks, by entry name (comma-separated)")
    parser.add_argument("--size", choices=("small", "full"), default=None,
                        help="task size (default: small, full with --cuda-l1)")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="keep the build caches here (default: a temporary folder, removed at the end)")
    parser.add_argument("--headers-dir", type=Path, default=None,
                        help="the evaluators' precompiled torch headers, kept across runs as a machine keeps them "
                             "(default: each evaluator path's own, under its cold build cache)")
    parser.add_argument("--kept-references", default=None, metavar="N[,N]",
                        help="the evaluator's kept reference workers (EvalConfig.kept_references; default its "
                             "default); a comma list measures each evaluator path once per value, in turn")
    args = parser.parse_args()
    paths = tuple(p.strip() for p in args.paths.split(",") if p.strip())
    if not paths or set(paths) - set(PATHS):
        parser.error(f"--paths: choose from {', '.join(PATHS)}")
    try:
        kept = tuple(int(v) for v in args.kept_references.split(",")) if args.kept_references else (None,)
    except ValueError:
        parser.error(f"--kept-references: whole numbers, comma-separated, not {args.kept_references!r}")
    if any(k is not None and k < 0 for k in kept):
        parser.error("--kept-references: each value must be >= 0")
    print(machine.header(args.device))
    print(f"# command: {' '.join(sys.argv)}")
    print(f"torch {torch.__version__}, {os.cpu_count()} cores, python {sys.version.split()[0]}")
    if args.cuda_l1 is not None:
        try:
            items = kernelbench_batch(args.cuda_l1, [t.strip() for t in args.tasks.split(",") if t.strip()])
        except AuditInputError as err:
            parser.error(str(err))
        items = items[: 8 * args.limit] if args.limit else items
    else:
        items = batch(args.device, args.limit)
    size = args.size or ("full" if args.cuda_l1 is not None else "small")
    root = args.cache_dir or Path(tempfile.mkdtemp(prefix="kernelrl-bench-cache-"))
    setting = Setting(timeout_s=args.timeout, build_timeout_s=args.build_timeout, device=args.device, size=size,
                      cache_root=root, headers_dir=args.headers_dir)
    try:
        if args.only in ("all", "both"):
            run("GRPO-shaped batch", items, setting, paths, args.warm, kept)
        if args.only in ("pytorch", "both"):
            run("PyTorch-only half", [i for i in items if i.kind != "cpp"], setting, paths, args.warm, kept)
    finally:
        if args.cache_dir is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
