"""Is the device idle? The judge's own check after every timed sample, whatever context left work.

A worker synchronises its device before it answers a timed call, but a synchronise waits only for
its own CUDA context: work a program left running in a second context (one it made through the
driver API in its own process, or a helper process's) is not waited for. Left running, it slows
whichever member is timed next, the reference included, and the program looks faster than it is.
So after each timed sample the judge asks a trusted process of its own (`CudaProbe`: kernelrl's
code only, never a program under test, in a context of its own on the lane's GPU) to time one
tiny kernel from launch to completion. On an idle device that takes what it took at calibration;
while any other context has work running, the probe's kernel waits for the GPU's time slice and
takes far longer.

The decision is pure and tested with fake probes (tests/judge/timing/test_idle.py):
- `calibrate`: the probe's median time over `CALIBRATION_PROBES` probes at the start of each
  measurement, refused when it is above `CALIBRATION_CEILING_MS` (the device was not idle then:
  a threshold learned on a busy device would call every later probe idle);
- `classify`: a probe slower than `threshold_ms` (`BUSY_FACTOR` times the calibrated median, and
  at least `BUSY_MARGIN_MS` above it) reads busy;
- `IdleMonitor.check`: a busy reading is confirmed by a second probe at once (one slow probe is
  the probe process's own hiccup), and a confirmed one is drained: the judge probes until the
  device reads idle (up to `DRAIN_LIMIT_S`) before the next member is timed, so what was left
  running does not land in another member's sample; a probe that raises reads ERROR;
- `device_state`: the group's `DeviceIdle`: UNCHECKED when the probe could not be calibrated or
  failed once; BUSY when work outlived the drain, or the device was busy after `BUSY_SAMPLES` or
  more samples of a trusted member (the reference, its A/A copy, the compiled reference): then
  the reference's own times may hold someone's work, and the group's speedups are not paid
  (`kernelrl.judge.timing.verdict.timed`: a `judge_error`, judged again on the next try); IDLE otherwise;
- a candidate after whose samples the device was busy `BUSY_SAMPLES` times or more, improbably
  often at the rate the trusted members read busy in the same rounds, or busy past the drain once,
  is found out by `kernelrl.checks.dynamic.timing_findings` (`side_work_after_return`).

Order of operations around one sample (`kernelrl.judge.timing.timer`, `kernelrl.judge.isolation.sandbox`): the
member's worker answers (it synchronised its own context first); from the timing pool on, the
sandbox ends every other process of the worker (`Worker.end_strays`) as soon as the answer
arrives; then this probe runs, and drains; then the next member is sent its sample. So a helper
process is dead before the probe, but the GPU work it queued can outlive it while the driver
tears its context down, and a second context inside the worker itself is not a process at all:
the probe sees both, `end_strays` neither.

Guarantees: work running in any context on the probed GPU when the probe runs is seen (the
probe's kernel cannot start before the time slice passes) and drained before the next member
starts; a probe that fails or cannot be calibrated pays nothing rather than vouching for the
device. A delayed launch that starts after the probe and lands in a later sample is read as
busy after that later sample: if it lands after a trusted member's, the group is not paid.

Does not guarantee: that work which starts after the probe and ends before the next probe is
seen (it can only slow the member timed meanwhile, by at most the time until that probe);
anything under MPS (contexts share the GPU there: a small kernel runs beside another context's
work instead of waiting); another GPU than the lane's (a worker is shown only its lane's device);
that the device is idle on a CPU, where there is no probe (`DeviceIdle.NOT_PROBED`; the idle-CPU
and stray-process checks cover CPU work there).
"""

from __future__ import annotations

import enum
import os
import select
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO, Protocol

from kernelrl.checks.dynamic import DEVICE_BUSY_SAMPLES as BUSY_SAMPLES
from kernelrl.result import DeviceIdle

CALIBRATION_PROBES = 21
# An idle H100 answers a probe (launch, synchronise, host clock) in tens of microseconds; a device
# with another context's work takes a time slice (~ms). Above this the device was not idle.
CALIBRATION_CEILING_MS = 0.5
BUSY_FACTOR = 4.0
BUSY_MARGIN_MS = 0.25
DRAIN_LIMIT_S = 2.0
DRAIN_POLL_S = 0.001


