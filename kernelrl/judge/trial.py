"""A trial: one candidate's way through the judge up to timing.

Static checks in the judge; then, in a worker no other program touched: the build and the
construction (with the reference's init arguments, init seed and, when names and shapes match,
its parameters), and the correctness runs on the judge's input sets, compared in the judge with
the reference's outputs. A trial ends either with a verdict (`Verdict`) or as a survivor whose
worker goes on to timing. A Triton candidate on a CPU runs under Triton's interpreter
(`kernelrl.judge.harness.toolchain`): its outputs are checked as any other's, but its times mean nothing,
so it is never timed: a correct one ends here, `correct` with `Timing.INTERPRETED` and no speedup.
A CUDA candidate on a CPU ends at its build: nvcc checks its device code, nothing CUDA loads.
The task's own programs go the same way, under trial keys of their own: the timed reference and
the A/A copy (`TIMED_REFERENCE`, `AA_REFERENCE`: `reference_program`), and the compiled reference
(`COMPILED`).

Guarantees:
- every crash, hang, exit, segfault or protocol violation of the candidate ends the trial with a
  verdict (`runtime_error`, `timeout`, `flagged`: result_channel_forged), never an exception;
- the candidate's worker is killed as soon as its trial ends with a verdict;
- findings are only recorded here (`kernelrl.checks.dynamic` decides what each fact means); the
  policy is applied by the verdict (`kernelrl.judge.timing.verdict`), once, to all of a candidate's findings;
- correctness goes one input set per message, and each output is compared as it arrives and
  dropped: the judge keeps a candidate's comparisons and the digests of its outputs
  (`compare.output_digest`), never its outputs, so a trial adds at most one output to the judge.

Does not bound the judge's own copy of the sets: the group holds every set and its reference
output for all its trials, large ones in files (`kernelrl.judge.spill`; `kernelrl.judge.timing.inputs.memory_need`
counts them before anything starts).

Does not time anything: `kernelrl.judge.timing.timer` does, for all survivors of a task together.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from kernelrl.candidate import Candidate, Language
from kernelrl.checks import dynamic
from kernelrl.checks.policy import get_policy
from kernelrl.checks.static import check_source
from kernelrl.judge.eval_config import EvalConfig
from kernelrl.judge.harness import protocol as P
from kernelrl.judge.harness.channel import ChannelProtocolError, ChannelTimeout
from kernelrl.judge.harness.compare import NEAR_FACTOR, Comparison, Mismatch, compare_outputs, flatten, output_digest
from kernelrl.judge.harness.device import Device
from kernelrl.judge.harness.devmem import Blame, DeviceMemory, blame
from kernelrl.judge.isolation import compilecache
from kernelrl.judge.isolation.builds import build_dir, has_build, seal, sealed_dir, unseal
from kernelrl.judge.isolation.exchange import Answer
from kernelrl.judge.isolation.sandbox import Worker, WorkerDied
from kernelrl.judge.reference import InputSet, LoadSpec, ReferenceSession
from kernelrl.judge.timing.verdict import Checked, Verdict
from kernelrl.result import Containment, Finding, Severity, Status, Timing
from kernelrl.tasks.task import Task

COMPILED = "__compiled_reference__"  # the trial key of the task's reference under torch.compile
# The trial key of the task's reference loaded as a program, exactly as candidates are: it is the
# reference that is timed, so the reference and the candidates are measured in processes with
# the same history (a fresh pool worker, a program load, the correctness runs), never in the task
# worker that made the inputs and outputs (which measured up to 30 % slower: benchmarks/README.md).
TIMED_REFERENCE = "__timed_reference__"
# The trial key of the group's A/A copy: the reference once more, timed as a member; identical code
# must measure 1.00 against the reference, or the group's measurement is noise (EvalConfig.aa_tolerance).
AA_REFERENCE = "__aa_reference__"


def reference_program(task: Task, *, copy: str = "the task's reference") -> Candidate:
    """The task's reference as a program: its own source, with `ModelNew` naming `Model`."""
    return Candidate(source=task.source + f"\n\n# {copy}, loaded as a program\nModelNew = Model\n")


