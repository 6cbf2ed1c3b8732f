"""The judge <-> worker protocol: every message kind and its typed header, shared by both sides.

A message is a `Kind`, a header (one of the dataclasses below, sent as JSON) and an optional
tensor payload (`kernelrl.judge.harness.channel`). The judge sends a command and accepts only the answer
kinds that command allows (`ANSWERS`), so a worker cannot answer out of turn.

Guarantees: `decode(kind, fields)` returns the header dataclass of that kind or raises
`ChannelProtocolError` naming what is wrong (unknown kind, missing or extra field, wrong type);
nothing a worker sends is trusted further than that (values are checked by the judge).

Does not say what the values mean for a verdict: the evaluator and `kernelrl.checks.dynamic` do.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from dataclasses import dataclass
from typing import Any, ClassVar, TypeAlias

from kernelrl.judge.harness.channel import ChannelProtocolError


class Kind(enum.StrEnum):
    # worker -> judge, unasked: once, when the interpreter is up and torch is imported
    HELLO = "hello"
    # commands (judge -> worker)
    LOAD_TASK = "load_task"  # the reference: resolve sizes, run the task module, build Model
    RESEED = "reseed"  # a kept reference worker's next group: build Model again under a new init seed
    LOAD_PROGRAM = "load_program"  # a candidate (or a compiled reference): build and construct ModelNew
    CONSTRUCT = "construct"  # a program loaded without constructing: construct ModelNew now
    MAKE_INPUTS = "make_inputs"  # the reference: input sets from the judge's secret seeds
    GET_STATE = "get_state"
    LOAD_STATE = "load_state"
    RUN = "run"  # correctness: each input set once (the first several times)
    POOL = "pool"  # the timing pool
    WARMUP = "warmup"
    PREPARE = "prepare"  # fresh inputs for the next timed sample, then a cache eviction
    CALL = "call"  # one timed sample
    OUTPUT = "output"  # one call's output and inputs from the last sample, for a spot check
    MEASURE_PEAKS = "measure_peaks"  # the machine's memory bandwidth and matmul rate
    EXIT = "exit"
    # answers (worker -> judge)
    TASK_LOADED = "task_loaded"
    LOADED = "loaded"
    CONSTRUCTED = "constructed"
    INPUTS = "inputs"
    STATE = "state"
    STATE_LOADED = "state_loaded"
    RAN = "ran"
    POOLED = "pooled"
    WARM = "warm"
    PREPARED = "prepared"
    CALLED = "called"
    OUTPUT_DATA = "output_data"
    PEAKS = "peaks"
    ERROR = "error"


class Phase(enum.StrEnum):
    """Where a worker's error happened: decides the verdict (compile error, runtime error...)."""

    COMPILE = "compile"  # the program does not build or import
    INIT = "init"  # the model cannot be constructed
    RUN = "run"
    PROTOCOL = "protocol"


# One global torch setting as the worker reads it (`precision.global_state`): a flag, a count or a name.
Setting: TypeAlias = bool | int | str


@dataclass(frozen=True, kw_only=True)
class Header:
    KIND: ClassVar[Kind]


# -- commands ----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class LoadTask(Header):
    KIND: ClassVar[Kind] = Kind.LOAD_TASK
    # The payload, when present, is the exact constants to use (resolved by another worker);
    # otherwise the worker resolves `size` (shrinking on the meta device) plus `overrides`.
    task_source: str
    task_name: str
    size: str
    presets: dict[str, dict[str, int]]  # explicit constants per size preset
    overrides: dict[str, int]  # explicit constants on top of the size
    device: str
    threads: int
    init_seed: int
    evict_bytes: int
    profile: bool  # also count FLOPs and describe inputs, outputs and the model (task profile)
    cache_root: str  # the evaluator's cache (torch.compile's cache persists there)
    compile_mode: str | None = None  # set: this worker runs the reference under torch.compile
    allow_tf32: bool = False  # the judge's fp32 precision (judge.precision), set before task code runs


