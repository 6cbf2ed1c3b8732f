"""The evaluator's settings: one typed config, and the fingerprint that says which results compare.

`EvalConfig` is owned by the evaluator (`kernelrl.judge.evaluator`) and nests the sandbox's,
the timer's and the LLM judge's configs; it is validated when built. `config_fingerprint` is
every setting that changes a verdict or a speedup (everything but where caches live and how
many candidates are checked at once): results judged under one fingerprint are never reused
under another (the evaluator's result cache, the search database's reuse key).

The timer's `TimingConfig` is declared here, beside the rest, and this module imports no torch:
a command reads, checks and prints its settings (`kernelrl optimize --help`) without the runtime.

Does not read files or flags: `kernelrl.config` and the CLI build it.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from kernelrl.checks import dynamic
from kernelrl.checks.llm_judge import LLMJudgeConfig
from kernelrl.checks.policy import PolicyName
from kernelrl.judge.harness.device import Device
from kernelrl.judge.isolation.sandbox import SandboxConfig
from kernelrl.plain import to_plain
from kernelrl.tasks.task import Size

__all__ = ["EvalConfig", "TimingConfig", "config_fingerprint", "default_cache_dir"]


def default_cache_dir() -> Path:
    return Path(os.environ.get("KERNELRL_CACHE") or Path.home() / ".cache" / "kernelrl")


@dataclass(frozen=True, kw_only=True)
class TimingConfig:
    warmup_calls: int = 5
    warmup_max_s: float = 3.0
    min_rounds: int = 15
    max_rounds: int = 400
    target_rel_ci: float = 0.01
    # Timing may also stop once every interval is within this share of the offset identical code (the
    # A/A copy) shows in the same measurement, when the copy's own interval excludes 1: each member
    # runs in a process of its own, and a process keeps its offset for its whole life, so more rounds
    # cannot remove it (timer.precision_goal; benchmarks/README.md, timing noise). 0: never.
    aa_precision_share: float = 0.5
    max_timing_s: float = 20.0  # per candidate; a group's cap grows with its size
    spot_check_prob: float = 0.1
    # A program skipping half its calls passes n spot checks with probability 2^-n: at 3, one
    # evaluation in 8 paid it ~2x (tests/fixtures/redteam/skip_calls_after_warmup.py, seen at 1.5 s
    # of timing); at 10, one in a thousand.
    min_spot_checks: int = 10
    pool_size: int = 3
    jitter: float = 0.1  # every timed call's floating inputs: pool values x scale x (1 +- up to this)
    min_sample_ms: float = 2.0  # shorter calls are timed several per sample
    max_calls_per_sample: int = 32
    sample_input_bytes: int = 256 << 20  # fresh inputs of one sample stay under this
    call_limit_s: float = 60.0  # one sample may not take longer than this (a hang)

    def __post_init__(self) -> None:
        if self.min_rounds < 3 or self.max_rounds < self.min_rounds:
            raise ValueError("need 3 <= min_rounds <= max_rounds")
        if not 0 < self.target_rel_ci < 1:
            raise ValueError("target_rel_ci must be in (0, 1)")
        if not 0 <= self.aa_precision_share <= 1:
            raise ValueError("aa_precision_share must be in [0, 1]")
        if self.max_timing_s <= 0 or self.warmup_max_s < 0 or self.call_limit_s <= 0:
            raise ValueError("time caps must be positive")
        if not 0 <= self.spot_check_prob <= 1 or self.min_spot_checks < 1:
            raise ValueError("spot_check_prob in [0, 1] and min_spot_checks >= 1")
        if self.pool_size < 1:
            raise ValueError("pool_size must be >= 1")
        if not 0 <= self.jitter < 0.5:
            raise ValueError("jitter must be in [0, 0.5)")
        if self.min_sample_ms < 0 or self.max_calls_per_sample < 1 or self.sample_input_bytes < 1:
            raise ValueError("min_sample_ms >= 0, max_calls_per_sample >= 1, sample_input_bytes >= 1")


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    device: Device = Device.CPU
    # Which GPU of the machine (cuda only): workers see only that one, as their cuda:0. None: the
    # first visible one. One evaluator per GPU gives one timing lane per GPU.
    device_index: int | None = None
    size: Size = Size.SMALL
    timeout_s: float = 300.0  # wall clock for loading and checking one candidate (and for loading a task)
    # Added to timeout_s for a candidate that compiles (C++ or CUDA not in the build cache, Triton,
    # the compiled reference): a hang then costs timeout_s, a cold build is not cut short.
    build_timeout_s: float = 300.0
    policy: PolicyName = PolicyName.OPEN
    n_correctness: int = 5
    tol_scale: float = 1.0  # multiplies the dtype tolerances (kernelrl.judge.harness.compare)
    # fp32 matmuls and convolutions may use TF32 on CUDA, in the reference and every candidate alike
    # (judge.precision). Default: exact fp32 everywhere, whatever torch's own defaults are.
    allow_tf32: bool = False
    static_checks: bool = True
    concurrency: int = 2  # candidates built and checked at once (timing never overlaps on a device)
    compile_baseline: bool = False  # also time each task's reference under torch.compile (once per task)
    # Reference workers an evaluator keeps between groups, one per task, for the task's next group
    # (judge.reference.ReferenceKeeper; ~350 MB each on a CPU): 0 starts a worker for every group.
    kept_references: int = 8
    roofline: bool = True  # measure this machine's peaks (once, cached) and give every result its roofline %
    floor_slack: float = dynamic.FLOOR_SLACK  # below this share of the floor: impossible_speedup
    # Every timed group includes an A/A pair: a copy of the reference timed as a member. When its
    # 95 % interval lies wholly outside 1 +- aa_tolerance, the group is measured again (up to
    # aa_retimes times); still so, its results say noisy. Noisy or not, a speedup inside the band
    # the copy measured is no speedup (noise_band). 0 leaves the copy out.
    aa_tolerance: float = 0.05
    aa_retimes: int = 1
    # A set of this many MiB or more (inputs and the reference's outputs) is kept by the judge in
    # files under cache_dir, mapped (judge/spill.py), not in its heap: at full size a group's sets
    # are tens of GiB. None (from Python; a large value on the command line) keeps every set in the heap.
    spill_set_mib: int | None = 64
    cache_dir: Path = field(default_factory=default_cache_dir)
    # Where the judge keeps precompiled torch headers for C++ builds (`kernelrl.judge.isolation.headers`):
    # one per toolchain and flag set, hundreds of MiB each, shared by every evaluator given the same
    # folder. None: `cache_dir/headers`.
    headers_dir: Path | None = None
    timing: TimingConfig = field(default_factory=TimingConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    llm_judge: LLMJudgeConfig = field(default_factory=LLMJudgeConfig)
    constants: dict[str, int] = field(default_factory=dict)  # explicit overrides on top of `size`

    @property
    def headers_root(self) -> Path:
        return self.headers_dir if self.headers_dir is not None else self.cache_dir / "headers"

    def __post_init__(self) -> None:
        for name, kind in (("device", Device), ("size", Size), ("policy", PolicyName)):
            value = getattr(self, name)
            try:
                object.__setattr__(self, name, kind(value))
            except ValueError:
                raise ValueError(f"{name} must be one of {', '.join(kind)}, not {value!r}") from None
        object.__setattr__(self, "cache_dir", Path(self.cache_dir))
        if self.headers_dir is not None:
            object.__setattr__(self, "headers_dir", Path(self.headers_dir))
        if self.device_index is not None and (self.device is not Device.CUDA or self.device_index < 0):
            raise ValueError("device_index is a GPU number (>= 0) and needs device cuda")
        if self.timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        if self.build_timeout_s < 0:
            raise ValueError("build_timeout_s must be >= 0")
        if self.n_correctness < 2:
            raise ValueError("n_correctness must be >= 2 (one plain set, one perturbed)")
        if self.tol_scale <= 0:
            raise ValueError("tol_scale must be positive")
        if self.concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if self.kept_references < 0:
            raise ValueError("kept_references must be >= 0")
        if self.aa_tolerance < 0 or self.aa_retimes < 0:
            raise ValueError("aa_tolerance and aa_retimes must be >= 0")
        if self.spill_set_mib is not None and self.spill_set_mib < 0:
            raise ValueError("spill_set_mib must be >= 0 (or None: never)")
        if not 0 < self.floor_slack <= 1:
            raise ValueError("floor_slack must be in (0, 1]")


def config_fingerprint(config: EvalConfig) -> str:
    """What makes two evaluations comparable: every setting but where caches live (builds',
    headers'), how many candidates are checked at once, how many reference workers are kept,
    whether the compile baseline is measured beside them and where the judge keeps its sets."""
    d = to_plain(config)
    for key in ("cache_dir", "headers_dir", "concurrency", "kept_references", "compile_baseline", "spill_set_mib"):
        d.pop(key, None)
    d["llm_judge"].pop("cache_path", None)
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]
