"""The evaluator: the reward. Builds a candidate, checks it against the reference, times both.

Process model (see shared design notes, evaluator protocol):
- the judge (this process) draws the secret seeds, makes every input, holds the reference's
  outputs and decides the verdict; no program under test runs here;
- the reference and the candidate each run in their own spawned worker (`kernelrl.judge.sandbox`),
  so the candidate can neither read the reference's outputs (not even from freed memory) nor
  change what the reference's timing sees;
- both workers are built with the same init arguments and init seed; when the candidate's
  parameters have the reference's names and shapes, it receives the reference's values;
- correctness: `n_correctness` input sets (the first plain, the others randomly scaled and
  shifted), the first run twice; outputs compared in the judge with dtype-aware tolerances;
  inputs compared after each call;
- timing: `kernelrl.judge.timer` (interleaved, fresh inputs, cache eviction, spot checks, CPU/thread
  and clock cross-checks from /proc and the judge's clock);
- every crash, hang, exit or OOM of the candidate is a verdict, never an exception here.

Static checks (`kernelrl.checks.static`) and the policy (`kernelrl.checks.policy`) plug in before the
candidate is run; dynamic findings are produced here and pass through the same policy.

Does not guarantee timings are comparable across machines or across runs under other load:
speedups are ratios measured side by side, which is what it guarantees to be fair.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import platform
import random
import re
import secrets
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelrl.candidate import Candidate, Language
from kernelrl.checks.policy import PolicyName
from kernelrl.judge.channel import ChannelProtocolError, ChannelTimeout
from kernelrl.judge.compare import compare_outputs, exactly_equal
from kernelrl.judge.device import Device
from kernelrl.judge.inputs import all_finite, make_input_set
from kernelrl.judge.sandbox import SandboxConfig, Worker, WorkerDied
from kernelrl.judge.timer import (
    TimedCallFailed,
    TimingConfig,
    TimingOutcome,
    run_timing,
)
from kernelrl.result import EvalResult, Finding, Severity, Status, TimingStats
from kernelrl.tasks.task import Size, Task, TaskError


def default_cache_dir() -> Path:
    return Path(os.environ.get("KERNELRL_CACHE") or Path.home() / ".cache" / "kernelrl")


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    device: Device = Device.CPU
    # Which GPU of the machine (cuda only): workers see only that one, as their cuda:0. None: the
    # first visible one. One evaluator per GPU gives one timing lane per GPU.
    device_index: int | None = None
    size: Size = Size.SMALL
    timeout_s: float = 300.0  # wall clock for the whole evaluation of one candidate
    policy: PolicyName = PolicyName.OPEN
    n_correctness: int = 5
    tol_scale: float = 1.0  # multiplies the dtype tolerances (kernelrl.judge.compare)
    static_checks: bool = True
    concurrency: int = 1  # evaluations at once (builds and correctness overlap; timing never does)
    cache_dir: Path = field(default_factory=default_cache_dir)
    timing: TimingConfig = field(default_factory=TimingConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    constants: dict[str, int] = field(default_factory=dict)  # explicit overrides on top of `size`

    def __post_init__(self) -> None:
        for name, kind in (("device", Device), ("size", Size), ("policy", PolicyName)):
            value = getattr(self, name)
            try:
                object.__setattr__(self, name, kind(value))
            except ValueError:
                raise ValueError(f"{name} must be one of {', '.join(kind)}, not {value!r}") from None
        object.__setattr__(self, "cache_dir", Path(self.cache_dir))
        if self.device_index is not None and (self.device is not Device.CUDA or self.device_index < 0):
            raise ValueError("device_index is a GPU number (>= 0) and needs device cuda")
        if self.timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        if self.n_correctness < 2:
            raise ValueError("n_correctness must be >= 2 (one plain set, one perturbed)")
        if self.tol_scale <= 0:
            raise ValueError("tol_scale must be positive")
        if self.concurrency < 1:
            raise ValueError("concurrency must be >= 1")


class ReferenceFailed(TaskError):
    """The task's own reference could not be built or run: a task problem, not a verdict."""


