"""The evaluator: the reward. One long-lived object that judges candidates, one or a batch at a time.

`Evaluator(config)` holds the configuration, a pool of warm workers, the device's timing lane,
the machine's measured peaks and its caches. `evaluate_batch([(task, candidate), ...])` judges
many candidates and returns their results in order; `evaluate(task, candidate)` judges one.

Process model (see the design notes, evaluator protocol):
- the judge (this process) draws the secret seeds, holds the reference's outputs and decides the
  verdict; no program under test and no task code runs here;
- each task's reference runs in a worker of its own (`kernelrl.judge.reference`), which also makes
  every input set from the judge's seeds; each candidate runs in a fresh worker no other program
  touched (`kernelrl.judge.trial`), so no candidate can read the reference's outputs (not even from
  freed memory) or another candidate's;
- candidates of one task are checked in parallel (`concurrency`), then timed together with the
  reference in one interleaved measurement (`kernelrl.judge.timer`), holding the device's lane
  exclusively (`kernelrl.judge.lanes`); the reference is timed once per group;
- a task whose reference always gives the same output flags every candidate `degenerate_task`,
  with no speedup; a task whose reference cannot load or run gives `task_error` results;
- measured facts become findings in `kernelrl.checks.dynamic`, the policy decides which reject;
  every crash, hang, exit or OOM of a candidate is a verdict, never an exception here.

Guarantees: results are cached by (task source, size, device, policy, candidate source, config
fingerprint): the same program is judged once per evaluator; a batch never raises for a
candidate's or a task's fault.

Does not guarantee timings are comparable across machines or across runs under other load:
speedups are ratios measured side by side, which is what it guarantees to be fair.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import secrets
import statistics
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelrl.candidate import Candidate
from kernelrl.checks import dynamic
from kernelrl.checks.dynamic import Floors
from kernelrl.checks.llm_judge import CACHE_FILE as LLM_JUDGE_CACHE
from kernelrl.checks.llm_judge import JudgeRequest, LLMJudge, LLMJudgeConfig
from kernelrl.checks.policy import PolicyName, get_policy
from kernelrl.judge.baseline import Baseline
from kernelrl.judge.device import Device, evict_bytes
from kernelrl.judge.group import COMPILED, Group, run_groups
from kernelrl.judge.lanes import Lane
from kernelrl.judge.pool import WorkerPool
from kernelrl.judge.profile import TaskProfile
from kernelrl.judge.reference import (
    LoadSpec,
    ReferenceFailed,
    ReferenceSession,
    TaskInfo,
)
from kernelrl.judge.roofline import (
    MachinePeaks,
    demonstrated,
    floors,
    machine_peaks,
    roofline_pct,
    save_peaks,
)
from kernelrl.judge.sandbox import SandboxConfig
from kernelrl.judge.timer import (
    GroupTiming,
    TimingConfig,
)
from kernelrl.judge.trial import Trial, Verdict, first_line
from kernelrl.result import EvalResult, Finding, Severity, Status, TimingStats
from kernelrl.tasks.task import Size, Task

if TYPE_CHECKING:
    from kernelrl.judge.calibration import Calibration

__all__ = ["EvalConfig", "Evaluator", "ReferenceFailed", "evaluate"]


def default_cache_dir() -> Path:
    return Path(os.environ.get("KERNELRL_CACHE") or Path.home() / ".cache" / "kernelrl")


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    device: Device = Device.CPU
    # Which GPU of the machine (cuda only): workers see only that one, as their cuda:0. None: the
    # first visible one. One evaluator per GPU gives one timing lane per GPU.
    device_index: int | None = None
    size: Size = Size.SMALL
    timeout_s: float = 300.0  # wall clock for loading and checking one candidate (and for loading a task)
    # Added to timeout_s for a candidate that compiles (C++ or CUDA not in the build cache, Triton,
    # the compiled reference): a hang then costs timeout_s, a cold build is not cut short.
    build_timeout_s: float = 300.0
    policy: PolicyName = PolicyName.OPEN
    n_correctness: int = 5
    tol_scale: float = 1.0  # multiplies the dtype tolerances (kernelrl.judge.compare)
    static_checks: bool = True
    concurrency: int = 2  # candidates built and checked at once (timing never overlaps on a device)
    compile_baseline: bool = False  # also time each task's reference under torch.compile (once per task)
    roofline: bool = True  # measure this machine's peaks (once, cached) and give every result its roofline %
    floor_slack: float = dynamic.FLOOR_SLACK  # below this share of the floor: impossible_speedup
    cache_dir: Path = field(default_factory=default_cache_dir)
    timing: TimingConfig = field(default_factory=TimingConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    llm_judge: LLMJudgeConfig = field(default_factory=LLMJudgeConfig)
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
        if self.build_timeout_s < 0:
            raise ValueError("build_timeout_s must be >= 0")
        if self.n_correctness < 2:
            raise ValueError("n_correctness must be >= 2 (one plain set, one perturbed)")
        if self.tol_scale <= 0:
            raise ValueError("tol_scale must be positive")
        if self.concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if not 0 < self.floor_slack <= 1:
            raise ValueError("floor_slack must be in (0, 1]")


def config_fingerprint(config: EvalConfig) -> str:
    """What makes two evaluations comparable: every setting but where caches live and how many at once."""
    from kernelrl.config import to_dict

    d = to_dict(config)
    for key in ("cache_dir", "concurrency"):
        d.pop(key, None)
    d["llm_judge"].pop("cache_path", None)
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


# Task information is cached on disk per task source, size and overrides; bump when what it holds
# (constants resolution, profile fields, degeneracy rules) changes meaning.
_TASK_INFO_VERSION = 2  # 2: sizes also shrink tuple elements, literals, and count FLOPs


class Evaluator:
    """See the module docstring. Safe to use from several threads; close it when done."""

    def __init__(self, config: EvalConfig | None = None, *, warm_workers: int | None = None) -> None:
        self.config = config or EvalConfig()
        self.fingerprint = config_fingerprint(self.config)
        cfg = self.config
        self._results: OrderedDict[tuple[str, ...], EvalResult] = OrderedDict()  # bounded: see _remember
        self._tasks: dict[str, TaskInfo] = {}
        self._baselines: dict[str, Baseline] = {}
        self._lock = threading.Lock()
        self._rng = random.Random(secrets.randbits(128))  # the secret: never leaves this process
        self._rng_lock = threading.Lock()
        # Enough started workers for a reference and `concurrency` candidates at once.
        self.lane = Lane(cfg.cache_dir, cfg.device, cfg.device_index)
        self.pool = WorkerPool(config=cfg.sandbox, device=cfg.device, device_index=cfg.device_index,
                               size=cfg.concurrency + 1 if warm_workers is None else warm_workers,
                               starting=lambda: self.lane.work(uses_device=False))
        self._peaks: MachinePeaks | None = None
        self._peaks_error = ""
        self._peaks_lock = threading.RLock()
        self._remeasured = False  # peaks are re-measured once, the first time a candidate beats a floor
        self._llm: LLMJudge | None = None
        if cfg.llm_judge.enabled:
            self._llm = LLMJudge(dataclasses.replace(cfg.llm_judge, cache_path=cfg.cache_dir / LLM_JUDGE_CACHE))
        self.evaluations = 0  # candidates judged (cache hits excluded)

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.pool.close()

    # -- public API ---------------------------------------------------------------------------

    def evaluate(self, task: Task, candidate: Candidate | str) -> EvalResult:
        return self.evaluate_batch([(task, candidate)])[0]

    def evaluate_batch(self, items: Sequence[tuple[Task, Candidate | str]], *,
                       on_result: Callable[[int, EvalResult], None] | None = None) -> list[EvalResult]:
        """Judge every (task, candidate) pair; results in the order given. Never raises for a
        candidate's or a task's fault."""
        pairs = [(task, Candidate(source=c) if isinstance(c, str) else c) for task, c in items]
        results: list[EvalResult | None] = [None] * len(pairs)
        todo: dict[str, dict[str, list[int]]] = {}  # task key -> candidate hash -> positions
        tasks: dict[str, Task] = {}
        for i, (task, cand) in enumerate(pairs):
            with self._lock:
                hit = self._results.get(self._key(task, cand))
            if hit is not None:
                results[i] = hit
                if on_result:
                    on_result(i, hit)
                continue
            key = self._task_key(task)
            tasks[key] = task
            todo.setdefault(key, {}).setdefault(cand.hash, []).append(i)

        def done(positions: list[int], res: EvalResult) -> None:
            task, cand = pairs[positions[0]]
            with self._lock:
                self._remember(self._key(task, cand), res)
                self.evaluations += 1
            for i in positions:
                results[i] = res
                if on_result:
                    on_result(i, res)

        groups = [self._group(tasks[k], {h: (pairs[pos[0]][1], pos) for h, pos in by_hash.items()}, done)
                  for k, by_hash in todo.items()]
        run_groups(groups, device=self.config.device, width=self.config.concurrency)
        return [r for r in results if r is not None]

    def baseline(self, task: Task, *, compile: bool = True) -> Baseline:
        """Eager and torch.compile times of the task's reference, interleaved in one measurement."""
        key = self._task_key(task)
        with self._lock:
            known = self._baselines.get(key)
        if known is not None and (known.compile_ms is not None or known.compile_error or not compile):
            return known
        self._run_group(task, {}, lambda positions, res: None, baseline=True, compile=compile)
        with self._lock:
            found = self._baselines.get(key)
        if found is None:
            raise ReferenceFailed(f"{task.name}: the reference could not be timed")
        return found

    def calibrate(self, task: Task, *, runs: int = 5) -> list[Calibration]:
        """A/A check (`kernelrl.judge.calibration`): identical code must measure 1.00."""
        from kernelrl.judge.calibration import calibrate

        return calibrate(self, task, runs=runs)

    def task_info(self, task: Task) -> TaskInfo:
        """Constants, profile and degeneracy of the task at the configured size (cached)."""
        info = self._cached_info(task)
        if info is None:
            session = self._session(task)
            try:
                info = self._load(session, task)
            finally:
                session.close()
        return info

    def profile(self, task: Task) -> TaskProfile | None:
        return self.task_info(task).profile

    def reference_outputs(self, task: Task, plans: Sequence[Any]) -> tuple[list[list[Any]], list[Any]]:
        """The task's inputs and its reference's outputs for the given input plans (for filters
        such as `kernelrl.tasks.degeneracy`); task code runs in a reference worker."""
        session = self._session(task)
        try:
            self._load(session, task)
            values, outputs, _ = session.make(list(plans), run=True)
            return values, outputs
        finally:
            session.close()

    def peaks(self, *, remeasure: bool = False) -> MachinePeaks | None:
        """This machine's measured peaks (measured once, cached); None when they cannot be measured.

        Measured holding the device's lane, so no evaluation of ours competes with the measurement.
        """
        with self._peaks_lock:
            if self.config.roofline and (remeasure or (self._peaks is None and not self._peaks_error)):
                try:
                    with self.lane.timing():
                        self._peaks = machine_peaks(device=self.config.device, sandbox=self.config.sandbox,
                                                    cache_dir=self.config.cache_dir,
                                                    device_index=self.config.device_index, remeasure=remeasure)
                except Exception as e:  # noqa: BLE001 - no roofline, said so in results
                    self._peaks_error = f"{type(e).__name__}: {e}"
            return self._peaks

    def _floors(self, profile: TaskProfile, reference_ms: float) -> tuple[MachinePeaks, Floors] | None:
        """Floors for a task, from peaks no lower than what its reference was just seen to reach."""
        peaks = self.peaks()
        if peaks is None:
            return None
        raised = demonstrated(peaks, profile, reference_ms)
        if raised is not None:
            with self._peaks_lock:
                self._peaks = peaks = raised
            save_peaks(raised, cache_dir=self.config.cache_dir, device_index=self.config.device_index)
        return peaks, floors(profile, peaks)

    # -- keys and caches ----------------------------------------------------------------------

    # Results kept per evaluator: enough for any batch and its repeats; the oldest go first, so a
    # long-lived server's memory stays bounded.
    RESULT_CACHE_SIZE = 8192

    def _remember(self, key: tuple[str, ...], result: EvalResult) -> None:
        self._results[key] = result
        self._results.move_to_end(key)
        while len(self._results) > self.RESULT_CACHE_SIZE:
            self._results.popitem(last=False)

    def _key(self, task: Task, cand: Candidate) -> tuple[str, ...]:
        cfg = self.config
        return (task.source_hash, str(cfg.size), str(cfg.device), str(cfg.policy), cand.hash, self.fingerprint)

    def _task_key(self, task: Task) -> str:
        presets = json.dumps(task.presets.get(str(self.config.size), {}), sort_keys=True)
        text = f"{task.source_hash}|{self.config.size}|{presets}|{json.dumps(self.config.constants, sort_keys=True)}"
        return hashlib.sha256(text.encode()).hexdigest()[:20]

    def _info_path(self, task: Task) -> Path:
        return self.config.cache_dir / "tasks" / f"{self._task_key(task)}-v{_TASK_INFO_VERSION}.json"

    def _cached_info(self, task: Task) -> TaskInfo | None:
        key = self._task_key(task)
        with self._lock:
            if key in self._tasks:
                return self._tasks[key]
        path = self._info_path(task)
        try:
            info = TaskInfo.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            return None
        with self._lock:
            self._tasks[key] = info
        return info

    def _store_info(self, task: Task, info: TaskInfo) -> None:
        with self._lock:
            self._tasks[self._task_key(task)] = info
        path = self._info_path(task)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(info.to_dict()))
        tmp.replace(path)

    def _secret(self) -> random.Random:
        """A generator for one group, seeded from the evaluator's secret one."""
        with self._rng_lock:
            return random.Random(self._rng.getrandbits(128))

    # -- one task's group ---------------------------------------------------------------------

    def _session(self, task: Task, rng: random.Random | None = None) -> ReferenceSession:
        cfg = self.config
        rng = rng or self._secret()
        spec = LoadSpec(task=task, size=cfg.size, overrides=dict(cfg.constants), device=cfg.device,
                        threads=cfg.sandbox.effective_threads, init_seed=rng.getrandbits(31),
                        evict_bytes=evict_bytes(cfg.device), cache_root=str(cfg.cache_dir))
        return ReferenceSession(spec, pool=self.pool, rng=rng, timeout_s=cfg.timeout_s)

    def _load(self, session: ReferenceSession, task: Task) -> TaskInfo:
        info = self._cached_info(task)
        with self.lane.work(uses_device=True):
            session.load(constants=info.constants if info else None, profile=info is None)
        if info is None:
            info = TaskInfo(constants=session.constants, profile=session.profile)
            self._store_info(task, info)
        return info

    def _group(self, task: Task, members: dict[str, tuple[Candidate, list[int]]],
               done: Callable[[list[int], EvalResult], None], *, baseline: bool = False, compile: bool = True,
               trusted: frozenset[str] = frozenset()) -> Group:
        return Group(self, task, members, done, baseline=baseline, compile=compile, trusted=trusted)

    def _run_group(self, task: Task, members: dict[str, tuple[Candidate, list[int]]],
                   done: Callable[[list[int], EvalResult], None], *, baseline: bool = False,
                   compile: bool = True, trusted: frozenset[str] = frozenset()) -> None:
        """One task's group from start to end (baselines and calibration use it)."""
        run_groups([self._group(task, members, done, baseline=baseline, compile=compile, trusted=trusted)],
                   device=self.config.device, width=1)

    def _record_baseline(self, task: Task, timing: GroupTiming, compiled: Trial | None, known: Baseline | None) -> None:
        cfg = self.config
        if not timing.reference_ms:
            return
        eager_ms = statistics.median(timing.reference_ms)
        compile_ms, error = (known.compile_ms, known.compile_error) if known else (None, "")
        if compiled is not None:
            ct = timing.candidates.get(COMPILED)
            if compiled.verdict is not None:
                error = compiled.verdict.message
            elif ct is not None and ct.speedup:
                compile_ms, error = eager_ms / ct.speedup, ""
            elif ct is not None and ct.failure is not None:
                error = first_line(ct.failure.message)
        with self._lock:
            self._baselines[self._task_key(task)] = Baseline(task=task.name, device=str(cfg.device),
                                                             size=str(cfg.size), eager_ms=eager_ms,
                                                             compile_ms=compile_ms, compile_error=error)

    def cached_baseline(self, task: Task) -> Baseline | None:
        with self._lock:
            return self._baselines.get(self._task_key(task))

    # -- verdicts -----------------------------------------------------------------------------

    def _finish(self, task: Task, trial: Trial, timing: GroupTiming | None, info: TaskInfo,
                env: dict[str, Any]) -> EvalResult:
        if trial.verdict is not None:
            return self._result(task, trial.candidate, trial.verdict, trial.findings, trial.fields,
                                {**env, **{k: v for k, v in trial.env.items() if k != "state_before"}}, trial.started)
        assert timing is not None
        ct = timing.candidates[trial.candidate.hash]
        fields = dict(trial.fields)
        fields["ref_time"] = TimingStats.from_samples_ms(timing.reference_ms) if timing.reference_ms else None
        run_env = {**env, **{k: v for k, v in trial.env.items() if k != "state_before"},
                   "timing": {"rounds": timing.rounds, "calls_per_sample": timing.calls_per_sample,
                              "stopped_by": ct.stopped_by, "group_size": len(timing.candidates),
                              "rel_ci_half_width": ct.rel_ci_half_width, "wall_s": round(timing.wall_s, 3),
                              "lane_wait_s": round(self.lane.waited_s, 3)}}
        if ct.failure is not None:
            status = Status.TIMEOUT if ct.failure.kind == "timeout" else Status.RUNTIME_ERROR
            if ct.failure.kind == "protocol":
                trial.findings.append(dynamic.channel_forged(first_line(ct.failure.message)))
                status = Status.FLAGGED
            verdict = Verdict(status=status, message=f"candidate failed during timing: {first_line(ct.failure.message)}",
                              errors=[ct.failure.message, ct.failure.log_tail])
            return self._result(task, trial.candidate, verdict, trial.findings, fields, run_env, trial.started)
        fields["cand_time"] = TimingStats.from_samples_ms(ct.times_ms)
        found, figures = dynamic.timing_findings(ct.facts)
        trial.findings.extend(found)
        run_env["timing"].update(figures, spot_checks=ct.facts.spot_checks)
        cand_ms = statistics.median(ct.times_ms)
        ref_ms = statistics.median(timing.reference_ms)
        got = self._floors(info.profile, ref_ms) if info.profile is not None else None
        if got is not None:
            assert info.profile is not None
            peaks, f = got
            found = dynamic.impossible_speedup(cand_ms, f, slack=self.config.floor_slack)
            if found is not None and not self._remeasured:
                # Before refusing, make sure the floor is not an artefact of a disturbed measurement.
                self._remeasured = True
                remeasured = self.peaks(remeasure=True)
                if remeasured is not None:
                    peaks, f = remeasured, floors(info.profile, remeasured)
                    found = dynamic.impossible_speedup(cand_ms, f, slack=self.config.floor_slack)
            run_env["roofline"] = {"memory_floor_ms": f.memory_ms, "compute_floor_ms": f.compute_ms,
                                   "bandwidth_gbs": peaks.bandwidth_gbs, "tflops": f.tflops,
                                   "flops": info.profile.flops, "min_bytes": info.profile.min_bytes,
                                   "peaks": peaks.source}
            fields["roofline_pct"] = roofline_pct(cand_ms, f)
            fields["ref_roofline_pct"] = roofline_pct(ref_ms, f)
            if found is not None:
                trial.findings.append(found)
        elif self._peaks_error:
            run_env["roofline"] = {"error": self._peaks_error}
        fields["speedup"], fields["speedup_ci"] = ct.speedup, ct.speedup_ci
        if self._llm is not None:
            self._ask_llm(task, trial, fields, run_env)
        return self._result(task, trial.candidate, None, trial.findings, fields, run_env, trial.started)

    def _ask_llm(self, task: Task, trial: Trial, fields: dict[str, Any], env: dict[str, Any]) -> None:
        assert self._llm is not None
        cfg = self.config
        floor = env.get("roofline", {})
        known = [v for v in (floor.get("memory_floor_ms"), floor.get("compute_floor_ms")) if v]
        request = JudgeRequest(task_name=task.name, task_source=task.source, candidate_source=trial.candidate.source,
                               speedup=fields["speedup"], speedup_ci=fields["speedup_ci"], ref_time=fields["ref_time"],
                               cand_time=fields["cand_time"], roofline_pct=fields.get("roofline_pct"),
                               floor_ms=max(known) if known else None, max_abs_err=fields.get("max_abs_err"),
                               max_rel_err=fields.get("max_rel_err"), device=str(cfg.device), policy=str(cfg.policy),
                               findings=tuple(trial.findings))
        verdict = self._llm.review(request)
        if verdict is not None:
            env["llm_judge"] = verdict.to_dict()
            found = self._llm.finding(verdict)
            if found is not None:
                trial.findings.append(found)

    def _result(self, task: Task, cand: Candidate, verdict: Verdict | None, findings: list[Finding],
                fields: dict[str, Any], env: dict[str, Any], started: float | None = None) -> EvalResult:
        """The result, with the policy applied to every finding once."""
        cfg = self.config
        findings = get_policy(cfg.policy).apply(findings)
        rejecting = sorted({f.rule for f in findings if f.severity is Severity.REJECT})
        fields = dict(fields)
        if verdict is None:
            if rejecting:
                verdict = Verdict(status=Status.FLAGGED, message=f"flagged: {', '.join(rejecting)}",
                                  errors=[f.message for f in findings if f.severity is Severity.REJECT])
            else:
                verdict = Verdict(status=Status.CORRECT, message=f"correct, {fields['speedup']:.3g}x")
        elif verdict.status in (Status.INCORRECT, Status.CORRECT) and rejecting:
            # Wrong, and a defence saw why: the rule is what teaches the next prompt. Correct
            # without timing (an interpreted run) but with a rejecting finding: refused as well.
            verdict = dataclasses.replace(verdict, status=Status.FLAGGED,
                                          message=f"flagged: {', '.join(rejecting)} ({verdict.message})")
        if verdict.status is not Status.CORRECT:
            for key in ("speedup", "speedup_ci", "roofline_pct"):
                fields.pop(key, None)
        fields.update(verdict.extra)
        return EvalResult(task=task.name, status=verdict.status, message=verdict.message,
                          errors=[e for e in verdict.errors if e], findings=findings, device=cfg.device,
                          size=cfg.size, policy=cfg.policy, candidate_hash=cand.hash, environment=env,
                          eval_time_s=round(time.monotonic() - started, 3) if started else None, **fields)


def evaluate(task: Task, candidate: Candidate | str, config: EvalConfig | None = None) -> EvalResult:
    """Judge one candidate with a short-lived evaluator (for one-off use; keep an `Evaluator` for many)."""
    with Evaluator(config, warm_workers=3) as ev:  # the task, its timed copy, one candidate
        return ev.evaluate(task, candidate)
