"""The canonical names of every check kernelrl runs on a candidate, static and dynamic.

Guarantees: every finding the static checks or the evaluator emit names a rule listed here;
names are stable strings (they are stored in the database and shown to the model in prompts);
each rule has a one-line description saying what it detects and the default severity a policy
starts from. The evaluator imports the dynamic names from here instead of spelling strings.

Does not implement any check: the static ones live in `kernelrl.checks.static`, the dynamic
ones in the evaluator. Policies (`kernelrl.checks.policy`) may change a rule's severity.
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

STATIC_RULES: dict[str, Rule] = {r.name: r for r in [
    _static(SYNTAX_ERROR, "the source does not parse as Python"),
    _static(STREAM_CREATION, "creates or switches to a CUDA stream, so work can escape the timed stream"),
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
                              "reductions, default dtype, flush-denormal)"),
    _static(THREAD_SETTING_CHANGE, "changes global thread counts or CPU affinity (set_num_threads, "
                                   "OMP_NUM_THREADS, sched_setaffinity)"),
    _static(BACKEND_SETTING_CHANGE, "changes global backend flags (cudnn.benchmark, deterministic algorithms, "
                                    "grad mode, compiler configs)", Severity.WARN),
    _static(REDUCED_PRECISION_COMPUTE, "computes in fp16/bf16 or under autocast; the tolerance decides "
                                       "whether the result is still right", Severity.WARN),
    _static(FILE_ACCESS, "reads or writes files or file descriptors (open, pathlib I/O, os.write, shutil, "
                         "tempfile, torch.save/load, pickle/np file I/O)"),
    _static(ENVIRONMENT_ACCESS, "reads environment variables (os.environ, os.getenv), where keys and seeds "
                                "would live"),
    _static(ENVIRONMENT_WRITE, "sets ordinary environment variables (e.g. TORCH_CUDA_ARCH_LIST before a "
                               "build)", Severity.WARN),
    _static(NETWORK_ACCESS, "uses sockets or network clients"),
    _static(NATIVE_ACCESS, "uses ctypes, cffi, mmap or loads arbitrary shared libraries"),
    _static(DYNAMIC_IMPORT, "imports by computed name (importlib, __import__, runpy) or edits sys.path"),
    _static(DYNAMIC_CODE, "executes code built at run time (eval, exec, compile, marshal/pickle loads)"),
    _static(INTROSPECTION, "inspects frames, modules or the garbage collector to reach the judge "
                           "(sys._getframe, inspect, gc, sys.modules, globals(), __globals__, kernelrl)"),
    _static(TENSOR_SUBCLASS, "defines or creates a torch.Tensor subclass or __torch_function__/"
                             "__torch_dispatch__ hook, which can defer or fake work at compare time"),
    _static(OUTPUT_CACHING, "heuristic: caches results across calls (dicts/lists keyed by id, data_ptr, "
                            "shape or _version; lru_cache; memoised outputs)", Severity.WARN),
    _static(RNG_SEEDING, "seeds or replaces a random number generator (e.g. to reproduce the judge's "
                         "inputs)", Severity.WARN),
    _static(NO_CUSTOM_KERNEL, "no custom kernel found (load_inline with real C++/CUDA code, a Triton "
                              "kernel, numba/cupy kernel)", Severity.WARN),
]}

# ---------------------------------------------------------------------------------------------
# Dynamic rules (the evaluator emits these; names only here)

SIDE_WORK_AFTER_RETURN = "side_work_after_return"
THREAD_COUNT_CHANGED = "thread_count_changed"
OUTPUT_NOT_PLAIN_TENSOR = "output_not_plain_tensor"
OUTPUT_CACHED_ACROSS_CALLS = "output_cached_across_calls"
INPUTS_MUTATED = "inputs_mutated"
NONDETERMINISTIC_OUTPUT = "nondeterministic_output"
TIMER_MISMATCH = "timer_mismatch"
GLOBAL_STATE_CHANGED = "global_state_changed"
DEGENERATE_UNDER_OFFSET_SCALE = "degenerate_under_offset_scale"
INIT_OR_SHAPE_TAMPERED = "init_or_shape_tampered"
IMPOSSIBLE_SPEEDUP = "impossible_speedup"
RESULT_CHANNEL_FORGED = "result_channel_forged"

DYNAMIC_RULES: dict[str, Rule] = {r.name: r for r in [
    _dynamic(SIDE_WORK_AFTER_RETURN, "work still running when forward returned: threads or processes the call "
                                     "started are alive, non-default streams have pending work, or the "
                                     "output changed between return and a later read"),
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
    _dynamic(GLOBAL_STATE_CHANGED, "precision, threading, determinism, grad-mode or default-dtype settings "
                                   "differ after the candidate was imported or called"),
    _dynamic(DEGENERATE_UNDER_OFFSET_SCALE, "the output matched on standard-normal inputs but not under a "
                                            "random offset and scale: it does not track the input"),
    _dynamic(INIT_OR_SHAPE_TAMPERED, "the candidate redefines get_inputs, get_init_inputs or size constants "
                                     "with values other than the task's (ignored by the judge, reported)"),
    _dynamic(IMPOSSIBLE_SPEEDUP, "the candidate's time is below the physical floor (bytes that must move / "
                                 "peak bandwidth, or flops / peak compute)"),
    _dynamic(RESULT_CHANNEL_FORGED, "the worker's result message is malformed, unauthenticated, duplicated, "
                                    "or the worker exited without a result through the private channel"),
]}

RULES: dict[str, Rule] = {**STATIC_RULES, **DYNAMIC_RULES}


def rule(name: str) -> Rule:
    """The rule called `name`; KeyError with the known names otherwise."""
    try:
        return RULES[name]
    except KeyError:
        raise KeyError(f"unknown rule {name!r}; known rules: {', '.join(sorted(RULES))}") from None