class _End(Exception):
    def __init__(self, verdict: Verdict):
        super().__init__(verdict.message)
        self.verdict = verdict


@dataclass(kw_only=True)
class Established:
    """What a trial's checks established so far: the figures `Checked` carries to the verdict."""

    build_cached: bool = False
    build_time_s: float | None = None
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    parameters_shared: bool | None = None
    timing: Timing = Timing.MEASURED  # INTERPRETED: a Triton program on a CPU, checked but never timed
    peak_device_bytes: int | None = None  # the most its correctness runs allocated on a device; None on a CPU


@dataclass(kw_only=True)
class CheckSpans:
    """Where a trial's checks' time went (seconds): a worker from the pool, the load, the model and
    correctness runs (`kernelrl.result.GroupPhases` sums them over a group)."""

    wait_s: float = 0.0
    load_s: float = 0.0
    correctness_s: float = 0.0


@dataclass(kw_only=True)
class Trial:
    candidate: Candidate
    compiled_reference: bool = False  # the task's own reference under torch.compile (a baseline)
    trusted: bool = False  # the judge's own program (calibration copies): no static checks
    findings: list[Finding] = field(default_factory=list)
    worker: Worker | None = None
    verdict: Verdict | None = None
    found: Established = field(default_factory=Established)  # what the trial measured so far
    state_before: dict[str, P.Setting] = field(default_factory=dict)  # the worker's global state after loading
    state_after_load: dict[str, P.Setting] = field(default_factory=dict)  # after the import, before construction
    started: float = field(default_factory=time.monotonic)
    spans: CheckSpans = field(default_factory=CheckSpans)

    @property
    def survived(self) -> bool:
        return self.verdict is None and self.worker is not None

    def checked(self) -> Checked:
        """What the trial established, for the verdict (`kernelrl.judge.timing.verdict`)."""
        f = self.found
        return Checked(candidate_hash=self.candidate.hash, findings=tuple(self.findings),
                       build_time_s=f.build_time_s, build_cached=f.build_cached,
                       max_abs_err=f.max_abs_err, max_rel_err=f.max_rel_err,
                       parameters_shared=f.parameters_shared, timing=f.timing,
                       peak_device_bytes=f.peak_device_bytes, eval_time_s=round(time.monotonic() - self.started, 3))

    def end(self, verdict: Verdict) -> None:
        self.verdict = verdict
        self.close()

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
            self.worker = None


def static_verdict(source: str, language: Language, *, device: Device, static_findings: list[Finding]) -> Verdict | None:
    """What the source alone decides (it does not parse, defines no `ModelNew`, needs a GPU, or a
    rule rejects it): nothing needs a worker or the reference to say so."""
    try:
        compile(source, "<candidate>", "exec")
    except (SyntaxError, ValueError) as e:
        msg, line = (e.msg, e.lineno) if isinstance(e, SyntaxError) else (str(e), None)
        return Verdict(status=Status.COMPILE_ERROR, message=f"candidate does not parse: {msg} (line {line})",
                       errors=(str(e),))
    if "ModelNew" not in source:  # the name nowhere, not even in a string: the worker could not find it
        return Verdict(status=Status.COMPILE_ERROR, message="candidate does not build: the program defines no "
                                                            "`ModelNew` (the name appears nowhere in it)")
    rejecting = [f for f in static_findings if f.severity is Severity.REJECT]
    if rejecting:
        return Verdict(status=Status.FLAGGED,
                       message=f"flagged by static checks: {', '.join(sorted({f.rule for f in rejecting}))}",
                       errors=tuple(f"line {f.line}: {f.message}" if f.line else f.message for f in rejecting))
    return None


