"""What a worker loads (`Loaded`): a task's module and model (a reference worker), or a program's
`ModelNew` and its model (a candidate's worker), built on the judge's seeds.

Guarantees: task code (the module body, `get_init_inputs`, `Model`) runs only here, in a reference
worker, with the hubs offline; every failure of task or program code is an error answer with its
phase (`compile` or `init`), never the end of the worker; a program that copied the task's size
constants runs at the judged size (the values of the active preset), and says which it changed.
The random seed is the judge's (`init_seed`) for every model built; init inputs are made under it
without touching the process's generator state.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
import traceback
import types
from pathlib import Path
from typing import Any

import torch

from kernelrl.judge.harness import protocol as P
from kernelrl.judge.harness.device import Device
from kernelrl.judge.harness.places import BUILD_DIR_ENV, CACHE_ROOT_ENV
from kernelrl.judge.harness.precision import global_state
from kernelrl.judge.harness.toolchain import (
    CudaDeviceCodeCheck,
    SharedHeaders,
    configure_triton,
    exclusive_build_dir,
)

Reply = tuple[P.Kind, P.Header, Any]
# Bound now, before any program code runs.
_manual_seed = torch.manual_seed
_fork_rng = torch.random.fork_rng


class LoadError(Exception):
    def __init__(self, phase: P.Phase, message: str, tb: str = ""):
        super().__init__(message)
        self.phase = phase
        self.tb = tb

    def reply(self) -> Reply:
        return P.Kind.ERROR, P.Error(phase=self.phase, message=str(self), traceback=self.tb), None


def own(variable: str, named: str) -> str:
    """The folder the sandbox gave this worker for `variable` (full containment), else the one the judge named."""
    return os.environ.get(variable) or named


def construct(cls: Any, init_inputs: list[Any], init_seed: int, compile_mode: str | None, device: str) -> Any:
    """`cls(*init_inputs)` under the judge's seed, on `device`, compiled when asked; raises LoadError."""
    try:
        _manual_seed(int(init_seed))
        model = cls(*init_inputs)
        if isinstance(model, torch.nn.Module):
            model = model.to(device)
        if compile_mode is not None:
            model = torch.compile(model, mode=None if compile_mode == "default" else compile_mode)
        return model
    except Exception as e:  # noqa: BLE001 - any failure to construct is the program's
        raise LoadError(P.Phase.INIT, f"{type(e).__name__}: {e}", traceback.format_exc(limit=8)) from e


def import_candidate(source: str, constants: dict[str, int]) -> tuple[Any, dict[str, list[int]]]:
    """The program's `ModelNew`, and the size constants it copied that were changed to the judged ones."""
    path = Path.cwd() / "candidate.py"
    if any(not k.isidentifier() for k in constants):
        # The task was sized through tuple elements or layer literals: a candidate that copied
        # them must be sized the same way to match the reference (plain names are set below).
        from kernelrl.tasks.source import sized_source

        try:
            source = sized_source(source, {k: v for k, v in constants.items() if not k.isidentifier()})
        except (SyntaxError, ValueError, RecursionError) as e:
            raise LoadError(P.Phase.COMPILE, f"{type(e).__name__}: {e}") from e
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("kernelrl_candidate", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["kernelrl_candidate"] = mod
    try:
        with exclusive_build_dir():
            spec.loader.exec_module(mod)
    except SyntaxError as e:
        raise LoadError(P.Phase.COMPILE, f"SyntaxError: {e}", traceback.format_exc(limit=2)) from e
    except BaseException as e:  # noqa: BLE001 - SystemExit at import is a failed load too
        raise LoadError(P.Phase.COMPILE, f"{type(e).__name__}: {e}", traceback.format_exc(limit=8)) from e
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
        raise LoadError(P.Phase.COMPILE, "the program defines no `ModelNew`")
    return cls, overridden


class Loaded:
    """What this worker loaded: the task's module, its constants and the mode its reference is compiled
    under (a reference worker), or the program's class until `construct` makes its model (a candidate's)."""

    def __init__(self) -> None:
        self.module: types.ModuleType | None = None
        self.constants: dict[str, int] = {}
        self.compile_mode: str | None = None  # the task's reference runs under torch.compile (a baseline's worker)
        self.program_class: Any = None

    def load_task(self, h: P.LoadTask, payload: Any, state_before: dict[str, P.Setting],
                  device: str) -> tuple[Reply, Any]:
        """The task's module run with its constants, and its model; (the answer, the model or None)."""
        from kernelrl.tasks.sizes import resolve_constants
        from kernelrl.tasks.source import compile_task
        from kernelrl.tasks.task import Task, TaskError, offline_hubs

        cache_root = own(CACHE_ROOT_ENV, h.cache_root)
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
            return (P.Kind.ERROR, P.Error(phase=P.Phase.COMPILE, message=f"{type(e).__name__}: {e}",
                                          traceback=traceback.format_exc(limit=8)), None), None
        self.module, self.constants, self.compile_mode = mod, constants, h.compile_mode
        try:
            init_inputs, model = self.build_model(h.init_seed, device)
        except LoadError as e:
            return e.reply(), None
        profile = None
        if h.profile:
            from kernelrl.judge.harness.profile import profile_task

            profile = profile_task(mod, task=h.task_name, size=h.size, constants=constants, init_inputs=init_inputs,
                                   source=h.task_source).to_dict()
        return (P.Kind.TASK_LOADED, P.TaskLoaded(constants=constants, load_s=time.monotonic() - t0, profile=profile,
                                                 state_before=state_before, state_after=global_state()),
                init_inputs), model

    def build_model(self, init_seed: int, device: str) -> tuple[list[Any], Any]:
        """The loaded task's init inputs and model under `init_seed`; raises LoadError."""
        assert self.module is not None
        try:
            with _fork_rng(devices=[]):
                _manual_seed(init_seed)
                init_inputs = list(self.module.get_init_inputs())
        except Exception as e:  # noqa: BLE001 - any failure of task code is the task's
            raise LoadError(P.Phase.COMPILE, f"{type(e).__name__}: {e}", traceback.format_exc(limit=8)) from e
        return init_inputs, construct(self.module.Model, init_inputs, init_seed, self.compile_mode, device)

    def load_program(self, h: P.LoadProgram, state_before: dict[str, P.Setting]) -> Reply:
        # The program's own build folder (keyed by its source) and the shared inductor cache;
        # under full containment both are in this worker's scratch (the judge's are not visible).
        build_dir, cache_root = own(BUILD_DIR_ENV, h.build_dir), own(CACHE_ROOT_ENV, h.cache_root)
        os.environ["TORCH_EXTENSIONS_DIR"] = build_dir
        os.environ["TRITON_CACHE_DIR"] = os.path.join(build_dir, "triton")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache_root, "inductor")
        SharedHeaders(h.headers_dir or None).install()
        configure_triton(Device(h.device), h.source)  # before the import: triton.jit reads it when a kernel is decorated
        if h.device == "cpu":
            CudaDeviceCodeCheck().install()
        t0 = time.monotonic()
        try:
            cls, overridden = import_candidate(h.source, h.constants)
        except LoadError as e:
            return e.reply()
        build_s = time.monotonic() - t0
        self.program_class = cls
        return P.Kind.LOADED, P.Loaded(build_s=build_s, state_before=state_before, state_after=global_state(),
                                       constants_overridden=overridden), None
