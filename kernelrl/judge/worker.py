"""The worker: runs one program (the reference or a candidate) on the judge's command.

Started by `kernelrl.judge.sandbox.Worker` as `python -m kernelrl.judge.worker READ_FD WRITE_FD`. It answers
one request at a time and does nothing unasked. The judge holds the secrets, the reference
outputs and the verdict; the worker only builds, initialises, runs and times.

Guarantees (for an honest worker; the judge checks what it can, see `kernelrl.judge.evaluator`):
- the clock, the synchronisation call and the tensor type used for timing and checking are
  bound when this module is imported, before any candidate code runs, so rebinding
  `time.perf_counter` or `torch.cuda.synchronize` afterwards changes nothing here;
- a timed call is bracketed by a device-wide synchronisation (every stream on CUDA), so work
  queued on side streams is inside the measurement;
- each timed call gets freshly made inputs (a new tensor whose values are scaled by a factor
  the judge picks per call), and the cache is evicted before it (last-level cache on CPU, L2 on
  GPU);
- global torch settings are snapshotted before the program is loaded and reported when they
  change.

C++ and CUDA builds through torch's inline loader go to `TORCH_EXTENSIONS_DIR`, which the judge
keys by content hash, so a program seen before loads its cached build. On CPU, builds use torch's
precompiled header for `torch/extension.h` (prepared once, under a file lock).
"""

from __future__ import annotations

import time

_perf_ns = time.perf_counter_ns  # bound before any candidate code can rebind it

import fcntl  # noqa: E402
import importlib.util  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

from kernelrl.judge.channel import Channel, Message  # noqa: E402
from kernelrl.judge.compare import exactly_equal, flatten  # noqa: E402

_Tensor = torch.Tensor
_cuda_sync = torch.cuda.synchronize
_no_grad = torch.no_grad
_manual_seed = torch.manual_seed


