"""The canonical names of every check kernelrl runs on a candidate, static and dynamic.

Guarantees: every finding the static checks or the evaluator emit names a rule listed here;
names are stable strings (they are stored in the database and shown to the model in prompts);
each rule has a one-line description saying what it detects and the default severity a policy
starts from. `kernelrl.checks.dynamic` and the static checks import the names from here.

Does not implement any check: the static ones live in `kernelrl.checks.static`, the dynamic
ones in `kernelrl.checks.dynamic`. Policies (`kernelrl.checks.policy`) may change a rule's severity.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernelrl.result import Severity

STATIC = "static"
DYNAMIC = "dynamic"


@dataclass(frozen=True, kw_only=True)
class Rule:
    name: str
    stage: str  # STATIC or DYNAMIC
    summary: str  # one line: what the rule detects
    severity: Severity = Severity.REJECT  # default before a policy applies

    def __post_init__(self) -> None:
        if self.stage not in (STATIC, DYNAMIC):
            raise ValueError(f"rule {self.name}: stage must be {STATIC!r} or {DYNAMIC!r}, not {self.stage!r}")
        if not self.name.isidentifier():
            raise ValueError(f"rule name {self.name!r} must be an identifier-like string")


def _static(name: str, summary: str, severity: Severity = Severity.REJECT) -> Rule:
    return Rule(name=name, stage=STATIC, summary=summary, severity=severity)


def _dynamic(name: str, summary: str, severity: Severity = Severity.REJECT) -> Rule:
    return Rule(name=name, stage=DYNAMIC, summary=summary, severity=severity)


# ---------------------------------------------------------------------------------------------
# Static rules (source only; kernelrl.checks.static implements each one)

SYNTAX_ERROR = "syntax_error"
STREAM_CREATION = "stream_creation"
THREAD_CREATION = "thread_creation"
PROCESS_CREATION = "process_creation"
PROCESS_CONTROL = "process_control"
REFERENCE_CALL = "reference_call"
REFERENCE_SUBCLASS = "reference_subclass"
REFERENCE_IMPORT = "reference_import"
TRY_FALLBACK = "try_fallback"
MODULE_PATCHING = "module_patching"
PRECISION_CHANGE = "precision_change"
THREAD_SETTING_CHANGE = "thread_setting_change"
BACKEND_SETTING_CHANGE = "backend_setting_change"
REDUCED_PRECISION_COMPUTE = "reduced_precision_compute"
FILE_ACCESS = "file_access"
ENVIRONMENT_ACCESS = "environment_access"
ENVIRONMENT_WRITE = "environment_write"
NETWORK_ACCESS = "network_access"
NATIVE_ACCESS = "native_access"
DYNAMIC_IMPORT = "dynamic_import"
DYNAMIC_CODE = "dynamic_code"
INTROSPECTION = "introspection"
TENSOR_SUBCLASS = "tensor_subclass"
OUTPUT_CACHING = "output_caching"
RNG_SEEDING = "rng_seeding"
NO_CUSTOM_KERNEL = "no_custom_kernel"
FORWARD_REBINDING = "forward_rebinding"
FAST_MATH = "fast_math"
BIDI_CONTROL = "bidi_control"

STATIC_RULES: dict[str, Rule] = {r.name: r for r in [
    _static(SYNTAX_ERROR, "the source does not parse as Python"),
    _static(STREAM_CREATION, "launches work on a CUDA stream other than the current one (Python or C++) and "
                             "does not join it (wait_stream, synchronize, an event) before returning"),
    _static(THREAD_CREATION, "starts threads, executors, asyncio loops or torch.jit.fork tasks that can "
                             "work after forward returns"),
    _static(PROCESS_CREATION, "forks or spawns processes (os.fork, multiprocessing, subprocess, os.system)"),
    _static(PROCESS_CONTROL, "exits or signals the process (os._exit, sys.exit, os.kill, signal, atexit)"),
    _static(REFERENCE_CALL, "uses the reference `Model` (calls it, instantiates it, looks it up, or calls "
                            "its forward through super())"),
    _static(REFERENCE_SUBCLASS, "ModelNew (or any class) inherits from the reference `Model`"),
    _static(REFERENCE_IMPORT, "imports `Model` or a module that looks like the task's reference module"),
    _static(TRY_FALLBACK, "a try/except whose handler (or the code after a swallowed exception) computes "
                          "with PyTorch ops or the reference: a silent fallback when the kernel fails",
            Severity.WARN),
    _static(MODULE_PATCHING, "rebinds or deletes attributes of torch, time, builtins, sys, os, numpy, math, "
                             "random or kernelrl (e.g. torch.allclose = ..., setattr(time, ...))"),
    _static(PRECISION_CHANGE, "changes global float precision (TF32, matmul precision, reduced-precision "
                              "reductions, default dtype, flush-denormal) away from PyTorch's default"),
    _static(THREAD_SETTING_CHANGE, "changes global thread counts or CPU affinity (set_num_threads, "
                                   "OMP_NUM_THREADS, sched_setaffinity)"),
    _static(BACKEND_SETTING_CHANGE, "changes global backend flags (cudnn.benchmark, deterministic algorithms, "
                                    "grad mode, compiler configs)", Severity.WARN),
    _static(REDUCED_PRECISION_COMPUTE, "computes in fp16/bf16 or under autocast where the task does not; "
                                       "the tolerance decides under open, strict refuses it", Severity.WARN),
    _static(FAST_MATH, "compiles with fast-math flags (--use_fast_math, -ffast-math, -Ofast) that relax IEEE "
                       "float semantics; the tolerance decides", Severity.WARN),
    _static(FILE_ACCESS, "reads or writes files outside the candidate's own temp and build folders, writes "
                         "Python files anywhere, or uses raw file descriptors (os.write, os.dup, os.fstat)"),
    _static(ENVIRONMENT_ACCESS, "reads environment variables (os.environ, os.getenv), where keys and seeds "
                                "would live; build settings read by name (TORCH_EXTENSIONS_DIR, ...) excepted"),
    _static(ENVIRONMENT_WRITE, "sets ordinary environment variables (e.g. TORCH_CUDA_ARCH_LIST before a "
                               "build)", Severity.WARN),
    _static(NETWORK_ACCESS, "uses sockets or network clients"),
    _static(NATIVE_ACCESS, "uses ctypes, cffi, mmap or loads arbitrary shared libraries"),
    _static(DYNAMIC_IMPORT, "imports by computed name (importlib, __import__, runpy) or edits sys.path"),
    _static(DYNAMIC_CODE, "executes code built at run time (eval, exec, compile, marshal/pickle loads, or C++ "
                          "sources that run Python: PyRun_*, py::exec)"),
    _static(INTROSPECTION, "inspects frames, modules or the garbage collector to reach the judge "
                           "(sys._getframe, inspect, gc, sys.modules, globals(), __globals__, kernelrl)"),
    _static(TENSOR_SUBCLASS, "defines or creates a torch.Tensor subclass or __torch_function__/"
                             "__torch_dispatch__ hook, or overrides tensor methods on one object, which can "
                             "defer or fake work at compare time"),
    _static(OUTPUT_CACHING, "heuristic: caches results across calls (dicts/lists keyed by id, data_ptr, "
                            "shape or _version; lru_cache; memoised outputs; state in mutable defaults, "
                            "function attributes, closures or context variables)", Severity.WARN),
    _static(RNG_SEEDING, "seeds or replaces a random number generator (e.g. to reproduce the judge's "
                         "inputs)", Severity.WARN),
    _static(FORWARD_REBINDING, "rebinds forward, __call__ or __class__ of a module after construction (in "
                               "forward, a helper, or on the class from outside), so later calls can skip "
                               "the computation"),
    _static(NO_CUSTOM_KERNEL, "no custom kernel found (load_inline with real C++/CUDA code, a Triton "
                              "kernel, numba/cupy kernel)", Severity.WARN),
    _static(BIDI_CONTROL, "holds bidirectional control characters (Trojan Source: code that reads "
                          "differently from how it runs), in a comment, a string or C++ source"),
]}

# ---------------------------------------------------------------------------------------------
# Dynamic rules (kernelrl.checks.dynamic turns the judge's measurements into findings named here)

SIDE_WORK_AFTER_RETURN = "side_work_after_return"
THREAD_COUNT_CHANGED = "thread_count_changed"
OUTPUT_NOT_PLAIN_TENSOR = "output_not_plain_tensor"
OUTPUT_CACHED_ACROSS_CALLS = "output_cached_across_calls"
INPUTS_MUTATED = "inputs_mutated"
NONDETERMINISTIC_OUTPUT = "nondeterministic_output"
TIMER_MISMATCH = "timer_mismatch"
WORK_BEFORE_TIMED_CALL = "work_before_timed_call"
GLOBAL_STATE_CHANGED = "global_state_changed"
BACKEND_STATE_CHANGED = "backend_state_changed"
DEGENERATE_UNDER_OFFSET_SCALE = "degenerate_under_offset_scale"
INIT_OR_SHAPE_TAMPERED = "init_or_shape_tampered"
IMPOSSIBLE_SPEEDUP = "impossible_speedup"
RESULT_CHANNEL_FORGED = "result_channel_forged"
DEGENERATE_TASK = "degenerate_task"
COMPUTE_FLOOR_BEATEN = "compute_floor_beaten"
PRECISION_STATE_CHANGED = "precision_state_changed"
OUTPUT_DEFERRED = "output_deferred"
# The adversarial LLM judge (kernelrl.checks.llm_judge): a model's opinion, not a measurement, so
# policies weigh it apart from the other dynamic rules (kernelrl.checks.policy).
LLM_JUDGE = "llm_judge"
LLM_JUDGE_UNSURE = "llm_judge_unsure"
LLM_JUDGE_UNAVAILABLE = "llm_judge_unavailable"

DYNAMIC_RULES: dict[str, Rule] = {r.name: r for r in [
    _dynamic(SIDE_WORK_AFTER_RETURN, "work still running when forward returned: threads or processes the call "
                                     "started are alive, non-default streams have pending work, the "
                                     "output changed between return and a later read, or the GPU was still "
                                     "busy (any CUDA context) when the judge's own probe ran"),
    _dynamic(THREAD_COUNT_CHANGED, "the candidate process has more OS threads after import/calls than the "
                                   "judge allowed (pools left alive, raised intra-op thread counts)"),
    _dynamic(OUTPUT_NOT_PLAIN_TENSOR, "an output is not exactly torch.Tensor (a subclass, proxy or non-tensor), "
                                      "or is not materialised (meta/fake/lazy storage) on the expected device"),
    _dynamic(OUTPUT_CACHED_ACROSS_CALLS, "a spot-checked timed call returned an output that does not match "
                                         "the reference for that call's input (cached, stale or skipped work)"),
    _dynamic(INPUTS_MUTATED, "an input differs after the call from its copy taken before the call"),
    _dynamic(NONDETERMINISTIC_OUTPUT, "two runs on the same input disagree beyond tolerance (uninitialised "
                                      "or freed memory, races)"),
    _dynamic(TIMER_MISMATCH, "per-call times the worker reported disagree with the judge's own wall clock "
                             "of the timed loop (patched timers, deferred work)"),
    _dynamic(OUTPUT_DEFERRED, "a spot-checked output is not what its timed call committed to when it "
                              "returned: it was produced outside the timed call (computed when asked for, "
                              "the harness's handlers replaced)"),
    _dynamic(WORK_BEFORE_TIMED_CALL, "the worker took longer than the reference's to prepare a timed sample "
                                     "(untimed: fresh inputs and a cache eviction): the candidate's code did "
                                     "work before the timer started, such as computing the outputs ahead"),
    _dynamic(GLOBAL_STATE_CHANGED, "thread counts or the default dtype differ after the candidate was imported "
                                   "or called: more cores than the judge allotted, or a different dtype for "
                                   "every tensor it makes"),
    _dynamic(BACKEND_STATE_CHANGED, "cuDNN autotuning or determinism, deterministic algorithms or oneDNN left "
                                    "changed in the candidate's own process: a PyTorch-level choice that reaches "
                                    "nothing else (its reference is timed in another worker), judged like the "
                                    "static backend_setting_change"),
    _dynamic(DEGENERATE_UNDER_OFFSET_SCALE, "the output matched on standard-normal inputs but not under a "
                                            "random offset and scale: it does not track the input"),
    _dynamic(INIT_OR_SHAPE_TAMPERED, "the candidate's module sets the task's size constants to other values "
                                     "(ignored: the judge runs the task's sizes; reported)", Severity.WARN),
    _dynamic(IMPOSSIBLE_SPEEDUP, "the candidate's time is below half the memory floor: the bytes any program "
                                 "must move (inputs, outputs, parameters) at this machine's measured bandwidth"),
    _dynamic(COMPUTE_FLOOR_BEATEN, "the candidate's time is below half the compute floor (the reference's counted "
                                   "FLOPs at the measured peak rate) but not the memory floor: an algorithm that "
                                   "needs fewer FLOPs than the reference's, or skipped work", Severity.WARN),
    _dynamic(PRECISION_STATE_CHANGED, "the candidate left TF32 or reduced-precision matmul settings on in its own "
                                      "process: lower precision than the task, judged like autocast and .half()"),
    _dynamic(DEGENERATE_TASK, "the task's own reference gives the same output (or zeros) on every secret input "
                              "set: a constant answer would pass, so no candidate of this task is paid"),
    _dynamic(RESULT_CHANNEL_FORGED, "the worker's result message is malformed, unauthenticated, duplicated, "
                                    "or the worker exited without a result through the private channel"),
    _dynamic(LLM_JUDGE, "an LLM reviewer, shown the task, the code and the measurements of a large speedup, "
                        "says the speedup comes from a reward hack (its reason in the message)"),
    _dynamic(LLM_JUDGE_UNSURE, "the LLM reviewer could not tell whether a large speedup is real, or its "
                               "answer could not be read", Severity.WARN),
    _dynamic(LLM_JUDGE_UNAVAILABLE, "the LLM reviewer's endpoint kept failing, so a large speedup went "
                                    "unreviewed", Severity.WARN),
]}

RULES: dict[str, Rule] = {**STATIC_RULES, **DYNAMIC_RULES}


def rule(name: str) -> Rule:
    """The rule called `name`; KeyError with the known names otherwise."""
    try:
        return RULES[name]
    except KeyError:
        raise KeyError(f"unknown rule {name!r}; known rules: {', '.join(sorted(RULES))}") from None