def compiles(trial: Trial, *, build_cached: bool) -> bool:
    """Whether this trial compiles anything: the compiled reference, Triton, or a C++/CUDA build not cached.

    Triton compiles at its first run into the Triton runtime's own cache, so every Triton run counts as cold.
    """
    language = trial.candidate.language
    if trial.compiled_reference or language is Language.TRITON:
        return True
    return language in (Language.CPP, Language.CUDA) and not build_cached


def run_trial(trial: Trial, *, reference: ReferenceSession, spec: LoadSpec, sets: list[InputSet], cache_dir: Path,
              timeout_s: float, build_timeout_s: float = 0.0, tol_scale: float,
              device_work: Callable[[], AbstractContextManager[None]] = nullcontext) -> None:
    """Build, construct and check one candidate; sets `trial.verdict` or leaves a survivor.

    The trial has `timeout_s` from its start, plus `build_timeout_s` when it compiles (`compiles`).
    The model's construction, its copy of the reference's parameters and the correctness runs are
    inside `device_work()` (the device's lock; on a GPU the build and import are not, so they
    overlap another group's measurement, while work the program puts on the device does not land
    in that measurement, nor in the idle probe that follows each of its samples); time spent
    waiting for it is not the candidate's.
    """
    # The program's build folder, looked at once: it decides the limit and is where the worker builds.
    # A fully contained worker builds in its scratch (`scratch`): a sealed build is copied in first.
    bdir = None if trial.compiled_reference else build_dir(cache_dir, trial.candidate.source, spec.device)
    full = trial.worker is not None and trial.worker.containment is Containment.FULL
    scratch = trial.worker.scratch() if full and trial.worker is not None else None
    sealed = sealed_dir(cache_dir, trial.candidate.source, spec.device)
    if bdir is not None:
        trial.found.build_cached = scratch is not None and unseal(sealed, scratch) if full else has_build(bdir)
    # What torch.compile compiled before (`kernelrl.judge.isolation.compilecache`): the task's own graphs for
    # every program of the task, a program's own for that source only.
    task_graphs = compilecache.task_entry(cache_dir, spec.task.source, reference.loaded.constants, spec.device)
    own_graphs = (task_graphs if trial.compiled_reference else
                  compilecache.program_entry(cache_dir, trial.candidate.source, reference.loaded.constants, spec.device))
    given = compilecache.give(task_graphs, scratch) if scratch is not None else {}
    if scratch is not None and own_graphs != task_graphs:
        compilecache.give(own_graphs, scratch)
    compiling = compiles(trial, build_cached=trial.found.build_cached)
    limit = timeout_s + (build_timeout_s if compiling else 0.0)
    deadline = trial.started + limit
    interpreted = trial.candidate.language.interpreted_on(str(spec.device))
    if interpreted:
        trial.found.timing = Timing.INTERPRETED
    clock, loaded = time.monotonic(), False  # a part's time is its own, ended or failed (a hang's 20 s)
    try:
        _load(trial, reference, spec, cache_dir, bdir, deadline)
        if scratch is not None and not trial.found.build_cached:
            seal(scratch, sealed)  # what it built, checked, for the next worker that loads this program
        asked = time.monotonic()
        trial.spans.load_s, loaded = asked - clock, True
        with device_work():
            clock = time.monotonic()
            deadline += clock - asked
            _construct(trial, reference, spec, deadline)
            _correctness(trial, reference, sets, deadline, tol_scale, spec.allow_tf32)
        if scratch is not None:  # its runs compiled what it compiles (torch.compile is lazy)
            compilecache.keep(scratch, own_graphs, compilecache.TASK_CACHES if trial.compiled_reference
                              else compilecache.PROGRAM_CACHES, given=given)
        if interpreted:
            raise _End(Verdict(status=Status.CORRECT, message=(
                "correct under Triton's interpreter (CPU); not timed: interpreted times are not the kernel's")))
    except _End as e:
        trial.end(e.verdict)
    except ChannelTimeout:
        tail = trial.worker.log_tail() if trial.worker else ""
        trial.end(Verdict(status=Status.TIMEOUT, message=f"candidate did not finish within {limit:g} s",
                          errors=(tail,)))
    except WorkerDied as e:
        trial.end(Verdict(status=Status.RUNTIME_ERROR, message=f"candidate crashed: {e}", errors=(e.log_tail,)))
    except ChannelProtocolError as e:
        trial.findings.append(dynamic.channel_forged(str(e)))
        trial.end(Verdict(status=Status.FLAGGED, message="flagged: result_channel_forged", errors=(str(e),)))
    finally:
        if loaded:
            trial.spans.correctness_s = time.monotonic() - clock
        else:
            trial.spans.load_s = time.monotonic() - clock
        if scratch is not None:
            scratch.close()