class Reading(enum.StrEnum):
    """What one probe (with its confirmation) said."""

    IDLE = "idle"
    BUSY = "busy"
    ERROR = "error"  # the probe raised: the device's state is unknown


class ProbeError(RuntimeError):
    """The probe could not time its kernel (it is gone, hung, or never started)."""


class Probe(Protocol):
    def __call__(self) -> float:
        """Milliseconds one tiny trusted kernel took from launch to completion; raises on failure."""
        ...


@dataclass(frozen=True, kw_only=True)
class ProbeCalibration:
    idle_ms: float  # the probe's median on the idle device
    threshold_ms: float  # slower than this reads busy


def calibrate(samples_ms: Sequence[float]) -> ProbeCalibration | None:
    """The probe's idle time and busy threshold, or None when the samples do not show an idle device."""
    good = [s for s in samples_ms if s >= 0]
    if not good or len(good) < len(samples_ms):
        return None
    idle = statistics.median(good)
    if idle > CALIBRATION_CEILING_MS:
        return None
    return ProbeCalibration(idle_ms=idle, threshold_ms=max(BUSY_FACTOR * idle, idle + BUSY_MARGIN_MS))


def classify(latency_ms: float, calibration: ProbeCalibration) -> Reading:
    return Reading.BUSY if latency_ms > calibration.threshold_ms else Reading.IDLE


@dataclass(kw_only=True)
class IdleTally:
    """What the probes said after one member's samples."""

    probes: int = 0
    busy: int = 0  # confirmed busy readings
    errors: int = 0
    undrained: int = 0  # busy readings still busy after the drain: the next member was disturbed

    def add(self, reading: Reading, *, drained: bool = True) -> None:
        self.probes += 1
        self.busy += reading is Reading.BUSY
        self.errors += reading is Reading.ERROR
        self.undrained += reading is Reading.BUSY and not drained

    @property
    def found(self) -> bool:
        """The device was busy after this member's samples often enough to count against it."""
        return self.busy >= BUSY_SAMPLES or self.undrained > 0


def device_state(*, calibrated: bool, trusted: Sequence[IdleTally], everyone: Sequence[IdleTally]) -> DeviceIdle:
    """The group's `DeviceIdle` from every member's tally (see the module docstring)."""
    if not calibrated or any(t.errors for t in everyone):
        return DeviceIdle.UNCHECKED
    if any(t.undrained for t in everyone) or any(t.found for t in trusted):
        return DeviceIdle.BUSY
    return DeviceIdle.IDLE


class IdleMonitor:
    """Calibrates a probe at the start of each measurement and reads it after each sample; one
    measurement at a time (the device's lock)."""

    def __init__(self, probe: Probe, *, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic, drain_limit_s: float = DRAIN_LIMIT_S) -> None:
        self.probe = probe
        self.calibration: ProbeCalibration | None = None
        self.note = ""  # why the device could not be checked ("" when it could)
        self._sleep, self._clock, self._drain_limit_s = sleep, clock, drain_limit_s

    def start(self) -> bool:
        """Calibrate on what should be an idle device; once more after a drain if it was not idle."""
        self.calibration, self.note = None, ""
        for attempt in range(2):
            try:
                samples = [self.probe() for _ in range(CALIBRATION_PROBES)]
            except Exception as e:  # noqa: BLE001 - whatever the probe's trouble, the device is unchecked
                self.note = f"the idle probe failed: {type(e).__name__}: {e}"
                return False
            self.calibration = calibrate(samples)
            if self.calibration is not None:
                return True
            if attempt == 0:
                self._sleep(self._drain_limit_s)
        self.note = (f"the device was not idle before the measurement (the idle probe's median "
                     f"{statistics.median(samples):.3f} ms, above {CALIBRATION_CEILING_MS} ms)")
        return False

    def _read(self) -> Reading:
        assert self.calibration is not None
        try:
            return classify(self.probe(), self.calibration)
        except Exception as e:  # noqa: BLE001 - a probe that fails vouches for nothing
            self.note = self.note or f"the idle probe failed: {type(e).__name__}: {e}"
            return Reading.ERROR

    def check(self, tally: IdleTally) -> Reading:
        """Probe after one member's sample, confirm a busy reading, drain it; count it in `tally`."""
        if self.calibration is None:
            tally.add(Reading.ERROR)
            return Reading.ERROR
        reading = self._read()
        if reading is Reading.BUSY:
            reading = self._read()  # one slow probe alone is the probe's own hiccup
        drained = True
        if reading is Reading.BUSY:
            drained = False
            stop = self._clock() + self._drain_limit_s
            while self._clock() < stop:
                self._sleep(DRAIN_POLL_S)
                again = self._read()
                if again is Reading.ERROR:
                    reading = again
                    break
                if again is Reading.IDLE:
                    drained = True
                    break
        tally.add(reading, drained=drained)
        return reading

    def close(self) -> None:
        close = getattr(self.probe, "close", None)
        if callable(close):
            close()


