"""The worker: runs one program (a task's reference or a candidate) on the judge's command.

A reference worker may serve several groups of its task: the judge keeps it and has it build the
task's model again under each group's seed (`Reseed`); a candidate's worker serves one program.

Started by `kernelrl.judge.isolation.sandbox.Worker` as `python -m kernelrl.judge.harness.worker READ_FD WRITE_FD`.
It imports torch, says hello, and then answers one command at a time (`kernelrl.judge.harness.protocol`),
doing nothing unasked. The judge holds the secrets' meaning, the reference outputs and the
verdict; a worker only builds, initialises, makes inputs (a reference, from seeds the judge
chose), runs and times.

Guarantees (for an honest worker; the judge checks what it can, see `kernelrl.judge.evaluator`):
- the clock, the synchronisation call and the tensor type used for timing and checking are
  bound when this module is imported, before any program code runs, so rebinding
  `time.perf_counter`, `torch.cuda.synchronize` or the C function behind it
  (`torch._C._cuda_synchronize`) afterwards changes nothing here;
- task code (the module body, `get_init_inputs`, `get_inputs`, `Model`) runs only here, in a
  reference worker: the judge receives tensors and plain data;
- a timed call is bracketed by a device-wide synchronisation (cudaDeviceSynchronize on every GPU
  the worker sees, whichever device and stream the program left current), so work queued on
  side streams, or on a stream the program made current and never restored, is inside the
  measurement; each call gets freshly made inputs (a new
  tensor whose values are scaled by a factor the judge picks per call); every sample starts from
  an evicted cache (last-level cache on CPU, L2 on GPU), outside the timed region;
- global torch settings are snapshotted before the program is loaded and reported when they
  change.

C++ and CUDA builds through torch's inline loader go to the build folder the judge names (keyed
by content hash), so a program seen before loads its cached build. On CPU, builds use torch's
precompiled header for `torch/extension.h` (prepared once, under a file lock), Triton kernels
run under Triton's interpreter, and CUDA sources are compiled by nvcc for their errors and
refused (`kernelrl.judge.harness.toolchain`); on a GPU Triton always compiles.
"""

from __future__ import annotations

import time

_perf_ns = time.perf_counter_ns  # bound before any program code can rebind it

import dataclasses  # noqa: E402
import gc  # noqa: E402
import importlib.util  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
import types  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

# What the calls' thread and process counts read /proc with, bound before any program code can
# rebind it (`procfs.descendants` binds its own).
_listdir, _getpid = os.listdir, os.getpid

# No torch behind these three: read before torch is imported.
from kernelrl.judge.harness.places import BUILD_DIR_ENV, CACHE_ROOT_ENV  # noqa: E402
from kernelrl.judge.harness.procfs import descendants  # noqa: E402
from kernelrl.judge.harness.startup import NO_HUGE_PAGES_ENV, allocator_pin, set_own_limits  # noqa: E402


def _no_huge_pages() -> None:
    """Turn transparent huge pages off for this process, before torch allocates anything."""
    if os.environ.get(NO_HUGE_PAGES_ENV) != "1" or not sys.platform.startswith("linux"):
        return
    import ctypes

    PR_SET_THP_DISABLE = 41
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # an old kernel: huge pages stay as the system has them


_no_huge_pages()
# Bound now, before any program code runs (`kernelrl.judge.harness.startup`): called when timing begins.
_pin_allocator = allocator_pin()

import torch  # noqa: E402