def _load(trial: Trial, reference: ReferenceSession, spec: LoadSpec, cache_dir: Path, bdir: Path | None,
          deadline: float) -> None:
    worker = trial.worker
    assert worker is not None
    if trial.compiled_reference:
        answer = worker.request(spec.header(profile=False, compile_mode="default"), reference.loaded.constants,
                                deadline=deadline)
        build_s = answer.header.load_s if not answer.failed else 0.0
    else:
        source = trial.candidate.source
        answer = worker.request(P.LoadProgram(
            source=source, constants=reference.loaded.constants, device=str(spec.device), threads=spec.threads,
            evict_bytes=spec.evict_bytes, build_dir=str(bdir), cache_root=str(cache_dir),
            headers_dir=spec.headers_dir, allow_tf32=spec.allow_tf32), deadline=deadline)
        build_s = answer.header.build_s if not answer.failed else 0.0
    if answer.failed:
        h = answer.header
        status = Status.COMPILE_ERROR if h.phase is P.Phase.COMPILE else Status.RUNTIME_ERROR
        what = "does not build" if h.phase is P.Phase.COMPILE else "failed to initialise"
        raise _End(Verdict(status=status, message=f"candidate {what}: {error_line(h.message)}",
                           errors=(h.message, h.traceback, worker.log_tail())))
    trial.found.build_time_s = float(build_s)
    if not trial.compiled_reference:
        _note(trial, dynamic.constants_overridden(answer.header.constants_overridden))
    trial.state_before = dict(answer.header.state_before)
    trial.state_after_load = dict(answer.header.state_after)


def _construct(trial: Trial, reference: ReferenceSession, spec: LoadSpec, deadline: float) -> None:
    """The candidate's model (a compiled reference was made at load), then the reference's
    parameters copied into it, under the device's lock (`run_trial`)."""
    worker = trial.worker
    assert worker is not None
    state_after = trial.state_after_load
    if not trial.compiled_reference:
        made = worker.request(P.Construct(init_seed=spec.init_seed), reference.loaded.init_inputs, deadline=deadline)
        if made.failed:
            raise _End(Verdict(status=Status.RUNTIME_ERROR,
                               message=f"candidate failed to initialise: {error_line(made.header.message)}",
                               errors=(made.header.message, made.header.traceback, worker.log_tail())))
        state_after = dict(made.header.state_after)
    for found in dynamic.global_state_changed("load", trial.state_before, state_after):
        _note(trial, found)
    state = reference.state()
    if state:
        loaded = worker.command(P.Kind.LOAD_STATE, state, deadline=deadline)
        trial.found.parameters_shared = bool(not loaded.failed and loaded.header.loaded)


