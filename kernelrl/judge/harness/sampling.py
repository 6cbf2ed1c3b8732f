"""How a worker is timed (`Sampling`): its timing pool, the fresh inputs of each sample, the timed
calls and the outputs kept for the judge's spot check.

Guarantees: a timed call is bracketed by a device-wide synchronisation (`bench.sync_every_gpu`)
and read on the worker's clock (bound first of all in `worker.py`, passed in with each command);
each call gets freshly made inputs (new storage, the pool's values times a scale the judge picks
per call, with jitter, made a chunk at a time: `values.stage`), so no input is a multiple of an
earlier one; every sample starts from an evicted cache, outside the timed region; each answer
commits to every output as it returned (`channel.commitments`), and the output handed over for a
spot check is the one the call returned (a copy, where more calls followed in the sample). The
allocator is pinned when the pool arrives, in every timed worker at the same point.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from kernelrl.judge.harness import protocol as P
from kernelrl.judge.harness.bench import Bench, call_floor_ns
from kernelrl.judge.harness.channel import commitments
from kernelrl.judge.harness.compare import content_digest, flatten
from kernelrl.judge.harness.fingerprint import keyed_digest
from kernelrl.judge.harness.precision import global_state
from kernelrl.judge.harness.values import clone as _clone
from kernelrl.judge.harness.values import in_place as _in_place
from kernelrl.judge.harness.values import kept as _kept
from kernelrl.judge.harness.values import pool_noise, stage
from kernelrl.judge.harness.values import readable as _readable
from kernelrl.judge.harness.values import shadows_tensor as _shadows_tensor
from kernelrl.judge.harness.values import to_device as _to_device

Reply = tuple[P.Kind, P.Header, Any]
# Bound now, before any program code runs (the worker imports this module at its start).
_Tensor = torch.Tensor
_no_grad = torch.no_grad


class Sampling:
    """The timing pool, its noise and jitter, the staged inputs of the next sample and the inputs and
    outputs of the last one, and whether the allocator was pinned."""

    def __init__(self, pin_allocator: Callable[[], bool] | None) -> None:
        self._pin_allocator = pin_allocator
        self.pool: list[list[object]] = []
        self.noise: list[list[torch.Tensor | None]] = []  # per pool set and input: noise in [-1, 1) (floating inputs)
        self.jitter = 0.0
        self.staged: list[list[object]] = []  # inputs of the calls of the next sample
        self.sample_inputs: list[list[object]] = []  # inputs and outputs of every call of the last sample
        self.sample_outputs: list[object] = []
        self.allocator_pinned = False  # `startup.PINNED_MALLOPT` set (from the timing pool on)

    def set_pool(self, h: P.Pool, payload: Any, device: str) -> Reply:
        if self._pin_allocator is not None and not self.allocator_pinned:
            self.allocator_pinned = self._pin_allocator()  # timing begins here in every timed worker alike
        self.pool = [[_to_device(v, device) for v in s] for s in payload]
        self.jitter = float(h.jitter)
        # made once: a call's noise is a roll of it, so no two calls' inputs are multiples of each other
        self.noise = pool_noise(self.pool, seed=int(h.noise_seed), most=P.POOL_NOISE_ELEMENTS)
        return P.Kind.POOLED, P.Pooled(n=len(self.pool), allocator_pinned=self.allocator_pinned), None

    def warmup(self, h: P.Warmup, model: Any, bench: Bench, clock: Callable[[], int]) -> Reply:
        t_end = time.monotonic() + h.max_s
        times = []
        for i in range(max(h.calls, 1)):
            args = self.pool[i % len(self.pool)]
            bench.sync()
            t0 = clock()
            with _no_grad():
                model(*args)
            bench.sync()
            times.append((clock() - t0) / 1e6)
            if time.monotonic() > t_end:
                break
        # The first call may compile or allocate: the median of the others is the call's cost.
        call_ms = statistics.median(times[1:] if len(times) > 1 else times)
        return P.Kind.WARM, P.Warm(calls=len(times), call_ms=call_ms, state_after=global_state(),
                                   floor_ns=call_floor_ns(bench.sync, clock)), None

    def prepare(self, h: P.Prepare, bench: Bench) -> Reply:
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
        bench.evict()
        return P.Kind.PREPARED, P.Empty(), None

    def call(self, model: Any, bench: Bench, clock: Callable[[], int]) -> Reply:
        times = []
        plain = True
        outs = []
        # One eviction (in prepare) per sample: a sample of several calls is only used for calls
        # much shorter than the timer's noise, and an eviction between them would cost far more
        # than the calls. Each call still gets inputs of its own.
        for args in self.staged:
            bench.sync()
            t0 = clock()
            with _no_grad():
                out = model(*args)
            bench.sync()
            times.append(clock() - t0)
            plain = plain and all(type(o) is _Tensor and not _shadows_tensor(o) for o in flatten(out))
            # Every output is kept until the next sample (the judge picks the one it checks after it) as it was
            # returned: with more calls to come, a copy (untimed, every member alike): CUDA graphs' buffer is reused.
            outs.append(_kept(out) if len(self.staged) > 1 else out)
        self.sample_inputs = self.staged
        self.sample_outputs = outs
        self.staged = []
        return P.Kind.CALLED, P.Called(t_ns=times, plain=plain, commits=commitments(outs)), None

    def output(self, h: P.Output, device: str) -> Reply:
        if not 0 <= h.call < len(self.sample_outputs):
            raise ValueError(f"no call {h.call} in the last sample ({len(self.sample_outputs)} calls)")
        # The output read in place where it is a plain CPU tensor (the channel copies it into the
        # arena); the inputs as a digest the judge compares with the reference's, not a second set:
        # on a device, read there under the key the judge drew after the sample.
        values = _in_place(self.sample_inputs[h.call])
        digest = content_digest(values) if device == "cpu" else keyed_digest(values, h.key)
        return P.Kind.OUTPUT_DATA, P.OutputData(inputs_digest=digest), {"output": _readable(self.sample_outputs[h.call])}