# ---------------------------------------------------------------------------------------------
# Build cache


@functools.cache
def toolchain_fingerprint(device: str) -> str:
    import torch

    parts = [torch.__version__, sys.version.split()[0], platform.machine(), device]
    for cmd in (["c++", "--version"], ["nvcc", "--version"] if device == "cuda" else None):
        if cmd is None:
            continue
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout
            parts.append(out.strip().splitlines()[0] if out.strip() else "")
        except (OSError, subprocess.TimeoutExpired):
            parts.append(f"{cmd[0]}:missing")
    if device == "cuda" and torch.cuda.is_available():
        parts.append(torch.cuda.get_device_name())
    return "|".join(parts)


def build_key(source: str, device: str) -> str:
    """Content hash naming a candidate's build directory: source + toolchain + device."""
    return hashlib.sha256(f"{toolchain_fingerprint(device)}\n{source}".encode()).hexdigest()[:24]


def build_dir(config: EvalConfig, source: str) -> Path:
    return config.cache_dir / "extensions" / build_key(source, config.device)


def _has_build(path: Path) -> bool:
    return path.is_dir() and any(path.rglob("*.so"))


# ---------------------------------------------------------------------------------------------
# Timing is exclusive: builds and correctness runs of several candidates may overlap, but only
# one evaluation times at a time on this machine (threads of this process and other processes
# sharing the cache folder), so measurements do not compete for cores.

_TIMING_THREAD_LOCK = threading.Lock()