def _correctness(trial: Trial, reference: ReferenceSession, sets: list[InputSet], deadline: float, tol_scale: float,
                 tf32: bool) -> None:
    worker = trial.worker
    assert worker is not None
    # One run per message, the first set run twice (two messages), each output compared as it
    # arrives and then dropped: the worker holds one set and one output at a time, and the judge
    # a candidate's output only while it compares it (the first run's until the second is compared
    # with it, in a file where a set that large would be). Kept per set: the comparison, the
    # output's digest (to tell an output given again), and whether a wrong output was one value
    # throughout.
    compared: list[Comparison] = []
    digests: list[str] = []
    constant: list[bool] = []
    twice: Comparison | None = None
    first: object = None
    changed: list[bool] = []
    changed_after: list[bool] = []
    thread_rises: list[int] = []
    child_rises: list[int] = []
    state_after: dict[str, P.Setting] = {}
    runs = [0, *range(len(sets))]  # set 0 twice, then every other set once
    for n, i in enumerate(runs):
        s = sets[i]
        ran = _run(trial, worker, s.values, deadline)
        if ran.failed:
            _idle_census(trial, worker)
            h = ran.header
            raise _End(Verdict(status=Status.RUNTIME_ERROR, message=f"candidate raised: {first_line(h.message)}",
                               errors=(h.message, h.traceback, worker.log_tail())))
        got = list(ran.payload["outputs"])
        reports = (ran.header.inputs_changed, ran.header.changed_after_return, ran.header.thread_rises,
                   ran.header.child_rises)
        if len(got) != 1 or any(len(r) != 1 for r in reports):
            raise ChannelProtocolError(f"{len(got)} outputs and {[len(r) for r in reports]} reports for one run")
        if n == len(runs) - 1:
            # Watched the moment the last call returned, before the judge spends time comparing:
            # work a call left running (a forked child writing its output later) is seen now.
            _idle_census(trial, worker)
        changed += ran.header.inputs_changed
        changed_after += ran.header.changed_after_return
        thread_rises += ran.header.thread_rises
        child_rises += ran.header.child_rises
        state_after = dict(ran.header.state_after)
        if n == 1:  # set 0 again: compared with its first output, which is then dropped
            twice = compare_outputs(got[0], first, tol_scale=tol_scale, tf32=tf32)
            first = None
            del got, ran
            continue
        cmp = compare_outputs(got[0], s.output, tol_scale=tol_scale, tf32=tf32)
        compared.append(cmp)
        digests.append(output_digest(got[0]))
        constant.append(not cmp.ok and _is_constant(got[0]))
        if n == 0:
            first = reference.sets.keep(got[0])  # in a file where a set would be: not the judge's heap
        del got, ran  # the outputs: what is kept of them is above
    for found in dynamic.global_state_changed("run", trial.state_before, state_after):
        _note(trial, found)
    _note(trial, dynamic.side_work_in_calls(changed_after, thread_rises, child_rises))
    if len(changed) != len(sets) + 1:  # the worker's report: one input check per run
        raise ChannelProtocolError(f"{len(changed)} input checks for {len(sets) + 1} runs")
    # changed[0] and changed[1] are the two runs on set 0; changed[k+1] is set k for k >= 1
    for i, mutated in enumerate([changed[0] or changed[1]] + changed[2:]):
        if mutated:
            _note(trial, dynamic.inputs_mutated(f"input set {i}"))
            break
    max_abs = max_rel = 0.0
    plain_right = all(cmp.ok for cmp, s in zip(compared, sets) if not s.plan.perturbed)
    for i, (cmp, s) in enumerate(zip(compared, sets)):
        max_abs, max_rel = max(max_abs, cmp.max_abs_err), max(max_rel, cmp.max_rel_err)
        if cmp.ok:
            continue
        if cmp.mismatch is Mismatch.NOT_PLAIN_TENSOR:
            trial.findings.append(dynamic.output_not_plain(cmp.reason))
            raise _End(Verdict(status=Status.FLAGGED, message="flagged: output_not_plain_tensor", errors=(cmp.reason,)))
        label = f"{i} ({s.plan.label})"
        if s.plan.perturbed:
            _note(trial, dynamic.wrong_on_moved_inputs(set_label=label, reason=cmp.reason, plain_sets_right=plain_right,
                                                       same_as_first=digests[i] in digests[:i],
                                                       constant=constant[i], near=cmp.near))
        short = f" (every value within {NEAR_FACTOR:g}x the tolerance: too little precision)" if cmp.near else ""
        raise _End(Verdict(status=Status.INCORRECT, message=f"incorrect on input set {label}: {cmp.reason}{short}",
                           errors=(cmp.reason,), max_abs_err=cmp.max_abs_err, max_rel_err=cmp.max_rel_err))
    if twice is not None and not twice.ok:
        trial.findings.append(dynamic.nondeterministic(twice.reason))
    trial.found.max_abs_err = max_abs
    trial.found.max_rel_err = max_rel


