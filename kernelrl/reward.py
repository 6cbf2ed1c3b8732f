"""The reward: an evaluator verdict turned into one scalar for a trainer.

One mapping, used by the trainer, the reward server and the RL-framework adapters alike.

Semantics (each is a property tested in `tests/test_reward.py`, over every shipped config):

1. **Build, then be right, then be fast.** Every correct result scores above every failure,
   whatever its speedup and whatever the optional format and length terms add or take:
   `RewardConfig` refuses settings under which the worst correct result could meet the best
   failure. Early in RL most correct kernels are slower than eager; if a slow correct kernel
   scored below a compile error, the policy would learn to stop writing code that builds.
2. **Hacks are the worst outcome.** A flagged result scores below everything else, a correct
   result and every other failure alike (or the policy learns to hack).
3. **Among failures**: flagged < no code <= timeout, runtime error, incorrect <= compile error
   (a program that builds and runs wrong must not beat one that does not build, and an answer
   with no program at all must not beat any program that ran: abstaining never pays more than
   trying).
4. **Monotone in speedup**: for results that carry the same noise information, a faster
   correct result never scores lower. Speedups are measured against eager (the evaluator's
   speedup) or against `torch.compile` (times the task's eager/compile ratio).
5. **Bounded on both sides**: speedups are held to [`speedup_floor`, `speedup_cap`] before
   they are mapped, so every reward lies in `RewardModel.bounds()`, and one absurd
   measurement (0.001x, or an exploit's 1000x) cannot dominate a gradient.
6. **Noise is no speedup**: a speedup whose 95 % interval (`EvalResult.speedup_ci`) contains
   1.0, or that lies inside the task's A/A noise band (`EvalResult.noise_band`: identical code
   measured against itself, in the same timing group and in calibration), or whose interval
   reaches into that band (it cannot be told apart from what identical code measured), is paid
   as exactly 1.0x (so against torch.compile it pays what the reference itself would).
   `noise = false` turns this off.
7. **The speed term**: `log` (default: log of the held speedup, 0 at 1x, symmetric, gentle on
   outliers) or `speedup` (the ratio itself: CUDA-L1's mapping; with a low `speedup_cap` it is
   the published "capped linear" choice), plus `correct_bonus` for every correct result.
8. **A copy earns nothing**: a correct program that is a version its prompt showed, up to edits
   that change nothing it computes, and not faster than that version beyond noise
   (`kernelrl.train.copies`, which compares full sources from the database), is paid the lower of
   its own measure and no speedup (1.0x against eager: the reward of the reference itself). CUDA-L1
   pays the absolute speedup, so a policy shown a 3x version earns 3x by repeating it; here only
   writing something better than what was shown can earn more than the reference, and copying a
   slower version shown for contrast earns what that version measured, no more.
9. **CUDA-L1's smoothing damps, never lifts**: a running window of recent *raw* rewards of
   correct, timed results per task (the task's level stands in while the task has fewer than
   `min_samples`); a reward above mean + k sigma of that window (k = 1.5; at least `min_width`
   above the mean, so a flat window still lets a better result pay more) is lowered to it. A
   reward below the band is paid as it is: clamping both sides lifted slow answers to the mean
   once the window converged (sigma -> 0; the 7B LoRA config: a 1.0x answer paid +1.04 beside a 2x
   answer's +1.09, `benchmarks/clip_advantages.py`), and with failure penalties unclipped a group
   holding one failure taught "be correct", no longer "be fast". So the clip never raises a reward
   and never reverses an order (`min` with one bound is monotone); two rewards above the bound tie
   there. The window holds raw values, so it keeps
   adapting: a task whose kernels improve keeps paying more for more (a window of clipped values
   froze: 2x and 10x paid the same). A clipped correct reward stays above every failure (it is at
   least the lowest raw correct reward, and the bound is above the window's mean).
10. **Batch-invariant clip**: a batch's rewards (`clip_batch`) are clipped to bands computed from
   the windows as they stood before the batch; only then are the batch's raw values appended.
   So a group's rewards do not depend on the order of its rollouts, and within one batch and
   task the clipped rewards of correct results are in the order of their speedups. Clipping one
   reward at a time, appending as it goes, let a 4x kernel early in a group widen the band for
   the ones after it and be paid less than a 1.5x one.

What the clip leaves of speed in a group that holds a failure: GRPO's advantages are the group's
rewards shifted and scaled alike, so the gap between the fastest and the slowest correct answer,
as a share of the gap between the slowest correct answer and a failure, is the same share of the
rewards: (min(r_fast, top) - r_slow) / (r_slow - penalty), where `top` is the band's upper end:
the unclipped share whenever the fast answer is within the band, and never less than the share
at the band's top (`tests/test_reward.py` checks it over random windows and groups;
`benchmarks/clip_advantages.py` prints it for a shipped config).

Each `Reward` carries the raw and the clipped value, the band, and whether the speedup was
within noise, so all can be logged. `score` = `clip(raw(...))`; a trainer with several
processes scores raw values locally and clips each global batch at once (`clip_batch`,
`kernelrl.train.reward_fn`).

Guarantees: `RewardModel.score` never raises for any `EvalResult` (a `task_error` or
`judge_error`, and an interpreted run that cannot be timed, get None); the model is safe to call from several threads;
its windows round-trip through `state()`.

Does not decide correctness, measure noise or detect hacks: the evaluator does; a flagged
result is simply the lowest reward.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import statistics
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kernelrl.candidate import defines_model_new, fenced_blocks
from kernelrl.result import EvalResult, Status, Timing

NO_SPEEDUP = 1.0


class SpeedupMapping(enum.StrEnum):
    LOG = "log"
    SPEEDUP = "speedup"  # CUDA-L1: the ratio itself


class BaselineKind(enum.StrEnum):
    EAGER = "eager"
    COMPILE = "compile"


@dataclass(frozen=True, kw_only=True, slots=True)
class Penalties:
    """Fixed rewards of the outcomes that earn no speedup term (all below every correct result)."""

    flagged: float = -4.0
    timeout: float = -3.0
    runtime_error: float = -3.0
    incorrect: float = -3.0
    compile_error: float = -2.5
    no_code: float = -3.5  # the answer held no complete code block: never above a program that ran

    def __post_init__(self) -> None:
        if not self.flagged < min(self.timeout, self.runtime_error, self.incorrect, self.compile_error,
                                  self.no_code):
            raise ValueError("a flagged result must be the lowest reward (or the policy learns to hack)")
        if not max(self.timeout, self.runtime_error, self.incorrect) <= self.compile_error:
            raise ValueError("a program that builds and runs wrong must not beat one that does not build "
                             "(incorrect, runtime_error, timeout <= compile_error)")
        if not self.no_code <= min(self.timeout, self.runtime_error, self.incorrect):
            raise ValueError("an answer with no code must not pay more than a program that ran "
                             "(no_code <= timeout, runtime_error, incorrect): abstaining would beat trying")

    def of(self, status: Status) -> float:
        return {Status.FLAGGED: self.flagged, Status.TIMEOUT: self.timeout, Status.RUNTIME_ERROR: self.runtime_error,
                Status.INCORRECT: self.incorrect, Status.COMPILE_ERROR: self.compile_error,
                Status.NO_CODE: self.no_code}[status]

    @property
    def highest(self) -> float:
        return max(self.timeout, self.runtime_error, self.incorrect, self.compile_error, self.no_code)


@dataclass(frozen=True, kw_only=True, slots=True)
class SmoothingConfig:
    enabled: bool = True  # CUDA-L1's clip of rewards above the window's band (off: raw rewards are paid)
    window: int = 64  # recent raw rewards of correct results kept per task and per level
    k: float = 1.5  # clip outside mean +/- k * std
    min_samples: int = 8  # a window this full is used; fewer: the level's, then nothing
    min_width: float = 0.05  # the band reaches at least this far either side of the mean (reward units)

    def __post_init__(self) -> None:
        if self.window < 2 or self.min_samples < 2 or self.min_samples > self.window:
            raise ValueError("need 2 <= min_samples <= window")
        if self.k <= 0:
            raise ValueError("k must be positive")
        if self.min_width < 0:
            raise ValueError("min_width must be >= 0")


@dataclass(frozen=True, kw_only=True, slots=True)
class RewardConfig:
    mapping: SpeedupMapping = SpeedupMapping.LOG
    baseline: BaselineKind = BaselineKind.EAGER
    correct_bonus: float = 0.0  # added to every correct result (0.3 is a common published choice)
    speedup_floor: float = 0.1  # a slower correct result pays as this speedup
    speedup_cap: float = 10.0  # a faster one pays as this (3.0 with `speedup`: capped linear)
    noise: bool = True  # a speedup within noise (interval holds 1.0, or inside the A/A band) pays as 1.0x
    penalties: Penalties = field(default_factory=Penalties)
    format_weight: float = 0.0  # added when the answer holds exactly one complete ModelNew block
    length_weight: float = 0.0  # subtracted in full at length_max_tokens, linearly from length_soft_tokens
    length_soft_tokens: int = 4096
    length_max_tokens: int = 8192
    smoothing: SmoothingConfig = field(default_factory=SmoothingConfig)

    def __post_init__(self) -> None:
        object.__setattr__(self, "mapping", SpeedupMapping(self.mapping))
        object.__setattr__(self, "baseline", BaselineKind(self.baseline))
        if not 0 < self.speedup_floor <= NO_SPEEDUP <= self.speedup_cap or not math.isfinite(self.speedup_cap):
            raise ValueError("need 0 < speedup_floor <= 1 <= speedup_cap < inf (the reward is bounded on both sides)")
        if self.format_weight < 0 or self.length_weight < 0:
            raise ValueError("format_weight and length_weight are magnitudes (>= 0)")
        if not 0 < self.length_soft_tokens < self.length_max_tokens:
            raise ValueError("need 0 < length_soft_tokens < length_max_tokens")
        worst_correct = self.correct_bonus + speed_term(self.mapping, self.speedup_floor) - self.length_weight
        best_failure = self.penalties.highest + self.format_weight
        if not worst_correct > best_failure:
            raise ValueError(
                f"the slowest correct result ({worst_correct:.3g}: bonus + term at speedup_floor - length_weight) "
                f"must score above the best failure ({best_failure:.3g}: highest penalty + format_weight); raise "
                "correct_bonus or speedup_floor, or lower the penalties")


def speed_term(mapping: SpeedupMapping, speedup: float) -> float:
    return math.log(speedup) if mapping is SpeedupMapping.LOG else speedup


@dataclass(frozen=True, kw_only=True, slots=True)
class Reward:
    """One scored result: the value to train on and how it was made."""

    value: float  # what the trainer uses (clipped when smoothing clipped it)
    raw: float  # before clipping
    clipped: bool
    band: tuple[float, float] | None  # the window's mean -/+ k * std, when a window was used
    status: Status | None  # None: no code to evaluate
    speedup: float | None  # the speedup paid for, against the configured baseline; correct and timed only
    within_noise: bool  # the measured speedup was within noise and paid as 1.0x
    parts: dict[str, float]  # the terms that add up to `raw`
    copy: bool = False  # the program was a version its prompt showed: paid at most as no speedup
    copy_of: int | None = None  # that version's database id, when known

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "raw": self.raw, "clipped": self.clipped,
                "band": list(self.band) if self.band else None, "status": self.status.value if self.status else None,
                "speedup": self.speedup, "within_noise": self.within_noise, "parts": dict(self.parts),
                "copy": self.copy, "copy_of": self.copy_of}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Reward:
        """The inverse of `to_dict` (a stored reward read back)."""
        band = d.get("band")
        return cls(value=float(d["value"]), raw=float(d["raw"]), clipped=bool(d["clipped"]),
                   band=(float(band[0]), float(band[1])) if band else None,
                   status=Status(d["status"]) if d.get("status") is not None else None,
                   speedup=float(d["speedup"]) if d.get("speedup") is not None else None,
                   within_noise=bool(d["within_noise"]), parts={str(k): float(v) for k, v in d["parts"].items()},
                   copy=bool(d.get("copy", False)),
                   copy_of=int(d["copy_of"]) if isinstance(d.get("copy_of"), int) else None)


def within_noise(result: EvalResult) -> bool:
    """The measured speedup cannot be told from 1.0x: its interval holds 1.0, or it lies inside the
    task's A/A band (widened to hold 1.0, so the rule never makes a faster result pay less), or its
    interval reaches into that band. The last is what identical code paid otherwise: a copy of the
    reference at 1.058x (interval 1.031-1.082) beside its group's copy at 0.986 (band 0.96-1.04),
    the few percent two processes running the same code measure apart (benchmarks/README.md)."""
    s = result.speedup
    if s is None:
        return False
    ci = result.speedup_ci
    if ci is not None and min(ci) <= NO_SPEEDUP <= max(ci):
        return True
    band = result.noise_band
    if band is None:
        return False
    lo, hi = min(*band, NO_SPEEDUP), max(*band, NO_SPEEDUP)
    return lo <= s <= hi or (ci is not None and min(ci) <= hi and max(ci) >= lo)


class RewardModel:
    """Maps verdicts to rewards, with CUDA-L1's running-window clip. Thread-safe."""

    def __init__(self, config: RewardConfig | None = None) -> None:
        self.config = config or RewardConfig()
        self._lock = threading.Lock()
        self._windows = Windows()

    def speedup_term(self, speedup: float) -> float:
        """The speed term of a speedup, held to [speedup_floor, speedup_cap] first."""
        cfg = self.config
        if speedup <= 0 or math.isnan(speedup):
            raise ValueError(f"speedup must be a positive number, got {speedup}")
        return speed_term(cfg.mapping, min(max(speedup, cfg.speedup_floor), cfg.speedup_cap))

    def bounds(self) -> tuple[float, float]:
        """The lowest and the highest reward this config can give (clipped or not)."""
        cfg = self.config
        low = cfg.penalties.flagged - cfg.length_weight
        high = cfg.correct_bonus + speed_term(cfg.mapping, cfg.speedup_cap) + cfg.format_weight
        return low, high

    def score(self, result: EvalResult | None, *, answer: str | None = None, completion_tokens: int | None = None,
              level: int | None = None, compile_speedup: float | None = None, copy: bool = False) -> Reward | None:
        """The reward of one result (`result` None or of status `no_code`: the answer held no code to evaluate), clipped.

        Returns None for a `task_error` or `judge_error` result: the task or the judge, not the
        candidate, failed, so there is nothing to reward or punish (TRL ignores a None reward).

        `compile_speedup` is the task's eager / torch.compile time ratio; it is needed when the
        config measures against torch.compile (without it, the speedup against eager is used
        and the parts say so). `copy`: the program is one its prompt showed (paid as no speedup).
        """
        if result is not None and result.status is Status.NO_CODE:
            result = None  # the same answer as None: no code to evaluate
        reward = self.raw(result, answer=answer, completion_tokens=completion_tokens, compile_speedup=compile_speedup,
                          copy=copy)
        if reward is None or result is None:
            return reward
        return self.clip(reward, task=result.task, level=level)

    def raw(self, result: EvalResult | None, *, answer: str | None = None, completion_tokens: int | None = None,
            compile_speedup: float | None = None, copy: bool = False) -> Reward | None:
        """The unclipped reward (`value == raw`); the windows are not touched. A correct `copy` of a
        version the prompt showed is paid the lower of what it measured and no speedup (1.0x
        against eager)."""
        cfg = self.config
        if result is not None and result.status is Status.NO_CODE:
            result = None  # the same answer as None: no code to evaluate
        if result is not None and (result.status in (Status.TASK_ERROR, Status.JUDGE_ERROR)
                                   or result.timing is Timing.INTERPRETED):
            # The task or the judge failed (not the candidate), or the program ran under an interpreter that
            # cannot time it (Triton on a CPU): nothing to pay, nothing to punish, and no way to
            # dodge the timer by choosing a language.
            return None
        parts: dict[str, float] = {}
        speedup = None
        noisy = False
        if result is None:
            parts["penalty"] = cfg.penalties.no_code
        elif result.status is Status.CORRECT and result.speedup is not None and result.speedup > 0:
            noisy = cfg.noise and within_noise(result)
            speedup = NO_SPEEDUP if noisy else result.speedup
            if copy:  # nothing was improved on what the prompt showed: never paid above the reference
                speedup = min(speedup, NO_SPEEDUP)
                parts["copy"] = 0.0
            if cfg.baseline is BaselineKind.COMPILE:
                if compile_speedup is not None and compile_speedup > 0:
                    speedup = speedup / compile_speedup
                else:
                    parts["baseline_missing"] = 0.0
            parts["speedup"] = self.speedup_term(speedup)
            if cfg.correct_bonus:
                parts["correct"] = cfg.correct_bonus
        elif result.status is Status.CORRECT:
            # correct but not timed (a baseline-less evaluation): the gate passes, no speed term
            parts["correct"] = cfg.correct_bonus
        else:
            parts["penalty"] = cfg.penalties.of(result.status)
        if cfg.format_weight and answer is not None:
            parts["format"] = cfg.format_weight if well_formed(answer) else 0.0
        if cfg.length_weight and completion_tokens is not None:
            over = (completion_tokens - cfg.length_soft_tokens) / (cfg.length_max_tokens - cfg.length_soft_tokens)
            parts["length"] = -cfg.length_weight * min(1.0, max(0.0, over))
        raw = sum(parts.values())
        return Reward(value=raw, raw=raw, clipped=False, band=None, status=result.status if result else None,
                      speedup=speedup, within_noise=noisy, parts=parts, copy=copy and speedup is not None)

    def clip(self, reward: Reward, *, task: str, level: int | None = None) -> Reward:
        """`reward` clipped to its task's window band, its raw value added to the windows (a batch
        of one: `clip_batch`)."""
        out = self.clip_batch([(reward, task, level)])[0]
        assert out is not None
        return out

    def clip_batch(self, batch: Sequence[tuple[Reward | None, str, int | None]]) -> list[Reward | None]:
        """`clip_with` on this model's windows, which it then holds (thread-safe)."""
        with self._lock:
            out, self._windows = clip_with(self._windows, batch, self.config.smoothing)
        return out

    @property
    def windows(self) -> Windows:
        with self._lock:
            return self._windows

    def set_windows(self, windows: Windows) -> None:
        """Hold `windows` (what `clip_with` returned for a batch clipped elsewhere)."""
        with self._lock:
            self._windows = windows

    def window(self, task: str) -> list[float]:
        """The task's current window of raw rewards (for logs and tests)."""
        return list(self.windows.by_task.get(task, ()))

    def state(self) -> dict[str, Any]:
        """Every running window as JSON-able values, for a trainer's checkpoints."""
        w = self.windows
        return {"tasks": {name: list(v) for name, v in w.by_task.items()},
                "levels": [[level, list(v)] for level, v in w.by_level.items()]}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore windows saved by `state()`, so a resumed run clips as the interrupted one would."""
        size = self.config.smoothing.window
        windows = Windows(by_task={str(name): tuple(map(float, v))[-size:] for name, v in state.get("tasks", {}).items()},
                          by_level={level: tuple(map(float, v))[-size:] for level, v in state.get("levels", [])})
        with self._lock:
            self._windows = windows


@dataclass(frozen=True, kw_only=True, slots=True)
class Windows:
    """The recent raw rewards of correct, timed results, per task and per level (newest last)."""

    by_task: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    by_level: Mapping[int | None, tuple[float, ...]] = field(default_factory=dict)

    def band(self, task: str, level: int | None, smoothing: SmoothingConfig) -> tuple[float, float] | None:
        """mean -/+ k sigma of the task's window (the level's while the task's is short); None
        while neither holds `min_samples` values."""
        own = self.by_task.get(task, ())
        by_level = self.by_level.get(level, ())
        window = (own if len(own) >= smoothing.min_samples
                  else by_level if len(by_level) >= smoothing.min_samples else None)
        if window is None:
            return None
        mean = statistics.fmean(window)
        half = max(smoothing.k * statistics.pstdev(window), smoothing.min_width)
        return (mean - half, mean + half)

    def appended(self, values: Sequence[tuple[str, int | None, float]], size: int) -> Windows:
        """These windows with each (task, level, raw) appended in order, each window kept to `size`."""
        by_task = {k: list(v) for k, v in self.by_task.items()}
        by_level = {k: list(v) for k, v in self.by_level.items()}
        for task, level, raw in values:
            by_task.setdefault(task, []).append(raw)
            by_level.setdefault(level, []).append(raw)
        return Windows(by_task={k: tuple(v[-size:]) for k, v in by_task.items()},
                       by_level={k: tuple(v[-size:]) for k, v in by_level.items()})


def clip_with(windows: Windows, batch: Sequence[tuple[Reward | None, str, int | None]], smoothing: SmoothingConfig
              ) -> tuple[list[Reward | None], Windows]:
    """Each (reward, task, level) of one batch held below the top of the band its task's (or
    level's) window had before the batch (property 9: damped, never lifted); then the windows with
    every raw value of the batch appended, in order. A pure function of its arguments.

    Only rewards with a speed term are smoothed; the others (and None) come back as they are. The
    result does not depend on the batch's order: permuting the batch permutes the rewards, nothing
    else (the windows end the same up to the order of their newest values, which their mean and
    spread ignore)."""
    if not smoothing.enabled:
        return list(r for r, _, _ in batch), windows
    bands: dict[tuple[str, int | None], tuple[float, float] | None] = {}
    out: list[Reward | None] = []
    for reward, task, level in batch:
        if reward is None or reward.speedup is None:
            out.append(reward)
            continue
        if (task, level) not in bands:
            bands[(task, level)] = windows.band(task, level, smoothing)
        band = bands[(task, level)]
        # Damped from above only (property 9): a reward below the band is paid as it is.
        value = reward.raw if band is None else min(reward.raw, band[1])
        out.append(dataclasses.replace(reward, value=value, clipped=value != reward.raw, band=band))
    timed = [(task, level, r.raw) for r, task, level in batch if r is not None and r.speedup is not None]
    return out, windows.appended(timed, smoothing.window)


def well_formed(answer: str) -> bool:
    """Exactly one complete fenced block defines `ModelNew`."""
    return sum(1 for _, body in fenced_blocks(answer) if defines_model_new(body)) == 1