from kernelrl.judge.harness import devmem  # noqa: E402
from kernelrl.judge.harness import protocol as P  # noqa: E402
from kernelrl.judge.harness.channel import Arena, Channel, ChannelProtocolError, Message, commitments  # noqa: E402
from kernelrl.judge.harness.compare import content_digest, flatten  # noqa: E402
from kernelrl.judge.harness.device import Device  # noqa: E402
from kernelrl.judge.harness.fingerprint import keyed_digest, same_bytes  # noqa: E402
from kernelrl.judge.harness.l2 import PersistingL2  # noqa: E402
from kernelrl.judge.harness.peaks import machine_peaks  # noqa: E402
from kernelrl.judge.harness.precision import global_state, set_precision  # noqa: E402
from kernelrl.judge.harness.toolchain import (  # noqa: E402
    CudaDeviceCodeCheck,
    PrecompiledHeaderLoader,
    configure_triton,
    exclusive_build_dir,
)
from kernelrl.judge.harness.values import all_finite as _all_finite  # noqa: E402
from kernelrl.judge.harness.values import clone as _clone  # noqa: E402
from kernelrl.judge.harness.values import in_place as _in_place  # noqa: E402
from kernelrl.judge.harness.values import kept as _kept  # noqa: E402
from kernelrl.judge.harness.values import own_copy as _own_copy  # noqa: E402
from kernelrl.judge.harness.values import perturb as _perturb  # noqa: E402
from kernelrl.judge.harness.values import pool_noise, stage  # noqa: E402
from kernelrl.judge.harness.values import readable as _readable  # noqa: E402
from kernelrl.judge.harness.values import shadows_tensor as _shadows_tensor  # noqa: E402
from kernelrl.judge.harness.values import to_cpu as _to_cpu  # noqa: E402
from kernelrl.judge.harness.values import to_device as _to_device  # noqa: E402

_Tensor = torch.Tensor
# What evicts the cache before a sample, bound now: a program that replaces torch's ops (to slow
# whatever else runs in its process) cannot change the harness's own work.
_add_ = _Tensor.add_
# The C functions behind torch.cuda.synchronize, bound now: torch.cuda.synchronize looks
# `torch._C._cuda_synchronize` up at each call, so a program could otherwise make it a no-op.
_cuda_synchronize: Any = getattr(torch._C, "_cuda_synchronize", None)  # None in a CPU build of torch
_cuda_exchange_device: Any = getattr(torch._C, "_cuda_exchangeDevice", None)
_no_grad = torch.no_grad
_manual_seed = torch.manual_seed
_fork_rng = torch.random.fork_rng

Reply = tuple[P.Kind, P.Header, Any]


def _thread_count() -> int:
    try:
        return len(_listdir("/proc/self/task"))
    except OSError:
        return 0


def _descendant_count() -> int:
    """Processes descended from this one, exited-but-unreaped ones included. A call that forked
    leaves its child here the moment it returns, however soon the child ends. A grandchild whose
    parent already exited was reparented away and is not counted: the judge's own census of the
    worker's processes sees it."""
    return sum(1 for _ in descendants(_getpid(), depth=64))


def _own(variable: str, named: str) -> str:
    """The folder the sandbox gave this worker for `variable` (full containment), else the one the judge named."""
    return os.environ.get(variable) or named


class _LoadError(Exception):
    def __init__(self, phase: P.Phase, message: str, tb: str = ""):
        super().__init__(message)
        self.phase = phase
        self.tb = tb