@dataclass(frozen=True, kw_only=True)
class Reseed(Header):
    """The loaded task's `get_init_inputs` and `Model` again, under a new init seed; the module is
    not run again. Answered with `TaskLoaded` (its `state_before`: the settings as the last group
    left them) and the init inputs."""

    KIND: ClassVar[Kind] = Kind.RESEED
    init_seed: int


@dataclass(frozen=True, kw_only=True)
class LoadProgram(Header):
    KIND: ClassVar[Kind] = Kind.LOAD_PROGRAM
    source: str
    constants: dict[str, int]  # the task's constants at the judged size (copies of them follow)
    device: str
    threads: int
    evict_bytes: int
    build_dir: str  # TORCH_EXTENSIONS_DIR for this program: its own, keyed by content hash
    cache_root: str  # the evaluator's cache (inductor's)
    headers_dir: str = ""  # the judge's precompiled headers (`kernelrl.judge.isolation.headers`); "": none
    allow_tf32: bool = False  # the judge's fp32 precision (judge.precision), set before program code runs


@dataclass(frozen=True, kw_only=True)
class Construct(Header):
    """The model of the loaded program. Apart from `LoadProgram` (import and build) because the judge
    constructs under the device's lock and builds outside it: construction runs on the device
    (parameters moved there)."""

    KIND: ClassVar[Kind] = Kind.CONSTRUCT
    init_seed: int  # the payload: the task's init inputs


@dataclass(frozen=True, kw_only=True)
class MakeInputs(Header):
    KIND: ClassVar[Kind] = Kind.MAKE_INPUTS
    seeds: list[int]
    # per set: [scale, offset as a fraction of the input's mean |value|], or None for a plain set
    perturb: list[list[float] | None]
    run: bool  # also run the reference on each set and return its outputs


@dataclass(frozen=True, kw_only=True)
class Empty(Header):
    """Commands and answers without fields (see `HEADERS`)."""


@dataclass(frozen=True, kw_only=True)
class Run(Header):
    """One correctness run of the input set in the payload (its answer's payload: `{"outputs": [output]}`)."""

    KIND: ClassVar[Kind] = Kind.RUN


POOL_NOISE_ELEMENTS = 1 << 22  # a pool input's noise at most (16 MiB of fp32): not a second copy of a large set


@dataclass(frozen=True, kw_only=True)
class Pool(Header):
    """The timing pool (payload: input sets) and the noise every timed call's inputs are jittered by:
    per floating input, `POOL_NOISE_ELEMENTS` values at most, repeated over a larger input."""

    KIND: ClassVar[Kind] = Kind.POOL
    noise_seed: int  # the same in every worker of a group, so every member gets the same inputs
    jitter: float  # each floating value is scaled by a factor within 1 +- jitter, fresh per call


@dataclass(frozen=True, kw_only=True)
class Warmup(Header):
    KIND: ClassVar[Kind] = Kind.WARMUP
    calls: int
    max_s: float


@dataclass(frozen=True, kw_only=True)
class Prepare(Header):
    KIND: ClassVar[Kind] = Kind.PREPARE
    index: int  # pool set of the first call
    scales: list[float]  # one per call of the sample: fresh inputs for each
    shifts: list[int]  # one per call: where the call's noise starts (a roll of the pool's noise)


@dataclass(frozen=True, kw_only=True)
class Output(Header):
    KIND: ClassVar[Kind] = Kind.OUTPUT
    call: int  # which call of the last sample: chosen by the judge after the sample returned
    key: int = 0  # the inputs' digest key (`fingerprint.keyed_digest`): drawn after the sample returned


@dataclass(frozen=True, kw_only=True)
class MeasurePeaks(Header):
    KIND: ClassVar[Kind] = Kind.MEASURE_PEAKS
    device: str
    threads: int


# -- answers -----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Hello(Header):
    KIND: ClassVar[Kind] = Kind.HELLO
    pid: int
    torch: str
    python: str


@dataclass(frozen=True, kw_only=True)
class TaskLoaded(Header):
    KIND: ClassVar[Kind] = Kind.TASK_LOADED
    constants: dict[str, int]
    load_s: float
    profile: dict[str, Any] | None  # `kernelrl.judge.harness.profile.TaskProfile` fields, when asked
    state_before: dict[str, Setting]
    state_after: dict[str, Setting]