# -- the CUDA probe: a trusted process on the lane's GPU ------------------------------------------

START_TIMEOUT_S = 180.0  # importing torch and making a context on a cold machine
PROBE_TIMEOUT_S = 5.0  # one probe: far above any time slice; a hung GPU is an error, not a wait


class CudaProbe:
    """A process of kernelrl's own (`python -m kernelrl.judge.timing.idle`) holding a context on one GPU;
    each call times one one-element kernel there, launch to completion, by its host clock.

    `visible`: the lane's entry of the judge's CUDA_VISIBLE_DEVICES (`kernelrl.judge.harness.device.visible_device`).
    Started on first use; once broken (gone, hung), every later call raises `ProbeError`.
    """

    def __init__(self, visible: str) -> None:
        self.visible = visible
        self._proc: subprocess.Popen[bytes] | None = None
        self._broken = ""
        self._guard = threading.Lock()

    def __call__(self) -> float:
        with self._guard:
            proc = self._started()
            try:
                assert proc.stdin is not None
                proc.stdin.write(b"p\n")
                proc.stdin.flush()
                return int(self._line(proc, PROBE_TIMEOUT_S)) / 1e6
            except (OSError, ValueError, ProbeError) as e:
                self._fail(f"the probe stopped answering ({e})")
                raise ProbeError(self._broken) from e

    def _started(self) -> subprocess.Popen[bytes]:
        if self._broken:
            raise ProbeError(self._broken)
        if self._proc is not None:
            return self._proc
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": self.visible}
        try:
            self._proc = subprocess.Popen([sys.executable, "-m", "kernelrl.judge.timing.idle"], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
            if self._line(self._proc, START_TIMEOUT_S) != "ready":
                raise ProbeError("the probe did not say it was ready")
        except (OSError, ProbeError) as e:
            self._fail(f"the probe did not start on CUDA device {self.visible}: {e}")
            raise ProbeError(self._broken) from e
        return self._proc

    @staticmethod
    def _line(proc: subprocess.Popen[bytes], timeout_s: float) -> str:
        out = proc.stdout
        assert out is not None
        ready, _, _ = select.select([out], [], [], timeout_s)
        if not ready:
            raise ProbeError(f"no answer in {timeout_s:g} s")
        line = out.readline()
        if not line:
            raise ProbeError(f"the probe process ended (exit status {proc.poll()})")
        return line.decode(errors="replace").strip()

    def _fail(self, why: str) -> None:
        self._broken = why
        self._stop()

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.kill()
            proc.wait()
            for f in (proc.stdin, proc.stdout):
                if f is not None:
                    f.close()

    def close(self) -> None:
        with self._guard:
            self._stop()


def _serve(stdin: IO[bytes], stdout: IO[bytes]) -> None:
    """The probe process: one context on the one GPU it is shown; a timed tiny kernel per line read."""
    import torch

    x = torch.zeros(1, device="cuda")
    for _ in range(50):  # the kernel loaded, the clocks up
        x.add_(1)
        torch.cuda.synchronize()
    stdout.write(b"ready\n")
    stdout.flush()
    for _ in iter(stdin.readline, b""):
        t0 = time.perf_counter_ns()
        x.add_(1)
        torch.cuda.synchronize()
        stdout.write(b"%d\n" % (time.perf_counter_ns() - t0))
        stdout.flush()


if __name__ == "__main__":
    _serve(sys.stdin.buffer, sys.stdout.buffer)