class _TimingLock:
    def __init__(self, cache_dir: Path):
        self.path = cache_dir / "timing.lock"

    def __enter__(self) -> None:
        _TIMING_THREAD_LOCK.acquire()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.f = open(self.path, "w")  # noqa: SIM115
        fcntl.flock(self.f, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()
        _TIMING_THREAD_LOCK.release()


# ---------------------------------------------------------------------------------------------
# Policy and static checks plug in here.


def _static_findings(source: str) -> list[Finding]:
    try:
        from kernelrl.checks.static import check_source
    except ImportError:
        return []
    return list(check_source(source))


def _apply_policy(policy: str, findings: list[Finding]) -> list[Finding]:
    try:
        from kernelrl.checks.policy import get_policy
    except ImportError:
        return findings
    return list(get_policy(policy).apply(findings))


# ---------------------------------------------------------------------------------------------


class _Verdict(Exception):
    """Internal: ends an evaluation early with a finished result."""

    def __init__(self, status: Status, message: str, errors: Iterable[str] = (), **extra: Any):
        super().__init__(message)
        self.status = status
        self.message = message
        self.errors = [e for e in errors if e]
        self.extra = extra


def evaluate(task: Task, candidate: Candidate | str, config: EvalConfig | None = None) -> EvalResult:
    """Judge one candidate for one task. Always returns a result; raises only for bad tasks."""
    config = config or EvalConfig()
    cand = Candidate(source=candidate) if isinstance(candidate, str) else candidate
    return _Judge(task, config).judge(cand_source=cand.source, language=cand.language)


def config_fingerprint(config: EvalConfig) -> str:
    """What makes two evaluations comparable: every setting but the cache folder and concurrency."""
    from kernelrl.config import to_dict

    d = to_dict(config)
    for key in ("cache_dir", "concurrency"):
        d.pop(key, None)
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


class Evaluator:
    """The one way to judge candidates: a long-lived object with its config and caches.

    `evaluate(task, candidate)` judges one; `evaluate_batch([(task, candidate), ...])` judges many
    and returns their results in order (builds and correctness of several candidates overlap on
    `config.concurrency` threads; timing never overlaps on a device). Results are cached by task
    source, size, device, policy, candidate source and the config's fingerprint, so the same
    program is judged once per evaluator. A task whose reference cannot run gives a
    `task_error` result for each of its candidates; the other tasks of the batch go on.
    """

    def __init__(self, config: EvalConfig | None = None) -> None:
        self.config = config or EvalConfig()
        self.fingerprint = config_fingerprint(self.config)
        self._cache: dict[tuple[str, ...], EvalResult] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release pools and workers (none are held between calls yet)."""

    def cache_key(self, task: Task, candidate: Candidate) -> tuple[str, ...]:
        cfg = self.config
        return (task.source_hash, str(cfg.size), str(cfg.device), str(cfg.policy), candidate.hash, self.fingerprint)

    def evaluate(self, task: Task, candidate: Candidate | str) -> EvalResult:
        return self.evaluate_batch([(task, candidate)])[0]

    def evaluate_batch(self, items: Sequence[tuple[Task, Candidate | str]], *,
                       on_result: Callable[[int, EvalResult], None] | None = None) -> list[EvalResult]:
        """Judge every (task, candidate) pair; results in the order given. Never raises for a
        candidate's or a task's fault."""
        pairs = [(task, Candidate(source=c) if isinstance(c, str) else c) for task, c in items]
        results: list[EvalResult | None] = [None] * len(pairs)

        def one(i: int) -> EvalResult:
            task, cand = pairs[i]
            key = self.cache_key(task, cand)
            with self._lock:
                hit = self._cache.get(key)
            if hit is not None:
                return hit
            try:
                res = evaluate(task, cand, self.config)
            except TaskError as e:
                res = EvalResult(task=task.name, status=Status.TASK_ERROR, message=_first_line(str(e)),
                                 errors=[str(e)], device=self.config.device, size=self.config.size,
                                 policy=self.config.policy, candidate_hash=cand.hash)
            with self._lock:
                self._cache[key] = res
            return res

        with ThreadPoolExecutor(max_workers=max(1, min(self.config.concurrency, len(pairs)))) as pool:
            for i, res in zip(range(len(pairs)), pool.map(one, range(len(pairs)))):
                results[i] = res
                if on_result is not None:
                    on_result(i, res)
        return [r for r in results if r is not None]

    def baseline(self, task: Task, *, compile: bool = True) -> Any:
        """Eager and torch.compile times of the task's reference (`kernelrl.judge.baseline.Baseline`)."""
        from kernelrl.judge.baseline import measure_baseline

        return measure_baseline(task, self.config, compile=compile)


def compare_reference_compiled(task: Task, config: EvalConfig, *, mode: str | None = None) -> EvalResult:
    """The task's own reference under torch.compile, judged as a candidate (a baseline)."""
    return _Judge(task, config).judge(cand_source=None, language=Language.PYTORCH, compile_mode=mode or "default")


class _Judge:
    def __init__(self, task: Task, config: EvalConfig):
        self.task = task
        self.config = config
        self.seed_rng = random.Random(secrets.randbits(128))  # the secret: never leaves this process
        self.findings: list[Finding] = []
        self.env: dict[str, Any] = {}
        self.state_before: dict[str, Any] = {}
        self.copy_gbps: float | None = None

    def _result(self, status: Status, message: str, **kw: Any) -> EvalResult:
        return EvalResult(task=self.task.name, status=status, message=message, device=self.config.device,
                          size=self.config.size, policy=self.config.policy, environment=self.env, **kw)

    def judge(self, *, cand_source: str | None, language: Language, compile_mode: str | None = None) -> EvalResult:
        t0 = time.monotonic()
        cfg = self.config
        deadline = t0 + cfg.timeout_s
        source = cand_source if cand_source is not None else f"# torch.compile({compile_mode}) of {self.task.name}\n"
        cand_hash = hashlib.sha256(source.encode()).hexdigest()
        common: dict[str, Any] = {"candidate_hash": cand_hash}
        ref = cand = None
        try:
            if cand_source is not None:
                self._pre_checks(cand_source, language)
            tm = self.task.instantiate(cfg.size, cfg.constants or None)
            init_inputs = tm.get_init_inputs()
            init_seed = self.seed_rng.getrandbits(31)
            bdir = build_dir(cfg, source)
            cached = _has_build(bdir)
            common["build_cached"] = cached
            # torch.compile's caches persist across evaluations (its first compile of a graph
            # costs seconds to minutes on a CPU); worker temp folders do not.
            inductor = {"TORCHINDUCTOR_CACHE_DIR": str(cfg.cache_dir / "inductor")}
            if cfg.device_index is not None:
                inductor["CUDA_VISIBLE_DEVICES"] = str(cfg.device_index)
            env_extra = {"TORCH_EXTENSIONS_DIR": str(bdir), "TRITON_CACHE_DIR": str(bdir / "triton"), **inductor}
            ref = Worker(role="reference", config=cfg.sandbox, device=cfg.device, env_extra=inductor)
            cand = Worker(role="candidate", config=cfg.sandbox, device=cfg.device, env_extra=env_extra)
            evict = _evict_bytes(cfg.device)
            base = {"device": cfg.device, "threads": cfg.sandbox.effective_threads, "init_seed": init_seed,
                    "evict_bytes": evict, "cache_root": str(cfg.cache_dir)}
            ref_setup = {**base, "role": "reference", "task_source": self.task.source, "task_name": self.task.name,
                         "constants": tm.constants, "measure_bandwidth": True}
            if cand_source is None:
                cand_setup = {**ref_setup, "compile": True, "compile_mode": None if compile_mode == "default" else compile_mode}
            else:
                cand_setup = {**base, "role": "candidate", "source": cand_source, "constants": tm.constants}
            for w in (ref, cand):
                w.recv(deadline=deadline)  # hello
            # Both load at once: the reference initialises while the candidate builds.
            ref.channel.send("setup", ref_setup, init_inputs)
            cand.channel.send("setup", cand_setup, init_inputs)
            ref_loaded = self._expect(ref.recv(deadline=deadline), "loaded", reference=True)
            cand_msg = cand.recv(deadline=deadline)
            if cand_msg.kind == "error":
                phase = cand_msg.header.get("phase")
                status = Status.COMPILE_ERROR if phase == "compile" else Status.RUNTIME_ERROR
                what = "does not build" if phase == "compile" else "failed to initialise"
                raise _Verdict(status, f"candidate {what}: {_error_line(cand_msg.header.get('message', ''))}",
                               [cand_msg.header.get("message", ""), cand_msg.header.get("traceback", ""),
                                cand.log_tail()])
            common["build_time_s"] = float(cand_msg.header["build_s"])
            self.state_before = cand_msg.header["state_before"]
            self._state_changes("load", self.state_before, cand_msg.header["state_after"])
            self.copy_gbps = ref_loaded.header.get("copy_gbps")
            self.env.update({"copy_gbps": self.copy_gbps, "proc_isolation": cand.isolated,
                             "threads": cfg.sandbox.effective_threads,
                             "pinned_allocator": cfg.sandbox.pin_allocator})

            # Parameters: same seed already; same names and shapes -> same values.
            if cand_source is not None:
                sd = ref.request("get_state", deadline=deadline).payload
                if sd:
                    loaded = cand.request("load_state", payload=sd, deadline=deadline)
                    self.env["parameters_from_reference"] = bool(loaded.header.get("loaded"))

            common.update(self._correctness(tm, ref, cand, deadline))
            outcome = self._timing(tm, ref, cand, deadline)
            common.update(self._timing_fields(outcome))
            self.findings = _apply_policy(cfg.policy, self.findings)
            rejecting = [f for f in self.findings if f.severity is Severity.REJECT]
            if rejecting:
                raise _Verdict(Status.FLAGGED, f"flagged: {', '.join(sorted({f.rule for f in rejecting}))}",
                               [f.message for f in rejecting])
            return self._result(Status.CORRECT, f"correct, {outcome.speedup:.3g}x", speedup=outcome.speedup,
                                speedup_ci=outcome.speedup_ci,
                                findings=self.findings, eval_time_s=time.monotonic() - t0, **common)
        except _Verdict as v:
            findings = _apply_policy(cfg.policy, self.findings)
            status, message = v.status, v.message
            rejecting = sorted({f.rule for f in findings if f.severity is Severity.REJECT})
            if status is Status.INCORRECT and rejecting:
                # Wrong, and a defence saw why: the rule is what teaches the next prompt.
                status, message = Status.FLAGGED, f"flagged: {', '.join(rejecting)} ({v.message})"
            return self._result(status, message, errors=v.errors, findings=findings,
                                eval_time_s=time.monotonic() - t0, **{**common, **v.extra})
        except ChannelTimeout:
            log = cand.log_tail() if cand else ""
            return self._result(Status.TIMEOUT, f"candidate did not finish within {cfg.timeout_s:g} s",
                                errors=[log], findings=self.findings, eval_time_s=time.monotonic() - t0, **common)
        except WorkerDied as e:
            if e.role == "reference":
                raise ReferenceFailed(f"reference worker died: {e}\n{e.log_tail}") from e
            return self._result(Status.RUNTIME_ERROR, f"candidate crashed: {e}", errors=[e.log_tail],
                                findings=self.findings, eval_time_s=time.monotonic() - t0, **common)
        except ChannelProtocolError as e:
            self.findings.append(Finding(rule="result_channel_forged", message=f"malformed message from the worker: {e}"))
            return self._result(Status.FLAGGED, "flagged: result_channel_forged", errors=[str(e)],
                                findings=_apply_policy(cfg.policy, self.findings),
                                eval_time_s=time.monotonic() - t0, **common)
        finally:
            for w in (ref, cand):
                if w is not None:
                    w.close()

    # -- phases -------------------------------------------------------------------------------

    def _pre_checks(self, source: str, language: Language) -> None:
        try:
            compile(source, "<candidate>", "exec")
        except SyntaxError as e:
            raise _Verdict(Status.COMPILE_ERROR, f"candidate does not parse: {e.msg} (line {e.lineno})", [str(e)]) from e
        if language.needs_gpu and self.config.device != "cuda" and language is Language.CUDA:
            raise _Verdict(Status.COMPILE_ERROR, "a CUDA candidate needs --device cuda (no CUDA device here)")
        if self.config.static_checks:
            found = _apply_policy(self.config.policy, _static_findings(source))
            self.findings.extend(found)
            rejecting = [f for f in found if f.severity is Severity.REJECT]
            if rejecting:
                raise _Verdict(Status.FLAGGED, f"flagged by static checks: {', '.join(sorted({f.rule for f in rejecting}))}",
                               [f"line {f.line}: {f.message}" if f.line else f.message for f in rejecting])

    def _expect(self, msg: Any, kind: str, *, reference: bool) -> Any:
        if msg.kind == kind:
            return msg
        text = msg.header.get("message", msg.kind)
        if reference:
            raise ReferenceFailed(f"reference of {self.task.name} failed: {text}\n{msg.header.get('traceback', '')}")
        raise _Verdict(Status.RUNTIME_ERROR, f"candidate failed: {_first_line(text)}",
                       [text, msg.header.get("traceback", "")])

    def _state_changes(self, phase: str, before: dict[str, Any], after: dict[str, Any]) -> None:
        changed = {k: (before.get(k), v) for k, v in after.items() if before.get(k) != v}
        changed.pop("grad_enabled", None)  # toggled by no_grad around every call
        if changed and not any(f.rule == "global_state_changed" for f in self.findings):
            desc = ", ".join(f"{k}: {a} -> {b}" for k, (a, b) in sorted(changed.items()))
            self.findings.append(Finding(rule="global_state_changed",
                                         message=f"the candidate changed global torch settings ({phase}): {desc}"))

    def _correctness(self, tm: Any, ref: Worker, cand: Worker, deadline: float) -> dict[str, Any]:
        n = self.config.n_correctness
        sets = [make_input_set(tm, self.seed_rng.getrandbits(63), perturb=i > 0, rng=self.seed_rng) for i in range(n)]
        ref_run = ref.request("run", {"repeat_first": 1}, [s.values for s in sets], deadline=deadline)
        ref_run = self._expect(ref_run, "ran", reference=True)
        ref_out = ref_run.payload["outputs"]
        # A perturbed set that makes the reference non-finite (log of a shifted input, say) is
        # replaced by a plain one: perturbation must never make a task unjudgeable.
        bad = [i for i in range(1, n) if not all_finite(ref_out[i]) and all_finite(ref_out[0])]
        if bad:
            for i in bad:
                sets[i] = make_input_set(tm, self.seed_rng.getrandbits(63), perturb=False, rng=self.seed_rng)
            redo = self._expect(ref.request("run", {"repeat_first": 1}, [sets[i].values for i in bad],
                                            deadline=deadline), "ran", reference=True)
            for j, i in enumerate(bad):
                ref_out[i] = redo.payload["outputs"][j]
        self.env["perturbed_sets"] = sum(s.perturbed for s in sets)

        cand_run = cand.request("run", {"repeat_first": 2}, [s.values for s in sets], deadline=deadline)
        self._side_work_census(cand)
        if cand_run.kind == "error":
            raise _Verdict(Status.RUNTIME_ERROR, f"candidate raised: {_first_line(cand_run.header.get('message', ''))}",
                           [cand_run.header.get("message", ""), cand_run.header.get("traceback", ""), cand.log_tail()])
        self._state_changes("run", self.state_before, cand_run.header.get("state_after", {}))
        outs = cand_run.payload["outputs"]
        after = cand_run.payload["inputs_after"]
        changed = sum(bool(c) for c in cand_run.header.get("changed_after_return", []))
        # Pools a program starts on its first call (torch.compile, thread pools) stay; threads
        # that appear on later calls are work started per call.
        rises = [r for r in cand_run.header.get("thread_rises", [])[1:] if r > 0]
        if changed or rises:
            what = []
            if changed:
                what.append(f"its output kept changing after {changed} call(s) had returned")
            if rises:
                what.append(f"{len(rises)} call(s) returned with new threads still alive")
            self.findings.append(Finding(rule="side_work_after_return", message="the candidate " + "; ".join(what)))
        # outs[0] and outs[1] are two runs on set 0; outs[k+1] is set k for k >= 1
        per_set = [outs[0]] + outs[2:]
        inputs_after = [after[0]] + after[2:]
        for i, (sent, got) in enumerate(zip(sets, inputs_after)):
            if not exactly_equal(got, sent.values):
                self.findings.append(Finding(rule="inputs_mutated",
                                             message=f"the candidate changed its inputs in place (input set {i})"))
                break
        max_abs = max_rel = 0.0
        plain_ok = [compare_outputs(c, r, tol_scale=self.config.tol_scale).ok
                    for c, r, s in zip(per_set, ref_out, sets) if not s.perturbed]
        for i, (c, r) in enumerate(zip(per_set, ref_out)):
            cmp = compare_outputs(c, r, tol_scale=self.config.tol_scale)
            max_abs, max_rel = max(max_abs, cmp.max_abs_err), max(max_rel, cmp.max_rel_err)
            if not cmp.ok:
                if "not a plain torch.Tensor" in cmp.reason:
                    self.findings.append(Finding(rule="output_not_plain_tensor", message=cmp.reason))
                    raise _Verdict(Status.FLAGGED, "flagged: output_not_plain_tensor", [cmp.reason])
                kind = "plain" if not sets[i].perturbed else (
                    f"scaled x{sets[i].scale:.2f} and shifted {sets[i].offset_frac:+.2f} mean-abs")
                if sets[i].perturbed and plain_ok and all(plain_ok):
                    if exactly_equal(c, per_set[0]) and not _is_constant(c):
                        # The input changed and the output did not: a result kept from before.
                        self.findings.append(Finding(rule="output_cached_across_calls", message=(
                            f"input set {i} ({kind}) got exactly the output of input set 0: {cmp.reason}")))
                    else:
                        # Right on the task's own input distribution, wrong once it moves: an
                        # answer that only looks right because the true output is near-constant.
                        self.findings.append(Finding(rule="degenerate_under_offset_scale", message=(
                            f"correct on the task's own inputs but not on inputs {kind}: {cmp.reason}")))
                raise _Verdict(Status.INCORRECT, f"incorrect on input set {i} ({kind}): {cmp.reason}", [cmp.reason],
                               max_abs_err=cmp.max_abs_err, max_rel_err=cmp.max_rel_err)
        twice = compare_outputs(outs[1], outs[0], tol_scale=self.config.tol_scale)
        if not twice.ok:
            self.findings.append(Finding(rule="nondeterministic_output",
                                         message=f"two runs on the same input differ: {twice.reason}"))
        return {"max_abs_err": max_abs, "max_rel_err": max_rel}

    def _side_work_census(self, cand: Worker) -> None:
        """Right after the calls returned, the worker must be idle and alone.

        CPU burnt while it waits for the next command, or a child process still alive, means
        work was left running past the end of a call, where no timer would see it.
        """
        before = cand.cpu_time_ns()
        time.sleep(0.05)
        after = cand.cpu_time_ns()
        children = cand.child_count()
        busy_ms = (after - before) / 1e6 if before is not None and after is not None else 0.0
        if busy_ms > 10.0 or children:
            what = []
            if busy_ms > 10.0:
                what.append(f"used {busy_ms:.0f} ms of CPU in the 50 ms after its calls returned")
            if children:
                what.append(f"left {children} child process(es) running")
            self.findings.append(Finding(rule="side_work_after_return",
                                         message="the candidate " + " and ".join(what)))

    def _timing(self, tm: Any, ref: Worker, cand: Worker, deadline: float) -> TimingOutcome:
        cfg = self.config
        pool = [make_input_set(tm, self.seed_rng.getrandbits(63), perturb=False, rng=self.seed_rng).values
                for _ in range(cfg.timing.pool_size)]
        for w in (ref, cand):
            msg = w.request("pool", payload=pool, deadline=deadline)
            if w is ref:
                self._expect(msg, "pooled", reference=True)
            elif msg.kind == "error":
                raise _Verdict(Status.RUNTIME_ERROR, f"candidate failed: {_first_line(msg.header.get('message', ''))}")
        with _TimingLock(cfg.cache_dir):
            try:
                return run_timing(ref, cand, cfg.timing, rng=self.seed_rng, deadline=deadline)
            except TimedCallFailed as e:
                raise _Verdict(Status.RUNTIME_ERROR, f"candidate raised during timing: {_first_line(str(e))}",
                               [str(e), e.traceback, cand.log_tail()]) from e

    def _timing_fields(self, o: TimingOutcome) -> dict[str, Any]:
        """Turn the judge's measurements into findings and result fields."""
        cand_busy_ms = sum(o.cand_ms)
        # Work left running after a call returned shows up as CPU time while the worker idles.
        idle_allow_ms = 20.0 + 0.05 * cand_busy_ms + 2.0 * o.ref_idle_cpu_ms
        if o.cand_idle_cpu_ms > idle_allow_ms:
            self.findings.append(Finding(rule="side_work_after_return", message=(
                f"the candidate used {o.cand_idle_cpu_ms:.1f} ms of CPU while idle between timed calls "
                f"(timed calls took {cand_busy_ms:.1f} ms in all): work continues after a call returns")))
        # Threads the harness itself starts show up in the reference too; only a rise beyond the
        # reference's counts.
        ref_rise = (o.ref_threads_max or 0) - (o.ref_threads_warm or 0)
        if (o.cand_threads_warm is not None and o.cand_threads_max is not None
                and o.cand_threads_max - o.cand_threads_warm > max(ref_rise, 0)):
            self.findings.append(Finding(rule="thread_count_changed", message=(
                f"the candidate's thread count rose from {o.cand_threads_warm} to {o.cand_threads_max} "
                "during timed calls")))
        if o.cand_non_plain_calls:
            self.findings.append(Finding(rule="output_not_plain_tensor", message=(
                f"{o.cand_non_plain_calls} timed calls returned something other than a plain torch.Tensor")))
        if o.spot_mismatches:
            self.findings.append(Finding(rule="output_cached_across_calls", message=(
                f"{len(o.spot_mismatches)} of {o.spot_checks} spot-checked timed calls returned a wrong output "
                f"(cached or skipped work): {o.spot_mismatches[0]}")))
        if o.input_mismatches:
            self.findings.append(Finding(rule="inputs_mutated", message=(
                f"the candidate changed its inputs during {o.input_mismatches} spot-checked timed calls")))
        # Clock cross-check: the judge's round trip must exceed the reported time by about what
        # it does for the reference (pipe and reply overhead), no more.
        over_cand = [rt - t for rt, t in zip(o.cand_round_trip_ms, o.cand_ms)]
        over_ref = [rt - t for rt, t in zip(o.ref_round_trip_ms, o.ref_ms)]
        impossible = sum(1 for x in over_cand if x < -0.05)
        excess = statistics.median(over_cand) - statistics.median(over_ref)
        cand_med = statistics.median(o.cand_ms)
        if impossible or excess > 0.5 + 0.25 * cand_med:
            self.findings.append(Finding(rule="timer_mismatch", message=(
                f"reported call times disagree with the judge's clock (median excess {excess:.3f} ms over the "
                f"reference's overhead, {impossible} calls reported longer than they took)")))
        # Physical floor: the output must at least be written once at the memory roof measured
        # in this run. Faster than half of that is not a speedup but a trick.
        floor_ms = None
        if self.copy_gbps and o.output_bytes:
            floor_ms = o.output_bytes / (self.copy_gbps * 1e9) * 1e3
            if cand_med < 0.5 * floor_ms:
                self.findings.append(Finding(rule="impossible_speedup", message=(
                    f"median call {cand_med:.4f} ms is below half the time needed just to write the "
                    f"{o.output_bytes} output bytes at the measured {self.copy_gbps:.1f} GB/s ({floor_ms:.4f} ms)")))
        self.env["timing"] = {
            "rounds": len(o.ratios), "stopped_by": o.stopped_by, "rel_ci_half_width": o.rel_ci_half_width,
            "spot_checks": o.spot_checks, "cand_idle_cpu_ms": round(o.cand_idle_cpu_ms, 3),
            "ref_idle_cpu_ms": round(o.ref_idle_cpu_ms, 3), "clock_excess_ms": round(excess, 4),
            "cand_threads": o.cand_threads_max, "ref_threads": o.ref_threads_max, "wall_s": round(o.wall_s, 3),
            "output_floor_ms": floor_ms,
        }
        return {"ref_time": TimingStats.from_samples_ms(o.ref_ms), "cand_time": TimingStats.from_samples_ms(o.cand_ms)}


def _is_constant(x: Any) -> bool:
    """Every element of every tensor output is one and the same value."""
    import torch

    from kernelrl.judge.compare import flatten

    values = [t for t in flatten(x) if isinstance(t, torch.Tensor) and t.numel()]
    return bool(values) and all(bool((t == t.reshape(-1)[0]).all()) for t in values)


def _error_line(text: str) -> str:
    """The first compiler or Python error line of a message (compiler commands come first)."""
    for line in text.splitlines():
        if re.search(r"\berror\b[:\s]", line, re.IGNORECASE) and not line.lstrip().startswith(("[", "c++ ", "nvcc ")):
            return line.strip()[:300]
    return _first_line(text)


def _first_line(text: str) -> str:
    for line in text.strip().splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""


@functools.cache
def _llc_bytes() -> int:
    best = 0
    for idx in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            size = (idx / "size").read_text().strip()
        except OSError:
            continue
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
        try:
            best = max(best, int(size.rstrip("KMG")) * mult)
        except ValueError:
            continue
    return best or (32 << 20)


def _evict_bytes(device: str) -> int:
    if device == "cuda":
        return 256 << 20  # larger than any current GPU's L2
    return int(_llc_bytes() * 1.5)
