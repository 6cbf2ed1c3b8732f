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
  bound when this module is imported (the clock first of all; the synchronisation in
  `bench.py`, imported with it), before any program code runs, so rebinding
  `time.perf_counter`, `torch.cuda.synchronize` or the C function behind it
  (`torch._C._cuda_synchronize`) afterwards changes nothing here;
- task code (the module body, `get_init_inputs`, `get_inputs`, `Model`) runs only here, in a
  reference worker: the judge receives tensors and plain data;
- the parts: what it loads and builds (`loading.py`: `Loaded`), its device (`bench.py`:
  `Bench`), how it is timed (`sampling.py`: `Sampling`); inputs, parameters and correctness
  runs are answered here;
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
import os  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from typing import Any  # noqa: E402

# What the calls' thread and process counts read /proc with, bound before any program code can
# rebind it (`procfs.descendants` binds its own).
_listdir, _getpid = os.listdir, os.getpid

# No torch behind these two: read before torch is imported.
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
from kernelrl.judge.harness.bench import Bench  # noqa: E402
from kernelrl.judge.harness.channel import Arena, Channel, ChannelProtocolError, Message  # noqa: E402
from kernelrl.judge.harness.compare import content_digest  # noqa: E402
from kernelrl.judge.harness.fingerprint import same_bytes  # noqa: E402
from kernelrl.judge.harness.loading import Loaded, LoadError, construct  # noqa: E402
from kernelrl.judge.harness.peaks import machine_peaks  # noqa: E402
from kernelrl.judge.harness.precision import global_state  # noqa: E402
from kernelrl.judge.harness.sampling import Sampling  # noqa: E402
from kernelrl.judge.harness.values import all_finite as _all_finite  # noqa: E402
from kernelrl.judge.harness.values import in_place as _in_place  # noqa: E402
from kernelrl.judge.harness.values import own_copy as _own_copy  # noqa: E402
from kernelrl.judge.harness.values import perturb as _perturb  # noqa: E402
from kernelrl.judge.harness.values import readable as _readable  # noqa: E402
from kernelrl.judge.harness.values import to_cpu as _to_cpu  # noqa: E402
from kernelrl.judge.harness.values import to_device as _to_device  # noqa: E402

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


class WorkerState:
    """What one worker holds between commands: its channel, its device (`Bench`), what it loaded
    (`Loaded`), the model it runs, and its timing pool and last sample (`Sampling`). The commands
    that load and time are answered by those parts; inputs (a reference's), parameters and the
    correctness runs here."""

    def __init__(self, channel: Channel):
        self.channel = channel
        self.bench = Bench()
        self.loaded = Loaded()
        self.model: Any = None
        self.sampling = Sampling(_pin_allocator)

    @property
    def device(self) -> str:
        return self.bench.device

    def _start(self, device: str, threads: int, evict_bytes: int, allow_tf32: bool) -> dict[str, P.Setting]:
        self.bench.start(device, threads, evict_bytes, allow_tf32)
        return global_state()

    def _sync(self) -> None:
        self.bench.sync()

    def _evict(self) -> None:
        self.bench.evict()

    # -- loading (`loading.py`) ---------------------------------------------------------------

    def load_task(self, h: P.LoadTask, payload: Any) -> Reply:
        state_before = self._start(h.device, h.threads, h.evict_bytes, h.allow_tf32)
        reply, model = self.loaded.load_task(h, payload, state_before, self.device)
        if model is not None:
            self.model = model
        return reply

    def reseed(self, h: P.Reseed, payload: Any) -> Reply:
        """The loaded task's model built again under a new init seed (a kept reference worker's next
        group); `state_before` is the settings as the last group left them, for the judge to compare."""
        if self.loaded.module is None:
            return P.Kind.ERROR, P.Error(phase=P.Phase.PROTOCOL, message="reseed before load_task"), None
        state_before, t0 = global_state(), time.monotonic()
        self.model = None  # the last group's model goes before the next one is built
        try:
            init_inputs, self.model = self.loaded.build_model(h.init_seed, self.device)
        except LoadError as e:
            return e.reply()
        return P.Kind.TASK_LOADED, P.TaskLoaded(constants=self.loaded.constants, load_s=time.monotonic() - t0,
                                                profile=None, state_before=state_before,
                                                state_after=global_state()), init_inputs

    def load_program(self, h: P.LoadProgram, payload: object) -> Reply:
        return self.loaded.load_program(h, self._start(h.device, h.threads, h.evict_bytes, h.allow_tf32))

    def construct(self, h: P.Construct, payload: Any) -> Reply:
        """The model of the program `load_program` imported."""
        if self.loaded.program_class is None:
            return P.Kind.ERROR, P.Error(phase=P.Phase.PROTOCOL, message="construct before a program was loaded"), None
        try:
            self.model = construct(self.loaded.program_class, list(payload or []), h.init_seed, None, self.device)
        except LoadError as e:
            return e.reply()
        return P.Kind.CONSTRUCTED, P.Constructed(state_after=global_state()), None

    # -- inputs (reference workers) -----------------------------------------------------------

    def make_inputs(self, h: P.MakeInputs, payload: object) -> Reply:
        if self.loaded.module is None:
            return P.Kind.ERROR, P.Error(phase=P.Phase.PROTOCOL, message="make_inputs before load_task"), None
        sets, outputs, finite = [], [], []
        # One set per message (the judge's way) is sent as it is, read in place: no copy of it can
        # be changed by a later run before the arena takes it. Several in one message are copied.
        take = _readable if len(h.seeds) == 1 else _to_cpu
        module, on_host = self.loaded.module, self.device == "cpu"

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

    # -- timing (`sampling.py`) -----------------------------------------------------------------

    def set_pool(self, h: P.Pool, payload: Any) -> Reply:
        return self.sampling.set_pool(h, payload, self.device)

    def warmup(self, h: P.Warmup, payload: object) -> Reply:
        return self.sampling.warmup(h, self.model, self.bench, _perf_ns)

    def prepare(self, h: P.Prepare, payload: object) -> Reply:
        return self.sampling.prepare(h, self.bench)

    def call(self, h: P.Header, payload: object) -> Reply:
        return self.sampling.call(self.model, self.bench, _perf_ns)

    def output(self, h: P.Output, payload: object) -> Reply:
        return self.sampling.output(h, self.device)

    def measure_peaks(self, h: P.MeasurePeaks, payload: object) -> Reply:
        self._start(h.device, h.threads, 0, False)  # exact fp32: the peaks of the default precision
        return P.Kind.PEAKS, machine_peaks(h.device, self._sync, _perf_ns), None


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