def _run(trial: Trial, worker: Worker, values: list[object], deadline: float) -> Answer:
    """One correctness run; one that ran out of device memory runs once more (the memory may have
    been another process's a moment ago), and a second such error is the judge's when others held
    what the program was promised (`kernelrl.judge.harness.devmem.blame`), else the program's."""
    ran = worker.request(P.Run(), values, deadline=deadline)
    if ran.failed and ran.header.out_of_memory:
        ran = worker.request(P.Run(), values, deadline=deadline)
        h = ran.header
        if ran.failed and h.out_of_memory:
            memory = DeviceMemory(free_bytes=h.device_free_bytes, total_bytes=h.device_total_bytes,
                                  own_bytes=h.device_own_bytes)
            if blame(memory) is Blame.JUDGE:
                raise _End(Verdict(status=Status.JUDGE_ERROR, message=(
                    f"the device ran out of memory twice while other processes held {memory.others_bytes / 2**30:.1f} "
                    f"of its {memory.total_bytes / 2**30:.1f} GiB: judged again later"), errors=(h.message,)))
    if not ran.failed:
        trial.found.peak_device_bytes = max(trial.found.peak_device_bytes or 0, ran.header.peak_device_bytes) or None
    return ran


# How long the judge watches a worker after its calls returned, for work left running.
CENSUS_WINDOW_S = 0.05


def _idle_census(trial: Trial, worker: Worker) -> None:
    before = worker.cpu_time_ns()
    time.sleep(CENSUS_WINDOW_S)
    after = worker.cpu_time_ns()
    busy_ms = (after - before) / 1e6 if before is not None and after is not None else 0.0
    _note(trial, dynamic.side_work_when_idle(busy_ms, worker.child_count(), window_ms=CENSUS_WINDOW_S * 1e3))


def _note(trial: Trial, finding: Finding | None) -> None:
    """Record a finding; one per rule is enough to say what the candidate did."""
    if finding is not None and not any(f.rule == finding.rule for f in trial.findings):
        trial.findings.append(finding)


def _is_constant(x: object) -> bool:
    """Every element of every tensor output is one and the same value."""
    import torch

    values = [t for t in flatten(x) if isinstance(t, torch.Tensor) and t.numel()]
    return bool(values) and all(bool((t == t.reshape(-1)[0]).all()) for t in values)


def error_line(text: str) -> str:
    """The first compiler or Python error line of a message (compiler commands come first)."""
    import re

    for line in text.splitlines():
        if re.search(r"\berror\b[:\s]", line, re.IGNORECASE) and not line.lstrip().startswith(("[", "c++ ", "nvcc ")):
            return line.strip()[:300]
    return first_line(text)


def first_line(text: str) -> str:
    for line in (text or "").strip().splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""


def read_members(trials: Iterable[Trial], config: EvalConfig, task_source: str) -> None:
    """What reading a member decides, before anything runs: its static findings under the
    policy, and a verdict when one of them (or its syntax, or its language on this device)
    refuses it. The task's own copies and the compiled reference are not read."""
    policy = get_policy(config.policy)
    for t in trials:
        if t.compiled_reference or t.trusted:
            continue
        verdict: Verdict | None
        try:
            if config.static_checks:
                t.findings.extend(policy.apply(check_source(t.candidate.source, task_source=task_source)))
            verdict = static_verdict(t.candidate.source, t.candidate.language, device=config.device,
                                     static_findings=t.findings)
        except (RecursionError, MemoryError) as e:
            # Nesting deep enough to exhaust the parser is a program that does not build.
            verdict = Verdict(status=Status.COMPILE_ERROR,
                              message=f"candidate cannot be parsed: {type(e).__name__} (nested too deeply)")
        if verdict is not None:
            t.end(verdict)
