"""Input plans: which input sets the judge asks for, drawn from its secret random generator.

The judge never runs task code: it draws a secret seed per input set (and, for perturbed sets, a
scale and an offset) and a reference worker makes the set with the task's own `get_inputs()`
under that seed (`kernelrl.judge.harness.worker`), applying the perturbation there.

Guarantees:
- seeds come from the judge's generator, itself seeded from `secrets`, and are drawn after the
  candidate is loaded, so no program can know its inputs in advance; no seed is ever sent to a
  candidate's worker;
- perturbed sets scale and shift each floating-point input (scale in [0.5, 2], offset of up to
  one mean-absolute-value), so an output that happens to be near-constant for standard-normal
  inputs (a mean of a wide tensor, say) stops being constant; integer and boolean inputs are
  never perturbed (they are indices, lengths or masks).

Does not guarantee the perturbed inputs stay inside a task's valid domain (a log of a shifted
input can be NaN): the evaluator replaces a perturbed set that makes the reference non-finite
by a plain one.

`memory_need` sizes an evaluation from the task's profile (made on the meta device, before any
input exists), and `too_large` says in one line why a task cannot be judged on this machine,
before anything is built: input sets travel one per message and one run per message, so a worker
holds one set's inputs and output, and the arena a copy of what travels, beside the timing pool
(a spot check sends the output, and the inputs as a digest), while the judge keeps every set's
inputs and reference outputs: in its heap, or for sets of
`EvalConfig.spill_set_mib` or more in files (`kernelrl.judge.spill`), which need that much disk
instead and leave one set in the heap at a time. The figures are the tensors' own bytes;
allocator slack, torch itself and a candidate's own buffers come on top (not guaranteed).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from kernelrl.judge.harness.protocol import POOL_NOISE_ELEMENTS


@dataclass(frozen=True, kw_only=True)
class InputPlan:
    seed: int
    perturbed: bool
    scale: float = 1.0
    offset_frac: float = 0.0

    @property
    def perturb(self) -> list[float] | None:
        """The worker's perturbation field: [scale, offset_frac], or None for a plain set."""
        return [self.scale, self.offset_frac] if self.perturbed else None

    @property
    def label(self) -> str:
        if not self.perturbed:
            return "plain"
        return f"scaled x{self.scale:.2f} and shifted {self.offset_frac:+.2f} mean-abs"


def plain_plan(rng: random.Random) -> InputPlan:
    return InputPlan(seed=rng.getrandbits(63), perturbed=False)


def perturbed_plan(rng: random.Random, *, scale_range: tuple[float, float] = (0.5, 2.0),
                   offset_range: float = 1.0) -> InputPlan:
    scale = math.exp(rng.uniform(math.log(scale_range[0]), math.log(scale_range[1])))
    return InputPlan(seed=rng.getrandbits(63), perturbed=True, scale=scale,
                     offset_frac=rng.uniform(-offset_range, offset_range))


def correctness_plans(n: int, rng: random.Random) -> list[InputPlan]:
    """The first set plain, the others perturbed."""
    return [plain_plan(rng)] + [perturbed_plan(rng) for _ in range(n - 1)]


def timing_scale(rng: random.Random) -> float:
    """Per-call factor applied to floating inputs of a timed call (keeps signs and zeros)."""
    return math.exp(rng.uniform(math.log(0.75), math.log(1.25)))


# One input set this large outgrows every cache a timed call could reuse (a CPU's last level, a
# GPU's L2: tens of MiB), so rotating several sets buys the measurement nothing, while each set
# costs its bytes in the judge and twice in every worker. From this size on the timing pool holds
# one set; every call still gets its own scale and jitter of it (`kernelrl.judge.timing.timer`), so no
# call sees the inputs of the call before.
POOL_SET_BYTES = 256 << 20


def timing_pool_size(configured: int, input_bytes: int) -> int:
    """The timing pool's sets for a task whose input set takes `input_bytes`: the configured
    number, or one set from `POOL_SET_BYTES` on."""
    return 1 if input_bytes >= POOL_SET_BYTES else configured


@dataclass(frozen=True, kw_only=True)
class MemoryNeed:
    """Bytes an evaluation's tensors need: in the busiest worker, in the judge's heap, and on disk
    for the judge's sets kept in files."""

    worker: int
    judge: int
    disk: int = 0


def memory_need(*, input_bytes: int, output_bytes: int, param_bytes: int, n_sets: int, pool_size: int,
                n_inputs: int = 1, in_files: bool = False) -> MemoryNeed:
    """A worker: its parameters, the timing pool and its noise (`n_inputs` tensors of noise a set,
    each at most `protocol.POOL_NOISE_ELEMENTS` values of the widest dtype), and the larger of a
    set arriving (its copy in the arena and the worker's) and a call (the inputs, the output and
    the output's copy in the arena). The judge: every set's inputs and outputs, the pool it sends,
    and a spot check's outputs from a member and from the reference; with its sets `in_files`,
    those go to disk and its heap holds the set arriving."""
    noise = min(input_bytes, n_inputs * POOL_NOISE_ELEMENTS * 8)
    worker = (param_bytes + pool_size * (input_bytes + noise)
              + max(2 * input_bytes, input_bytes + 2 * output_bytes))
    one_set, spot = input_bytes + output_bytes, 2 * output_bytes
    sets = n_sets * one_set + pool_size * input_bytes
    if in_files:
        return MemoryNeed(worker=worker, judge=one_set + spot, disk=sets)
    return MemoryNeed(worker=worker, judge=sets + spot)


def too_large(need: MemoryNeed, *, available: int | None, worker_cap: int | None,
              disk_free: int | None = None) -> str | None:
    """Why the task cannot be judged here (None when it can): a worker past its address-space cap,
    the judge and two workers (the reference and one candidate) past the memory available, or the
    judge's sets in files past the disk free where they go."""
    gib = 1 << 30
    if worker_cap is not None and need.worker > worker_cap:
        return (f"too large: a worker needs {need.worker / gib:.1f} GiB for its tensors, above its "
                f"{worker_cap / gib:.1f} GiB cap (sandbox.memory_limit_gib)")
    total = need.judge + 2 * need.worker
    if available is not None and total > available:
        return (f"too large: the judge and two workers need {total / gib:.1f} GiB for their tensors, "
                f"{available / gib:.1f} GiB is available")
    if need.disk and disk_free is not None and need.disk > disk_free:
        return (f"too large: the judge's input sets need {need.disk / gib:.1f} GiB of disk under cache_dir "
                f"(spill_set_mib), {disk_free / gib:.1f} GiB is free")
    return None


def available_memory() -> int | None:
    """MemAvailable from /proc/meminfo, in bytes (None where it cannot be read)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