class WorkerState:
    def __init__(self, channel: Channel):
        self.channel = channel
        self.device = "cpu"
        self.module: types.ModuleType | None = None  # the task's module (reference workers)
        self.constants: dict[str, int] = {}  # the task's, as loaded
        self.compile_mode: str | None = None  # the task's reference runs under torch.compile (a baseline's worker)
        self.model: Any = None
        self.program_class: Any = None  # a loaded program's ModelNew, until `construct` makes the model
        self.pool: list[list[object]] = []
        self.noise: list[list[torch.Tensor | None]] = []  # per pool set and input: noise in [-1, 1) (floating inputs)
        self.jitter = 0.0
        self.staged: list[list[object]] = []  # inputs of the calls of the next sample
        self.sample_inputs: list[list[object]] = []  # inputs and outputs of every call of the last sample
        self.sample_outputs: list[object] = []
        self.evict_buf: torch.Tensor | None = None
        self.cuda_devices = 0  # GPUs this worker sees (cuda only)
        self.l2: PersistingL2 | None = None  # on a GPU: the persisting-L2 carveout, emptied before each sample
        self.allocator_pinned = False  # `startup.PINNED_MALLOPT` set (from the timing pool on)

    # -- loading ------------------------------------------------------------------------------

    def _start(self, device: str, threads: int, evict_bytes: int, allow_tf32: bool) -> dict[str, P.Setting]:
        self.device = device
        torch.set_num_threads(int(threads))
        set_precision(bool(allow_tf32))
        if device == "cuda":
            torch.cuda.init()  # type: ignore[no-untyped-call]
            self.cuda_devices = torch.cuda.device_count()
            self.l2 = PersistingL2.bind(devices=self.cuda_devices, exchange_device=_cuda_exchange_device)
        if evict_bytes:
            self.evict_buf = torch.zeros(evict_bytes // 4, dtype=torch.float32, device=device)
            self.evict_buf.add_(1.0)  # starts the OpenMP pool now: threads seen in timed calls are the program's
        return global_state()

    def load_task(self, h: P.LoadTask, payload: Any) -> Reply:
        from kernelrl.tasks.sizes import resolve_constants
        from kernelrl.tasks.source import compile_task
        from kernelrl.tasks.task import Task, TaskError, offline_hubs

        state_before = self._start(h.device, h.threads, h.evict_bytes, h.allow_tf32)
        cache_root = _own(CACHE_ROOT_ENV, h.cache_root)
        if cache_root:
            # torch.compile of the reference (a baseline) keeps its compiled graphs between runs
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache_root, "inductor")
        t0 = time.monotonic()
        task = Task(name=h.task_name, source=h.task_source, presets=h.presets)
        try:
            if payload:
                constants = {str(k): int(v) for k, v in dict(payload).items()}  # resolved by another worker
            else:
                unknown = set(h.overrides) - set(task.constants())
                if unknown:
                    raise TaskError(f"task {task.name} has no integer constant(s) {sorted(unknown)}")
                constants = {**resolve_constants(task, h.size), **h.overrides}
            mod = types.ModuleType("kernelrl_reference")
            mod.__file__ = f"<task {h.task_name}>"
            with offline_hubs():
                exec(compile_task(h.task_source, constants, mod.__file__), mod.__dict__)  # noqa: S102
            for name in ("Model", "get_inputs", "get_init_inputs"):
                if not hasattr(mod, name):
                    raise TaskError(f"task {h.task_name} defines no `{name}`")
        except Exception as e:  # noqa: BLE001 - any failure of task code is the task's
            return P.Kind.ERROR, P.Error(phase=P.Phase.COMPILE, message=f"{type(e).__name__}: {e}",
                                         traceback=traceback.format_exc(limit=8)), None
        self.module, self.constants, self.compile_mode = mod, constants, h.compile_mode
        try:
            init_inputs = self._build_model(h.init_seed)
        except _LoadError as e:
            return P.Kind.ERROR, P.Error(phase=e.phase, message=str(e), traceback=e.tb), None
        profile = None
        if h.profile:
            from kernelrl.judge.harness.profile import profile_task

            profile = profile_task(mod, task=h.task_name, size=h.size, constants=constants, init_inputs=init_inputs,
                                   source=h.task_source).to_dict()
        return P.Kind.TASK_LOADED, P.TaskLoaded(constants=constants, load_s=time.monotonic() - t0, profile=profile,
                                                state_before=state_before, state_after=global_state()), init_inputs

    def reseed(self, h: P.Reseed, payload: Any) -> Reply:
        """The loaded task's model built again under a new init seed (a kept reference worker's next
        group); `state_before` is the settings as the last group left them, for the judge to compare."""
        if self.module is None:
            return P.Kind.ERROR, P.Error(phase=P.Phase.PROTOCOL, message="reseed before load_task"), None
        state_before, t0 = global_state(), time.monotonic()
        self.model = None  # the last group's model goes before the next one is built
        try:
            init_inputs = self._build_model(h.init_seed)
        except _LoadError as e:
            return P.Kind.ERROR, P.Error(phase=e.phase, message=str(e), traceback=e.tb), None
        return P.Kind.TASK_LOADED, P.TaskLoaded(constants=self.constants, load_s=time.monotonic() - t0, profile=None,
                                                state_before=state_before, state_after=global_state()), init_inputs

    def _build_model(self, init_seed: int) -> list[Any]:
        """The loaded task's init inputs and model under `init_seed`; raises _LoadError."""
        assert self.module is not None
        try:
            with _fork_rng(devices=[]):
                _manual_seed(init_seed)
                init_inputs = list(self.module.get_init_inputs())
        except Exception as e:  # noqa: BLE001 - any failure of task code is the task's
            raise _LoadError(P.Phase.COMPILE, f"{type(e).__name__}: {e}", traceback.format_exc(limit=8)) from e
        self.model = self._construct(self.module.Model, init_inputs, init_seed, self.compile_mode)
        return init_inputs

    def load_program(self, h: P.LoadProgram, payload: object) -> Reply:
        state_before = self._start(h.device, h.threads, h.evict_bytes, h.allow_tf32)
        # The program's own build folder (keyed by its source) and the shared inductor cache;
        # under full containment both are in this worker's scratch (the judge's are not visible).
        build_dir, cache_root = _own(BUILD_DIR_ENV, h.build_dir), _own(CACHE_ROOT_ENV, h.cache_root)
        os.environ["TORCH_EXTENSIONS_DIR"] = build_dir
        os.environ["TRITON_CACHE_DIR"] = os.path.join(build_dir, "triton")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache_root, "inductor")
        PrecompiledHeaderLoader(cache_root).install()
        configure_triton(Device(h.device), h.source)  # before the import: triton.jit reads it when a kernel is decorated
        if h.device == "cpu":
            CudaDeviceCodeCheck().install()
        t0 = time.monotonic()
        try:
            cls, overridden = self._import_candidate(h.source, h.constants)
        except _LoadError as e:
            return P.Kind.ERROR, P.Error(phase=e.phase, message=str(e), traceback=e.tb), None
        build_s = time.monotonic() - t0
        self.program_class = cls
        return P.Kind.LOADED, P.Loaded(build_s=build_s, state_before=state_before, state_after=global_state(),
                                       constants_overridden=overridden), None

    def construct(self, h: P.Construct, payload: Any) -> Reply:
        """The model of the program `load_program` imported."""
        if self.program_class is None:
            return P.Kind.ERROR, P.Error(phase=P.Phase.PROTOCOL, message="construct before a program was loaded"), None
        try:
            self.model = self._construct(self.program_class, list(payload or []), h.init_seed, None)
        except _LoadError as e:
            return P.Kind.ERROR, P.Error(phase=e.phase, message=str(e), traceback=e.tb), None
        return P.Kind.CONSTRUCTED, P.Constructed(state_after=global_state()), None

    def _construct(self, cls: Any, init_inputs: list[Any], init_seed: int, compile_mode: str | None) -> Any:
        try:
            _manual_seed(int(init_seed))
            model = cls(*init_inputs)
            if isinstance(model, torch.nn.Module):
                model = model.to(self.device)
            if compile_mode is not None:
                model = torch.compile(model, mode=None if compile_mode == "default" else compile_mode)
            return model
        except Exception as e:  # noqa: BLE001 - any failure to construct is the program's
            raise _LoadError(P.Phase.INIT, f"{type(e).__name__}: {e}", traceback.format_exc(limit=8)) from e

    def _import_candidate(self, source: str, constants: dict[str, int]) -> tuple[Any, dict[str, list[int]]]:
        path = Path.cwd() / "candidate.py"
        if any(not k.isidentifier() for k in constants):
            # The task was sized through tuple elements or layer literals: a candidate that copied
            # them must be sized the same way to match the reference (plain names are set below).
            from kernelrl.tasks.source import sized_source

            try:
                source = sized_source(source, {k: v for k, v in constants.items() if not k.isidentifier()})
            except (SyntaxError, ValueError, RecursionError) as e:
                raise _LoadError(P.Phase.COMPILE, f"{type(e).__name__}: {e}") from e
        path.write_text(source)
        spec = importlib.util.spec_from_file_location("kernelrl_candidate", path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules["kernelrl_candidate"] = mod
        try:
            with exclusive_build_dir():
                spec.loader.exec_module(mod)
        except SyntaxError as e:
            raise _LoadError(P.Phase.COMPILE, f"SyntaxError: {e}", traceback.format_exc(limit=2)) from e
        except BaseException as e:  # noqa: BLE001 - SystemExit at import is a failed load too
            raise _LoadError(P.Phase.COMPILE, f"{type(e).__name__}: {e}", traceback.format_exc(limit=8)) from e
        # A candidate that copied the task's size constants runs at the judged size, as the
        # reference does: same names, the values of the active size preset.
        overridden = {}
        for name, value in constants.items():
            theirs = getattr(mod, name, None)
            if isinstance(theirs, int) and not isinstance(theirs, bool):
                if theirs != value:
                    overridden[name] = [theirs, value]
                setattr(mod, name, value)
        cls = getattr(mod, "ModelNew", None)
        if cls is None:
            raise _LoadError(P.Phase.COMPILE, "the program defines no `ModelNew`")
        return cls, overridden

    # -- inputs (reference workers) -----------------------------------------------------------

    def make_inputs(self, h: P.MakeInputs, payload: object) -> Reply:
        if self.module is None:
            return P.Kind.ERROR, P.Error(phase=P.Phase.PROTOCOL, message="make_inputs before load_task"), None
        sets, outputs, finite = [], [], []
        # One set per message (the judge's way) is sent as it is, read in place: no copy of it can
        # be changed by a later run before the arena takes it. Several in one message are copied.
        take = _readable if len(h.seeds) == 1 else _to_cpu
        module, on_host = self.module, self.device == "cpu"

        def made(seed: int, perturb: list[float] | None) -> list[object]:
            with _fork_rng(devices=[]):
                _manual_seed(int(seed))
                values = list(module.get_inputs())
            return values if perturb is None else _perturb(values, float(perturb[0]), float(perturb[1]))

        try:
            for seed, perturb in zip(h.seeds, h.perturb):
                values = made(seed, perturb)
                if h.run:
                    # On the host the reference runs on the set itself (no second set beside it); one
                    # that writes its inputs has the set made again. On a device, on a copy there (one
                    # `get_inputs` made on the device is copied too).
                    sent = content_digest(_in_place(values)) if on_host else ""
                    args = values if on_host else _own_copy(values, self.device)
                    with _no_grad():
                        out = self.model(*args)
                    self._sync()
                    if on_host and content_digest(_in_place(values)) != sent:
                        values = made(seed, perturb)
                    outputs.append(take(out))
                sets.append(values)
                finite.append(_all_finite(outputs[-1]) if h.run else True)
        except Exception as e:  # noqa: BLE001 - the reference's own failure: a task problem
            return P.Kind.ERROR, P.Error(phase=P.Phase.RUN, message=f"{type(e).__name__}: {e}",
                                         traceback=traceback.format_exc(limit=8)), None
        devmem.release(self.device)  # what making the sets cached: the device's again
        return P.Kind.INPUTS, P.InputsMade(finite=finite), {"inputs": [take(s) for s in sets],
                                                           "outputs": outputs}

    # -- parameters ---------------------------------------------------------------------------

    def get_state(self, h: P.Header, payload: object) -> Reply:
        if not isinstance(self.model, torch.nn.Module):
            return P.Kind.STATE, P.State(keys=[]), None
        sd = {k: v.detach().to("cpu").clone() for k, v in self.model.state_dict().items()}
        return P.Kind.STATE, P.State(keys=list(sd)), sd

    def load_state(self, h: P.Header, payload: Any) -> Reply:
        """Take the reference's parameters when the candidate's have the same names and shapes."""
        sd = payload or {}
        if not isinstance(self.model, torch.nn.Module) or not sd:
            return P.Kind.STATE_LOADED, P.StateLoaded(loaded=False, why="no parameters"), None
        own = self.model.state_dict()
        same = set(own) == set(sd) and all(tuple(own[k].shape) == tuple(sd[k].shape) for k in own)
        if not same:
            return P.Kind.STATE_LOADED, P.StateLoaded(loaded=False, why="different parameter names or shapes"), None
        self.model.load_state_dict(sd)
        return P.Kind.STATE_LOADED, P.StateLoaded(loaded=True), None

    # -- correctness --------------------------------------------------------------------------

    def run(self, h: P.Run, payload: Any) -> Reply:
        """One correctness run: the input set in the payload, called once. The judge sends a set
        afresh for every run (the first set twice), so a run's output is sent as it is: the worker
        holds one set and one output, and the arena the output's copy while it travels."""
        inputs = list(payload)
        # On the host a fingerprint, not a copy, tells a changed input or output (compare.content_digest);
        # on a device, the bytes of the device's copies against the host's (`fingerprint.same_bytes`).
        on_host = self.device == "cpu"
        sent = content_digest(inputs) if on_host else ""
        args = [_to_device(v, self.device) for v in inputs]  # off the CPU, the device's own copy
        before, children_before = _thread_count(), _descendant_count()
        devmem.reset_peak(self.device)
        with _no_grad():
            out = self.model(*args)
        self._sync()
        thread_rise, child_rise = _thread_count() - before, _descendant_count() - children_before
        peak = devmem.peak(self.device)
        snapshot = _readable(out)
        at_return = content_digest(snapshot) if on_host else ""
        # An honest output is final when the call returns; one still being written by work the
        # call left running changes in the next moments.
        time.sleep(0.005)
        self._sync()
        if on_host:
            changed_after = content_digest(_in_place(out)) != at_return
            inputs_changed = content_digest(_in_place(args)) != sent
        else:
            changed_after, inputs_changed = not same_bytes(_in_place(out), snapshot), not same_bytes(_in_place(args), inputs)
        ran = P.Ran(state_after=global_state(), thread_rises=[thread_rise], child_rises=[child_rise],
                    changed_after_return=[changed_after], inputs_changed=[inputs_changed], peak_device_bytes=peak)
        del out, args
        devmem.release(self.device)
        return P.Kind.RAN, ran, {"outputs": [snapshot]}

    # -- timing -------------------------------------------------------------------------------

    def set_pool(self, h: P.Pool, payload: Any) -> Reply:
        if _pin_allocator is not None and not self.allocator_pinned:
            self.allocator_pinned = _pin_allocator()  # timing begins here in every timed worker alike
        self.pool = [[_to_device(v, self.device) for v in s] for s in payload]
        self.jitter = float(h.jitter)
        # made once: a call's noise is a roll of it, so no two calls' inputs are multiples of each other
        self.noise = pool_noise(self.pool, seed=int(h.noise_seed), most=P.POOL_NOISE_ELEMENTS)
        return P.Kind.POOLED, P.Pooled(n=len(self.pool), allocator_pinned=self.allocator_pinned), None

    def warmup(self, h: P.Warmup, payload: object) -> Reply:
        t_end = time.monotonic() + h.max_s
        times = []
        for i in range(max(h.calls, 1)):
            args = self.pool[i % len(self.pool)]
            self._sync()
            t0 = _perf_ns()
            with _no_grad():
                self.model(*args)
            self._sync()
            times.append((_perf_ns() - t0) / 1e6)
            if time.monotonic() > t_end:
                break
        # The first call may compile or allocate: the median of the others is the call's cost.
        call_ms = statistics.median(times[1:] if len(times) > 1 else times)
        return P.Kind.WARM, P.Warm(calls=len(times), call_ms=call_ms, state_after=global_state(),
                                   floor_ns=call_floor_ns(self._sync, _perf_ns)), None

    def prepare(self, h: P.Prepare, payload: object) -> Reply:
        """Fresh inputs for each call of the next sample (new storage, new values)."""
        self.staged = []
        self.sample_inputs, self.sample_outputs = [], []  # freed before the next sample's inputs exist
        for j, (scale, shift) in enumerate(zip(h.scales, h.shifts)):
            k = (h.index + j) % len(self.pool)
            fresh: list[object] = []
            for x, noise in zip(self.pool[k], self.noise[k]):
                if noise is not None and isinstance(x, _Tensor):  # noise exists for floating tensors only
                    # x * scale * (1 + jitter * u), u in [-1, 1): new storage, new values, and no
                    # multiple of any earlier input (so no earlier output, rescaled, is the answer);
                    # made a chunk at a time (values.stage)
                    fresh.append(stage(x, noise, scale=float(scale), shift=int(shift), jitter=self.jitter))
                else:
                    fresh.append(_clone(x))
            self.staged.append(fresh)
        self._evict()
        return P.Kind.PREPARED, P.Empty(), None

    def call(self, h: P.Header, payload: object) -> Reply:
        times = []
        plain = True
        outs = []
        # One eviction (in prepare) per sample: a sample of several calls is only used for calls
        # much shorter than the timer's noise, and an eviction between them would cost far more
        # than the calls. Each call still gets inputs of its own.
        for args in self.staged:
            self._sync()
            t0 = _perf_ns()
            with _no_grad():
                out = self.model(*args)
            self._sync()
            times.append(_perf_ns() - t0)
            plain = plain and all(type(o) is _Tensor and not _shadows_tensor(o) for o in flatten(out))
            # Every output is kept until the next sample (the judge picks the one it checks after it) as it was
            # returned: with more calls to come, a copy (untimed, every member alike): CUDA graphs' buffer is reused.
            outs.append(_kept(out) if len(self.staged) > 1 else out)
        self.sample_inputs = self.staged
        self.sample_outputs = outs
        self.staged = []
        return P.Kind.CALLED, P.Called(t_ns=times, plain=plain, commits=commitments(outs)), None

    def output(self, h: P.Output, payload: object) -> Reply:
        if not 0 <= h.call < len(self.sample_outputs):
            raise ValueError(f"no call {h.call} in the last sample ({len(self.sample_outputs)} calls)")
        # The output read in place where it is a plain CPU tensor (the channel copies it into the
        # arena); the inputs as a digest the judge compares with the reference's, not a second set:
        # on a device, read there under the key the judge drew after the sample.
        values = _in_place(self.sample_inputs[h.call])
        digest = content_digest(values) if self.device == "cpu" else keyed_digest(values, h.key)
        return P.Kind.OUTPUT_DATA, P.OutputData(inputs_digest=digest), {"output": _readable(self.sample_outputs[h.call])}

    def _evict(self) -> None:
        if self.l2 is not None:  # before the write: lines made normal are evicted by it
            self.l2.reset()
        if self.evict_buf is not None:
            _add_(self.evict_buf, 1.0)
        self._sync()

    def _sync(self) -> None:
        if self.device == "cuda":
            sync_every_gpu(self.cuda_devices)

    # -- machine peaks ------------------------------------------------------------------------

    def measure_peaks(self, h: P.MeasurePeaks, payload: object) -> Reply:
        self._start(h.device, h.threads, 0, False)  # exact fp32: the peaks of the default precision
        return P.Kind.PEAKS, machine_peaks(h.device, self._sync, _perf_ns), None


def sync_every_gpu(devices: int) -> None:
    """cudaDeviceSynchronize on each GPU this process sees: every stream of each.

    A program may have left another device current (work queued on it would escape a
    synchronisation of the current device only); the current device is put back after.
    """
    if devices <= 1 or _cuda_exchange_device is None:
        _cuda_synchronize()
        return
    for index in range(devices):
        previous = _cuda_exchange_device(index)
        _cuda_synchronize()
        _cuda_exchange_device(previous)


_HANDLERS: dict[P.Kind, Any] = {
    P.Kind.LOAD_TASK: WorkerState.load_task,
    P.Kind.RESEED: WorkerState.reseed,
    P.Kind.LOAD_PROGRAM: WorkerState.load_program,
    P.Kind.CONSTRUCT: WorkerState.construct,
    P.Kind.MAKE_INPUTS: WorkerState.make_inputs,
    P.Kind.GET_STATE: WorkerState.get_state,
    P.Kind.LOAD_STATE: WorkerState.load_state,
    P.Kind.RUN: WorkerState.run,
    P.Kind.POOL: WorkerState.set_pool,
    P.Kind.WARMUP: WorkerState.warmup,
    P.Kind.PREPARE: WorkerState.prepare,
    P.Kind.CALL: WorkerState.call,
    P.Kind.OUTPUT: WorkerState.output,
    P.Kind.MEASURE_PEAKS: WorkerState.measure_peaks,
}


def send(channel: Channel, kind: P.Kind, header: P.Header | None, payload: object = None) -> None:
    """An answer to the judge. Its payload is given away (`Arena.write`): a reference worker's set
    and output go into the arena one after the other, the set let go before the output is copied."""
    try:
        channel.send(kind.value, P.encode(kind, header), payload, give=True)
    except ChannelProtocolError as e:
        # An answer that cannot cross the channel (an object of a type it does not carry, say)
        # is an error the judge reads, not the end of the worker.
        channel.send(P.Kind.ERROR.value, P.encode(P.Kind.ERROR, P.Error(phase=P.Phase.RUN, message=str(e))))


def call_floor_ns(sync: Callable[[], None], clock: Callable[[], int], *, n: int = 201) -> float:
    """This worker's timing bracket around nothing (sync, clock, sync, clock): its median, in ns.

    Here, not in `kernelrl.judge.timing.timer`: a worker imports no more than it runs (the timer's
    imports, the static checker's rules among them, cost every worker's start ~0.1 s).
    """
    times = []
    for _ in range(n):
        sync()
        t0 = clock()
        sync()
        times.append(clock() - t0)
    return float(statistics.median(times))


def main(argv: list[str]) -> int:
    channel = Channel(int(argv[1]), int(argv[2]), Arena(int(argv[3]), int(argv[4])))
    set_own_limits()
    gc.freeze()  # what the start made (torch: ~170k objects, 75 ms a full collection) is never scanned again
    state = WorkerState(channel)
    send(channel, P.Kind.HELLO, P.Hello(pid=os.getpid(), torch=torch.__version__, python=sys.version.split()[0]))
    while _serve(state, channel.recv()):
        pass
    return 0


def _serve(state: WorkerState, msg: Message) -> bool:
    """Answer one command (False: the judge said exit). A function of its own, so that what one
    command received and answered is freed before the next arrives: a worker holds one set, not
    the last command's beside the next one's."""
    try:
        kind, header = P.decode(msg.kind, msg.header)
    except Exception as e:  # noqa: BLE001 - a malformed command: say so, keep serving
        send(state.channel, P.Kind.ERROR, P.Error(phase=P.Phase.PROTOCOL, message=str(e)))
        return True
    if kind is P.Kind.EXIT:
        return False
    handler = _HANDLERS.get(kind)
    if handler is None:
        send(state.channel, P.Kind.ERROR, P.Error(phase=P.Phase.PROTOCOL, message=f"not a command: {kind.value}"))
        return True
    try:
        answer, reply, payload = handler(state, header, msg.payload)
    except Exception as e:  # noqa: BLE001 - report, keep serving; the judge decides
        answer, reply, payload = P.Kind.ERROR, _failure(state, e), None
    # What the command brought is let go before the answer travels: a correctness run's set is
    # freed before its output is copied. Its top level only: what a handler kept of it (a model's
    # init arguments, the pool's tensors) stays as it is.
    if isinstance(msg.payload, (list, dict)):
        msg.payload.clear()
    send(state.channel, answer, reply, payload)
    return True


def _failure(state: WorkerState, e: Exception) -> P.Error:
    """A command's exception as the judge reads it; an out-of-memory error on a device with what
    the device held once this worker gave its cached blocks back (`kernelrl.judge.harness.devmem`)."""
    error = P.Error(phase=P.Phase.RUN, message=f"{type(e).__name__}: {e}", traceback=traceback.format_exc(limit=8))
    memory = None
    if isinstance(e, torch.OutOfMemoryError):
        e.__traceback__ = None  # its frames hold the tensors of the failed call
        devmem.release(state.device)
        memory = devmem.read(state.device)
    if memory is None:
        return error
    return dataclasses.replace(error, out_of_memory=True, device_free_bytes=memory.free_bytes,
                               device_total_bytes=memory.total_bytes, device_own_bytes=memory.own_bytes)


if __name__ == "__main__":
    # Exit without interpreter teardown: a program's atexit hooks or threads must not hang us.
    code = main(sys.argv)
    sys.stdout.flush()
    os._exit(code)