@dataclass(frozen=True, kw_only=True)
class Constructed(Header):
    KIND: ClassVar[Kind] = Kind.CONSTRUCTED
    state_after: dict[str, Setting]  # the process's global state once the model is made


@dataclass(frozen=True, kw_only=True)
class Loaded(Header):
    KIND: ClassVar[Kind] = Kind.LOADED
    build_s: float
    state_before: dict[str, Setting]
    state_after: dict[str, Setting]
    # the task's size constants the program's module set to other values: name -> [theirs, the task's]
    constants_overridden: dict[str, list[int]]


@dataclass(frozen=True, kw_only=True)
class InputsMade(Header):
    KIND: ClassVar[Kind] = Kind.INPUTS
    finite: list[bool]  # per set: the reference's output is finite (True when not run)


@dataclass(frozen=True, kw_only=True)
class State(Header):
    KIND: ClassVar[Kind] = Kind.STATE
    keys: list[str]


@dataclass(frozen=True, kw_only=True)
class StateLoaded(Header):
    KIND: ClassVar[Kind] = Kind.STATE_LOADED
    loaded: bool
    why: str = ""


@dataclass(frozen=True, kw_only=True)
class Ran(Header):
    KIND: ClassVar[Kind] = Kind.RAN
    state_after: dict[str, Setting]
    thread_rises: list[int]  # per call: threads alive after the call minus before
    child_rises: list[int]  # per call: descendant processes after the call minus before
    changed_after_return: list[bool]  # per call: the output changed in the moments after return
    # per call: the call changed its inputs (compared in the worker with the set as received, so
    # the inputs do not travel back: an honest program's in-place writes are what this catches;
    # a dishonest one could forge any report, which is why outputs are judged in the judge)
    inputs_changed: list[bool]
    peak_device_bytes: int = 0  # the most device memory the program had allocated in the call (0 on a CPU)


@dataclass(frozen=True, kw_only=True)
class Pooled(Header):
    KIND: ClassVar[Kind] = Kind.POOLED
    n: int
    allocator_pinned: bool = False  # the worker's report: glibc took `startup.PINNED_MALLOPT` (from this pool on)


@dataclass(frozen=True, kw_only=True)
class Warm(Header):
    KIND: ClassVar[Kind] = Kind.WARM
    calls: int
    call_ms: float  # median of the warm-up calls
    state_after: dict[str, Setting]
    floor_ns: float = 0.0  # the timing bracket around nothing (worker.call_floor_ns)


@dataclass(frozen=True, kw_only=True)
class Called(Header):
    KIND: ClassVar[Kind] = Kind.CALLED
    t_ns: list[int]  # per call of the sample
    plain: bool  # every output of every call was exactly torch.Tensor
    # per call: `channel.commitment` of its output, taken as it returned; a spot check's output must
    # match it (an output computed only when the judge asks for it cannot be committed to in time)
    commits: list[int]


@dataclass(frozen=True, kw_only=True)
class OutputData(Header):
    """A spot check's answer (payload: `{"output": ...}`): the call's inputs travel as a digest, not
    as values; the judge compares it with the reference's for the same call (an input written in
    place), so only the output crosses the arena."""

    KIND: ClassVar[Kind] = Kind.OUTPUT_DATA
    # of the call's inputs, read after its sample: `compare.content_digest` on the host,
    # `fingerprint.keyed_digest` under the command's key on a device (no copy to the host)
    inputs_digest: str


@dataclass(frozen=True, kw_only=True)
class Peaks(Header):
    KIND: ClassVar[Kind] = Kind.PEAKS
    bandwidth_gbs: float  # triad: a = b + s * c, bytes read + written per second
    fp32_tflops: float  # large matmul
    bf16_tflops: float | None


@dataclass(frozen=True, kw_only=True)
class Error(Header):
    KIND: ClassVar[Kind] = Kind.ERROR
    phase: Phase
    message: str
    traceback: str = ""
    # An out-of-memory error on a device, and the device's memory as the worker then saw it
    # (`kernelrl.judge.harness.devmem.DeviceMemory`: zeros where out_of_memory is False or on a CPU).
    out_of_memory: bool = False
    device_free_bytes: int = 0
    device_total_bytes: int = 0
    device_own_bytes: int = 0