def _thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def global_state() -> dict[str, Any]:
    """Settings a program could flip to change precision or parallelism."""
    state: dict[str, Any] = {
        "num_threads": torch.get_num_threads(),
        "num_interop_threads": torch.get_num_interop_threads(),
        "default_dtype": str(torch.get_default_dtype()),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "grad_enabled": torch.is_grad_enabled(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "mkldnn_enabled": torch.backends.mkldnn.enabled,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cuda_matmul_allow_fp16_reduced_precision": torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "cuda_matmul_allow_bf16_reduced_precision": torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
    }
    return state


def _to_device(x: Any, device: str) -> Any:
    if isinstance(x, _Tensor):
        return x.to(device)
    if isinstance(x, list):
        return [_to_device(v, device) for v in x]
    if isinstance(x, tuple):
        return tuple(_to_device(v, device) for v in x)
    return x


def _to_cpu(x: Any) -> Any:
    """Outputs for the judge: plain tensors become CPU copies; anything else is described."""
    if type(x) is _Tensor:
        return x.detach().to("cpu").clone()
    if isinstance(x, (list, tuple)):
        return [_to_cpu(v) for v in x]
    if isinstance(x, _Tensor):
        # A subclass (a lazy tensor, say) never crosses the channel: the judge gets a marker.
        return {"not_plain_tensor": type(x).__module__ + "." + type(x).__qualname__}
    if isinstance(x, (int, float, bool)) or x is None:
        return x
    return {"unsupported_output": type(x).__module__ + "." + type(x).__qualname__}


def _clone(x: Any) -> Any:
    if isinstance(x, _Tensor):
        return x.clone()
    if isinstance(x, list):
        return [_clone(v) for v in x]
    if isinstance(x, tuple):
        return tuple(_clone(v) for v in x)
    return x


class _Build:
    """Torch's inline loader, with a precompiled torch header for CPU builds.

    Torch keeps one precompiled `torch/extension.h` per install, valid for one set of compiler
    flags; rebuilding it for every new flag set would cost more than it saves. So the header is
    built for the first flag set seen under this cache root, and used only by builds with those
    same flags; other builds compile plainly.
    """

    def __init__(self, cache_root: str | None):
        self.cache_root = cache_root or os.environ.get("TMPDIR", "/tmp")

    def install(self) -> None:
        from torch.utils import cpp_extension

        original = cpp_extension.load_inline
        prepare = getattr(cpp_extension, "_check_and_build_extension_h_precompiler_headers", None)
        build = self

        def load_inline(*args: Any, **kwargs: Any) -> Any:
            cpu_only = not kwargs.get("cuda_sources") and (len(args) < 3 or not args[2])
            if cpu_only and prepare is not None and "use_pch" not in kwargs:
                kwargs["use_pch"] = build.prepare_pch(prepare, kwargs.get("extra_cflags"),
                                                      kwargs.get("extra_include_paths"))
            return original(*args, **kwargs)

        load_inline.__wrapped__ = original  # type: ignore[attr-defined]
        cpp_extension.load_inline = load_inline

    def prepare_pch(self, prepare: Any, cflags: Any, include_paths: Any) -> bool:
        import json

        flags = json.dumps([list(cflags or []), list(include_paths or [])])
        try:
            os.makedirs(self.cache_root, exist_ok=True)
            record = os.path.join(self.cache_root, "pch-flags.json")
            # Under a lock: parallel builds must never read a half-written header.
            with open(os.path.join(self.cache_root, "pch.lock"), "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                owner = open(record).read() if os.path.exists(record) else None
                if owner is not None and owner != flags:
                    return False
                prepare(cflags, include_paths)  # a no-op when torch's header matches these flags
                if owner is None:
                    with open(record, "w") as f:
                        f.write(flags)
            return True
        except Exception:  # noqa: BLE001 - no PCH (read-only torch, another compiler): build plainly
            return False


class WorkerState:
    def __init__(self, channel: Channel):
        self.channel = channel
        self.device = "cpu"
        self.model: Any = None
        self.pool: list[list[Any]] = []
        self.current: list[Any] | None = None
        self.last_out: Any = None
        self.evict_buf: torch.Tensor | None = None
        self.state_before: dict[str, Any] = {}

    # -- commands -----------------------------------------------------------------------------

    def setup(self, msg: Message) -> tuple[str, dict[str, Any], Any]:
        h = msg.header
        self.device = h["device"]
        torch.set_num_threads(int(h["threads"]))
        if self.device == "cuda":
            torch.cuda.init()
        self.state_before = global_state()
        init_inputs = msg.payload or []
        _Build(h.get("cache_root")).install()

        t0 = time.monotonic()
        try:
            if h["role"] == "reference":
                cls = self._load_reference(h["task_source"], h["task_name"], h["constants"])
            else:
                cls = self._load_candidate(h["source"], h.get("constants") or {})
        except _LoadError as e:
            return "error", {"phase": "compile", "message": str(e), "traceback": e.tb}, None
        build_s = time.monotonic() - t0

        try:
            _manual_seed(int(h["init_seed"]))
            model = cls(*init_inputs)
            if isinstance(model, torch.nn.Module):
                model = model.to(self.device)
            if h.get("compile"):
                model = torch.compile(model, mode=h.get("compile_mode") or None)
        except Exception as e:  # noqa: BLE001 - any failure to construct is the program's
            return "error", {"phase": "init", "message": f"{type(e).__name__}: {e}",
                             "traceback": traceback.format_exc(limit=8)}, None
        self.model = model
        evict = int(h.get("evict_bytes") or 0)
        if evict:
            self.evict_buf = torch.zeros(evict // 4, dtype=torch.float32, device=self.device)
            # The first parallel op starts the OpenMP pool: do it now, so threads that appear
            # during timed calls are the program's own.
            self.evict_buf.add_(1.0)
        reply = {"build_s": build_s, "state_before": self.state_before, "state_after": global_state(),
                 "pid": os.getpid()}
        if h.get("measure_bandwidth"):
            reply["copy_gbps"] = self._copy_bandwidth()
        return "loaded", reply, None

    def _copy_bandwidth(self) -> float:
        """Best of a few large copies, in GB/s of bytes read plus written: the memory roof."""
        n = (256 << 20) // 4
        src = torch.ones(n, dtype=torch.float32, device=self.device)
        dst = torch.empty_like(src)
        best = float("inf")
        for _ in range(5):
            self._sync()
            t0 = _perf_ns()
            dst.copy_(src)
            self._sync()
            best = min(best, (_perf_ns() - t0) / 1e9)
        del src, dst
        return 2 * n * 4 / best / 1e9

    def _load_reference(self, source: str, name: str, constants: dict[str, int]) -> Any:
        import types

        from kernelrl.tasks.task import compile_task

        mod = types.ModuleType("kernelrl_reference")
        try:
            exec(compile_task(source, constants, f"<task {name}>"), mod.__dict__)  # noqa: S102 - trusted task
        except Exception as e:  # noqa: BLE001
            raise _LoadError(f"reference failed to load: {type(e).__name__}: {e}", traceback.format_exc(limit=8)) from e
        return mod.Model

    def _load_candidate(self, source: str, constants: dict[str, int]) -> Any:
        path = Path.cwd() / "candidate.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location("kernelrl_candidate", path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules["kernelrl_candidate"] = mod
        try:
            with _exclusive_build_dir():
                spec.loader.exec_module(mod)
        except SyntaxError as e:
            raise _LoadError(f"SyntaxError: {e}", traceback.format_exc(limit=2)) from e
        except BaseException as e:  # noqa: BLE001 - SystemExit at import is a failed load too
            raise _LoadError(f"{type(e).__name__}: {e}", traceback.format_exc(limit=8)) from e
        # A candidate that copied the task's size constants runs at the judged size, as the
        # reference does: same names, the values of the active size preset.
        for name, value in constants.items():
            if isinstance(getattr(mod, name, None), int):
                setattr(mod, name, value)
        cls = getattr(mod, "ModelNew", None)
        if cls is None:
            raise _LoadError("the program defines no `ModelNew`", "")
        return cls

    def get_state(self, msg: Message) -> tuple[str, dict[str, Any], Any]:
        if not isinstance(self.model, torch.nn.Module):
            return "state", {"keys": []}, None
        sd = {k: v.detach().to("cpu").clone() for k, v in self.model.state_dict().items()}
        return "state", {"keys": list(sd)}, sd

    def load_state(self, msg: Message) -> tuple[str, dict[str, Any], Any]:
        """Take the reference's parameters when the candidate's have the same names and shapes."""
        sd = msg.payload or {}
        if not isinstance(self.model, torch.nn.Module) or not sd:
            return "state_loaded", {"loaded": False, "why": "no parameters"}, None
        own = self.model.state_dict()
        same = set(own) == set(sd) and all(tuple(own[k].shape) == tuple(sd[k].shape) for k in own)
        if not same:
            return "state_loaded", {"loaded": False, "why": "different parameter names or shapes"}, None
        self.model.load_state_dict(sd)
        return "state_loaded", {"loaded": True}, None

    def run(self, msg: Message) -> tuple[str, dict[str, Any], Any]:
        """Correctness runs: each input set once (the first `repeat_first` times)."""
        sets = msg.payload
        repeat_first = int(msg.header.get("repeat_first", 1))
        outputs, inputs_after, types_ = [], [], []
        thread_rises, changed_after = [], []
        try:
            for i, inputs in enumerate(sets):
                for _ in range(repeat_first if i == 0 else 1):
                    args = _to_device(_clone(inputs), self.device)
                    before = _thread_count()
                    with _no_grad():
                        out = self.model(*args)
                    self._sync()
                    thread_rises.append(_thread_count() - before)
                    snapshot = _to_cpu(out)
                    # An honest output is final when the call returns; one still being written by
                    # work the call left running changes in the next moments.
                    time.sleep(0.005)
                    self._sync()
                    changed_after.append(not exactly_equal(snapshot, _to_cpu(out)))
                    outputs.append(snapshot)
                    types_.append([type(o).__module__ + "." + type(o).__qualname__ for o in flatten(out)])
                    inputs_after.append(_to_cpu(args))
        except Exception as e:  # noqa: BLE001
            return "error", {"phase": "run", "message": f"{type(e).__name__}: {e}",
                             "traceback": traceback.format_exc(limit=8)}, None
        return "ran", {"output_types": types_, "state_after": global_state(), "thread_rises": thread_rises,
                       "changed_after_return": changed_after}, {"outputs": outputs,
                                                                                  "inputs_after": inputs_after}

    def set_pool(self, msg: Message) -> tuple[str, dict[str, Any], Any]:
        self.pool = [_to_device(s, self.device) for s in msg.payload]
        return "pooled", {"n": len(self.pool)}, None

    def prepare(self, msg: Message) -> tuple[str, dict[str, Any], Any]:
        """Fresh inputs for the next timed call, then a cache eviction."""
        base = self.pool[int(msg.header["index"]) % len(self.pool)]
        scale = float(msg.header["scale"])
        fresh = []
        for x in base:
            if isinstance(x, _Tensor) and x.is_floating_point():
                fresh.append(x * scale)  # new storage, new values: nothing to reuse from before
            else:
                fresh.append(_clone(x))
        self.current = fresh
        self.last_out = None
        if self.evict_buf is not None:
            self.evict_buf.add_(1.0)
        self._sync()
        return "prepared", {}, None

    def call(self, msg: Message) -> tuple[str, dict[str, Any], Any]:
        args = self.current
        self._sync()
        t0 = _perf_ns()
        with _no_grad():
            out = self.model(*args)
        self._sync()
        t1 = _perf_ns()
        self.last_out = out
        plain = all(type(o) is _Tensor for o in flatten(out))
        return "called", {"t_ns": t1 - t0, "plain": plain}, None

    def output(self, msg: Message) -> tuple[str, dict[str, Any], Any]:
        return "output", {}, {"output": _to_cpu(self.last_out), "inputs": _to_cpu(self.current)}

    def warmup(self, msg: Message) -> tuple[str, dict[str, Any], Any]:
        n = int(msg.header.get("calls", 3))
        max_s = float(msg.header.get("max_s", 1.0))
        t_end = time.monotonic() + max_s
        done = 0
        for i in range(max(n, 1)):
            args = self.pool[i % len(self.pool)]
            with _no_grad():
                self.model(*args)
            self._sync()
            done += 1
            if done >= 1 and time.monotonic() > t_end:
                break
        return "warm", {"calls": done, "state_after": global_state()}, None

    def ping(self, msg: Message) -> tuple[str, dict[str, Any], Any]:
        return "pong", {}, None

    def _sync(self) -> None:
        if self.device == "cuda":
            _cuda_sync()  # cudaDeviceSynchronize: every stream of the device


class _exclusive_build_dir:
    """Hold an exclusive lock on this program's build folder while it loads.

    Torch's loader guards a build with a `lock` file that stays behind when a build is killed
    (a timeout), making every later build of the same source wait forever. The kernel drops
    our lock when its holder dies, so while we hold it any torch `lock` file is stale.
    """

    def __enter__(self) -> None:
        root = os.environ.get("TORCH_EXTENSIONS_DIR")
        self.f = None
        if not root:
            return
        os.makedirs(root, exist_ok=True)
        self.f = open(root.rstrip("/") + ".lock", "w")  # noqa: SIM115
        fcntl.flock(self.f, fcntl.LOCK_EX)
        for stale in Path(root).glob("*/lock"):
            try:
                stale.unlink()
            except OSError:
                pass

    def __exit__(self, *exc: object) -> None:
        if self.f is not None:
            fcntl.flock(self.f, fcntl.LOCK_UN)
            self.f.close()


class _LoadError(Exception):
    def __init__(self, message: str, tb: str):
        super().__init__(message)
        self.tb = tb


_HANDLERS = {
    "setup": WorkerState.setup,
    "get_state": WorkerState.get_state,
    "load_state": WorkerState.load_state,
    "run": WorkerState.run,
    "pool": WorkerState.set_pool,
    "prepare": WorkerState.prepare,
    "call": WorkerState.call,
    "output": WorkerState.output,
    "warmup": WorkerState.warmup,
    "ping": WorkerState.ping,
}


def main(argv: list[str]) -> int:
    channel = Channel(int(argv[1]), int(argv[2]))
    state = WorkerState(channel)
    channel.send("hello", {"pid": os.getpid(), "torch": torch.__version__, "python": sys.version.split()[0]})
    while True:
        msg = channel.recv()
        if msg.kind == "exit":
            return 0
        handler = _HANDLERS.get(msg.kind)
        if handler is None:
            channel.send("error", {"phase": "protocol", "message": f"unknown command {msg.kind!r}"})
            continue
        try:
            kind, header, payload = handler(state, msg)
        except Exception as e:  # noqa: BLE001 - report, keep serving; the judge decides
            kind, header, payload = "error", {"phase": msg.kind, "message": f"{type(e).__name__}: {e}",
                                              "traceback": traceback.format_exc(limit=8)}, None
        channel.send(kind, header, payload)


if __name__ == "__main__":
    # Exit without interpreter teardown: a candidate's atexit hooks or threads must not hang us.
    code = main(sys.argv)
    sys.stdout.flush()
    os._exit(code)
