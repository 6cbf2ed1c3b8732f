"""The roofline: this machine's measured peaks, and the least time any program needs for a task.

Peaks are measured once per machine (device model, thread count, torch version) in a fresh
worker and cached as JSON in the evaluator's cache folder: on a CPU the triad bandwidth
(a = b + s * c over arrays far larger than the last-level cache) and the FLOP rate of large
fp32 and bf16 matmuls; on a GPU the same, measured, with the datasheet figures of
`kernelrl.judge.harness.device` as the fallback when measuring fails.

A task's floors come from its profile (`kernelrl.judge.harness.profile.TaskProfile`): the memory floor is
its minimum bytes moved at the measured bandwidth, the compute floor its counted FLOPs at the
measured rate for its dtype; the roofline time is the larger of the two, and a result's
percentage of the roofline is floor / measured time.

Guarantees: peaks are measurements of plain library calls on this machine (achievable rates, not
datasheet optimism), recorded with how they were obtained; a floor is never invented: when a
figure is unknown its floor is None.

Does not model caches: a task whose working set fits in cache can beat the memory floor
computed from DRAM bandwidth, which is why the impossible-speedup rule keeps a slack
(`kernelrl.checks.dynamic.FLOOR_SLACK`).
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import platform
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelrl.checks.dynamic import Floors
from kernelrl.judge.harness import protocol as P
from kernelrl.judge.harness.device import Device, DevicePeaks, device_peaks, gpu_peaks
from kernelrl.judge.harness.profile import TaskProfile
from kernelrl.judge.isolation.sandbox import SandboxConfig, Worker
from kernelrl.judge.timing.devicelock import DeviceLock

_MEASURE_LIMIT_S = 300.0


@dataclass(frozen=True, kw_only=True)
class MachinePeaks:
    device: str  # "cpu" or "cuda"
    name: str  # CPU model or GPU name
    threads: int
    bandwidth_gbs: float
    fp32_tflops: float
    bf16_tflops: float | None
    source: str  # "measured" or "datasheet (...)"
    measured_at: float  # seconds since the epoch

    def rate_tflops(self, dtype: str) -> float | None:
        """The peak FLOP rate for work in `dtype` (half types use the bf16 rate when known)."""
        if dtype in ("float16", "bfloat16") and self.bf16_tflops:
            return max(self.bf16_tflops, self.fp32_tflops)
        return self.fp32_tflops or None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _device_name(device: Device) -> str:
    if device == Device.CUDA:
        import torch

        return torch.cuda.get_device_name() if torch.cuda.is_available() else "cuda"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def machine_key(device: Device, threads: int, device_index: int | None = None) -> str:
    import torch

    text = "|".join([device, _device_name(device), str(threads), str(device_index), torch.__version__,
                     platform.machine(), str(os.cpu_count())])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _peaks_path(cache_dir: Path, device: Device, threads: int, device_index: int | None) -> Path:
    folder = Path(cache_dir) / "peaks"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{machine_key(device, threads, device_index)}.json"


def machine_peaks(*, device: Device, sandbox: SandboxConfig, cache_dir: Path, device_index: int | None = None,
                  remeasure: bool = False) -> MachinePeaks:
    """This machine's peaks, from the cache or measured now in a fresh worker (under a lock).

    A new measurement never lowers a recorded figure: a measurement disturbed by other work
    reads low, never high, so the higher of the two is the closer to the machine's.
    """
    threads = sandbox.effective_threads
    path = _peaks_path(cache_dir, device, threads, device_index)
    with open(path.parent / "measure.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one measurement at a time, and never a half-written file
        known = _read(path)
        if known is not None and not remeasure:
            return known
        peaks = _measure(device, threads, sandbox, device_index)
        if known is not None:
            peaks = highest(known, peaks)
        _write(path, peaks)
        return peaks


def save_peaks(peaks: MachinePeaks, *, cache_dir: Path, device_index: int | None = None) -> None:
    path = _peaks_path(cache_dir, Device(peaks.device), peaks.threads, device_index)
    with open(path.parent / "measure.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        known = _read(path)
        _write(path, highest(known, peaks) if known is not None else peaks)


def _read(path: Path) -> MachinePeaks | None:
    try:
        return MachinePeaks(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None  # none yet, or an older or damaged record: measure again


def _write(path: Path, peaks: MachinePeaks) -> None:
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(peaks.to_dict(), indent=1))
    tmp.replace(path)


def highest(a: MachinePeaks, b: MachinePeaks) -> MachinePeaks:
    """Each figure at the higher of two records (a disturbed measurement only reads low)."""
    bf16 = max(x for x in (a.bf16_tflops, b.bf16_tflops, 0.0) if x is not None) or None
    raised = (b.bandwidth_gbs > a.bandwidth_gbs or b.fp32_tflops > a.fp32_tflops
              or (b.bf16_tflops or 0) > (a.bf16_tflops or 0))
    return dataclasses.replace(a, bandwidth_gbs=max(a.bandwidth_gbs, b.bandwidth_gbs),
                               fp32_tflops=max(a.fp32_tflops, b.fp32_tflops), bf16_tflops=bf16,
                               source=b.source if raised and b.source != a.source and "raised" in b.source
                               else a.source, measured_at=max(a.measured_at, b.measured_at))


def demonstrated(peaks: MachinePeaks, profile: TaskProfile, time_ms: float) -> MachinePeaks | None:
    """Peaks raised to what a trusted program (a task's reference) was just measured to reach.

    A reference's own time is proof of what the machine can do: a floor it beats is no floor.
    None when the reference stayed within the recorded peaks.
    """
    if time_ms <= 0:
        return None
    bandwidth = profile.min_bytes / (time_ms * 1e-3) / 1e9 if profile.min_bytes else 0.0
    rate = profile.flops / (time_ms * 1e-3) / 1e12 if profile.flops else 0.0
    half = profile.dtype in ("float16", "bfloat16")
    fp32 = rate if not half else 0.0
    bf16 = rate if half else 0.0
    if bandwidth <= peaks.bandwidth_gbs and fp32 <= peaks.fp32_tflops and bf16 <= (peaks.bf16_tflops or 0.0):
        return None
    return dataclasses.replace(peaks, bandwidth_gbs=max(peaks.bandwidth_gbs, bandwidth),
                               fp32_tflops=max(peaks.fp32_tflops, fp32),
                               bf16_tflops=max(peaks.bf16_tflops or 0.0, bf16) or None,
                               source=f"{peaks.source.split(';')[0]}; raised to rates a task's reference reached",
                               measured_at=time.time())


def _measure(device: Device, threads: int, sandbox: SandboxConfig, device_index: int | None) -> MachinePeaks:
    name = _device_name(device)
    worker = Worker(config=sandbox, device=device, device_index=device_index, role="peaks")
    try:
        answer = worker.request(P.MeasurePeaks(device=device, threads=threads),
                                deadline=time.monotonic() + _MEASURE_LIMIT_S)
        if not answer.failed:
            h = answer.header
            return MachinePeaks(device=str(device), name=name, threads=threads, bandwidth_gbs=h.bandwidth_gbs,
                                fp32_tflops=h.fp32_tflops, bf16_tflops=h.bf16_tflops, source="measured",
                                measured_at=time.time())
        error = answer.header.message
    except Exception as e:  # noqa: BLE001 - fall back to the datasheet below
        error = f"{type(e).__name__}: {e}"
    finally:
        worker.close()
    if device == Device.CUDA:
        sheet = gpu_peaks(name)
        if sheet.mem_bandwidth_gbs and sheet.fp32_tflops:
            return MachinePeaks(device=str(device), name=name, threads=threads, bandwidth_gbs=sheet.mem_bandwidth_gbs,
                                fp32_tflops=sheet.fp32_tflops, bf16_tflops=sheet.bf16_tflops,
                                source=f"{sheet.source}; measuring failed: {error}", measured_at=time.time())
    raise RuntimeError(f"could not measure this machine's peaks: {error}")


def prompt_peaks(peaks: MachinePeaks, device: Device) -> DevicePeaks:
    """The device's description for a prompt: what is known of it, with the measured peaks."""
    known = device_peaks(device)
    return dataclasses.replace(known, fp32_tflops=round(peaks.fp32_tflops, 3),
                               bf16_tflops=round(peaks.bf16_tflops, 3) if peaks.bf16_tflops else known.bf16_tflops,
                               mem_bandwidth_gbs=round(peaks.bandwidth_gbs, 1),
                               source=f"{peaks.source} on this machine ({peaks.threads} threads: triad bandwidth, "
                                      "large matmuls)" if peaks.source == "measured" else peaks.source)


def floors(profile: TaskProfile, peaks: MachinePeaks) -> Floors:
    memory_ms = profile.min_bytes / (peaks.bandwidth_gbs * 1e9) * 1e3 if profile.min_bytes and peaks.bandwidth_gbs else None
    rate = peaks.rate_tflops(profile.dtype)
    compute_ms = profile.flops / (rate * 1e12) * 1e3 if profile.flops and rate else None
    return Floors(memory_ms=memory_ms, compute_ms=compute_ms, bandwidth_gbs=peaks.bandwidth_gbs, tflops=rate)


def roofline_pct(time_ms: float, f: Floors) -> float | None:
    """The share of the roofline a measured time reaches (100 %: as fast as the floor allows)."""
    floor = f.floor_ms
    if floor is None or time_ms <= 0:
        return None
    return 100.0 * floor / time_ms


class PeakStore:
    """An evaluator's view of this machine's peaks: measured once (holding the device's lock, so
    no evaluation competes with the measurement), raised by what references demonstrate, and
    measured again at most once, the first time a candidate seems to beat a floor.

    Thread-safe. `error` says why there are no peaks ("" when there are).
    """

    def __init__(self, *, enabled: bool, device: Device, sandbox: SandboxConfig, cache_dir: Path,
                 device_index: int | None, lock: DeviceLock) -> None:
        self._enabled = enabled
        self._device = device
        self._sandbox = sandbox
        self._cache_dir = Path(cache_dir)
        self._device_index = device_index
        self._lock = lock
        self._peaks: MachinePeaks | None = None
        self._guard = threading.RLock()
        self._remeasured = False
        self.error = ""

    def get(self, *, remeasure: bool = False) -> MachinePeaks | None:
        """The peaks (measured at the first call); None when disabled or they cannot be measured."""
        with self._guard:
            if self._enabled and (remeasure or (self._peaks is None and not self.error)):
                try:
                    with self._lock.timing():
                        self._peaks = machine_peaks(device=self._device, sandbox=self._sandbox,
                                                    cache_dir=self._cache_dir, device_index=self._device_index,
                                                    remeasure=remeasure)
                except Exception as e:  # noqa: BLE001 - no roofline, said so in results
                    self.error = f"{type(e).__name__}: {e}"
            return self._peaks

    def floors_for(self, profile: TaskProfile, reference_ms: float) -> tuple[MachinePeaks, Floors] | None:
        """A task's floors, from peaks no lower than what its reference was just seen to reach."""
        peaks = self.get()
        if peaks is None:
            return None
        raised = demonstrated(peaks, profile, reference_ms)
        if raised is not None:
            with self._guard:
                self._peaks = peaks = raised
            save_peaks(raised, cache_dir=self._cache_dir, device_index=self._device_index)
        return peaks, floors(profile, peaks)

    def remeasure_once(self) -> bool:
        """Measure the peaks again, once per store: before a candidate is refused for beating a
        floor, the floor must not be an artefact of a disturbed measurement. False when done already."""
        with self._guard:
            if self._remeasured:
                return False
            self._remeasured = True
        return self.get(remeasure=True) is not None