# Header class of each kind; kinds that carry no fields use `Empty`.
HEADERS: dict[Kind, type[Header]] = {
    cls.KIND: cls for cls in (LoadTask, Reseed, LoadProgram, Construct, MakeInputs, Run, Pool, Warmup, Prepare,
                              Output, MeasurePeaks, Hello, TaskLoaded, Loaded, Constructed, InputsMade, State,
                              StateLoaded, Ran, Pooled, Warm, Called, OutputData, Peaks, Error)
}
for _kind in (Kind.GET_STATE, Kind.LOAD_STATE, Kind.CALL, Kind.EXIT, Kind.PREPARED):
    HEADERS[_kind] = Empty

# What each command may be answered with (every command may also fail with ERROR).
ANSWERS: dict[Kind, Kind] = {
    Kind.LOAD_TASK: Kind.TASK_LOADED, Kind.RESEED: Kind.TASK_LOADED, Kind.LOAD_PROGRAM: Kind.LOADED,
    Kind.CONSTRUCT: Kind.CONSTRUCTED, Kind.MAKE_INPUTS: Kind.INPUTS,
    Kind.GET_STATE: Kind.STATE, Kind.LOAD_STATE: Kind.STATE_LOADED, Kind.RUN: Kind.RAN, Kind.POOL: Kind.POOLED,
    Kind.WARMUP: Kind.WARM, Kind.PREPARE: Kind.PREPARED, Kind.CALL: Kind.CALLED, Kind.OUTPUT: Kind.OUTPUT_DATA,
    Kind.MEASURE_PEAKS: Kind.PEAKS,
}


def encode(kind: Kind, header: Header | None) -> dict[str, Any]:
    """The JSON-able fields of a header (enums as their values)."""
    if header is None:
        return {}
    expected = HEADERS[kind]
    if not isinstance(header, expected):
        raise TypeError(f"a {kind.value} message carries a {expected.__name__}, not {type(header).__name__}")
    return {f.name: getattr(header, f.name) for f in dataclasses.fields(header)}


def decode(kind: str, fields: dict[str, Any]) -> tuple[Kind, Header]:
    """The typed header of a received message; ChannelProtocolError when it does not fit."""
    try:
        k = Kind(kind)
    except ValueError:
        raise ChannelProtocolError(f"unknown message kind {kind!r}") from None
    cls = HEADERS[k]
    hints = _hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    extra = set(fields) - names
    if extra:
        raise ChannelProtocolError(f"{k.value}: unexpected field(s) {sorted(extra)}")
    required = {f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    missing = required - set(fields)
    if missing:
        raise ChannelProtocolError(f"{k.value}: missing field(s) {sorted(missing)}")
    values = {}
    for name, value in fields.items():
        values[name] = _check(hints[name], value, f"{k.value}.{name}")
    return k, cls(**values)


@typing.no_type_check
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _check(tp: Any, value: Any, where: str) -> Any:
    """Shallow type check of a JSON value against a header field's annotation."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for option in args:
            if option is type(None):
                continue
            try:
                return _check(option, value, where)
            except ChannelProtocolError:
                continue
        raise ChannelProtocolError(f"{where}: {type(value).__name__} is not a {tp}")
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            raise ChannelProtocolError(f"{where}: {value!r} is not a {tp.__name__}") from None
    if tp is Any:
        return value
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ChannelProtocolError(f"{where}: expected a number")
    if tp in (int, bool, str):
        if type(value) is tp or (tp is int and type(value) is int):
            return value
        raise ChannelProtocolError(f"{where}: expected {tp.__name__}, got {type(value).__name__}")
    if origin is list:
        if not isinstance(value, list):
            raise ChannelProtocolError(f"{where}: expected a list")
        return [_check(args[0], v, where) for v in value] if args else value
    if origin is dict:
        if not isinstance(value, dict):
            raise ChannelProtocolError(f"{where}: expected an object")
        return {k: _check(args[1], v, where) for k, v in value.items()} if args else value
    return value


