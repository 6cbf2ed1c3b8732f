"""The reward: an evaluator verdict turned into one scalar for a trainer.

One mapping, used by the trainer, the reward server and the RL-framework adapters alike:

- a correctness gate: only a `correct` result earns a speedup term; every other status gets a
  fixed value, ordered so that the policy learns "build, then be right, then be fast, and never
  hack": flagged < timeout, runtime error, incorrect < compile error (validated);
- the speedup term, measured against eager (the evaluator's speedup) or against
  `torch.compile` (the evaluator's speedup times the task's eager/compile baseline ratio):
  `log` (default: log(speedup), symmetric around 1x and gentle on outliers), `speedup` (the
  ratio itself, the mapping CUDA-L1 describes) or `capped_linear` (min(speedup, cap), a
  common published choice), plus an optional bonus for being correct;
- optional format term (the answer holds exactly one complete code block defining `ModelNew`)
  and length penalty (linear between a soft and a hard token count, as in DAPO's overlong
  shaping);
- smoothing and clipping as CUDA-L1 describes: a running window of recent rewards of correct
  results per task (falling back to the task's level while the task has few), and a reward above
  mean + k·sigma of that window (k = 1.5) is clipped to the bound. Each `Reward` carries the raw
  and the clipped value so both can be logged.

Guarantees: `RewardModel.score` never raises for any `EvalResult` (a `task_error` gets None); the window holds clipped
values, so one exploit cannot widen the bound that clips the next; penalties are fixed values
and are never clipped; the model is safe to call from several threads.

Does not decide correctness or detect hacks: the evaluator does; a flagged result is simply the
lowest reward.
"""

from __future__ import annotations

import enum
import math
import statistics
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from kernelrl.candidate import defines_model_new, fenced_blocks
from kernelrl.result import EvalResult, Status


class SpeedupMapping(enum.StrEnum):
    LOG = "log"
    SPEEDUP = "speedup"
    CAPPED_LINEAR = "capped_linear"


class BaselineKind(enum.StrEnum):
    EAGER = "eager"
    COMPILE = "compile"


@dataclass(frozen=True, kw_only=True, slots=True)
class Penalties:
    """Fixed rewards of the statuses that earn no speedup term."""

    flagged: float = -1.0
    timeout: float = -0.5
    runtime_error: float = -0.5
    incorrect: float = -0.5
    compile_error: float = -0.3
    no_code: float = -0.3  # the answer held no complete code block

    def __post_init__(self) -> None:
        if not self.flagged < min(self.timeout, self.runtime_error, self.incorrect):
            raise ValueError("a flagged result must be the lowest reward (or the policy learns to hack)")
        if not max(self.timeout, self.runtime_error, self.incorrect) <= self.compile_error:
            raise ValueError("a program that builds and runs wrong must not beat one that does not build "
                             "(incorrect, runtime_error, timeout <= compile_error)")

    def of(self, status: Status) -> float:
        return {Status.FLAGGED: self.flagged, Status.TIMEOUT: self.timeout, Status.RUNTIME_ERROR: self.runtime_error,
                Status.INCORRECT: self.incorrect, Status.COMPILE_ERROR: self.compile_error}[status]


@dataclass(frozen=True, kw_only=True, slots=True)
class SmoothingConfig:
    enabled: bool = True
    window: int = 64  # recent rewards of correct results kept per task and per level
    k: float = 1.5  # clip above mean + k * std
    min_samples: int = 8  # a window this full is used; fewer: the level's, then nothing

    def __post_init__(self) -> None:
        if self.window < 2 or self.min_samples < 2 or self.min_samples > self.window:
            raise ValueError("need 2 <= min_samples <= window")
        if self.k <= 0:
            raise ValueError("k must be positive")


@dataclass(frozen=True, kw_only=True, slots=True)
class RewardConfig:
    mapping: SpeedupMapping = SpeedupMapping.LOG
    baseline: BaselineKind = BaselineKind.EAGER
    correct_bonus: float = 0.0  # added to every correct result (0.3 is a common published choice)
    speedup_cap: float = 3.0  # capped_linear only
    penalties: Penalties = field(default_factory=Penalties)
    format_weight: float = 0.0  # added when the answer holds exactly one complete ModelNew block
    length_weight: float = 0.0  # subtracted in full at length_max_tokens, linearly from length_soft_tokens
    length_soft_tokens: int = 4096
    length_max_tokens: int = 8192
    smoothing: SmoothingConfig = field(default_factory=SmoothingConfig)

    def __post_init__(self) -> None:
        object.__setattr__(self, "mapping", SpeedupMapping(self.mapping))
        object.__setattr__(self, "baseline", BaselineKind(self.baseline))
        if self.speedup_cap <= 0:
            raise ValueError("speedup_cap must be positive")
        if self.format_weight < 0 or self.length_weight < 0:
            raise ValueError("format_weight and length_weight are magnitudes (>= 0)")
        if not 0 < self.length_soft_tokens < self.length_max_tokens:
            raise ValueError("need 0 < length_soft_tokens < length_max_tokens")


@dataclass(frozen=True, kw_only=True, slots=True)
class Reward:
    """One scored result: the value to train on and how it was made."""

    value: float  # what the trainer uses (clipped when smoothing clipped it)
    raw: float  # before clipping
    clipped: bool
    bound: float | None  # the window's mean + k * std, when a window was used
    status: Status | None  # None: no code to evaluate
    speedup: float | None  # against the configured baseline; correct results only
    parts: dict[str, float]  # the terms that add up to `raw`

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "raw": self.raw, "clipped": self.clipped, "bound": self.bound,
                "status": self.status.value if self.status else None, "speedup": self.speedup,
                "parts": dict(self.parts)}


class RewardModel:
    """Maps verdicts to rewards, with CUDA-L1's running-window clip. Thread-safe."""

    def __init__(self, config: RewardConfig | None = None) -> None:
        self.config = config or RewardConfig()
        self._lock = threading.Lock()
        size = self.config.smoothing.window
        self._by_task: dict[str, deque[float]] = {}
        self._by_level: dict[int | None, deque[float]] = {}
        self._size = size

    def speedup_term(self, speedup: float) -> float:
        cfg = self.config
        if speedup <= 0 or not math.isfinite(speedup):
            raise ValueError(f"speedup must be a positive number, got {speedup}")
        if cfg.mapping is SpeedupMapping.LOG:
            return math.log(speedup)
        if cfg.mapping is SpeedupMapping.SPEEDUP:
            return speedup
        return min(speedup, cfg.speedup_cap)

    def score(self, result: EvalResult | None, *, answer: str | None = None, completion_tokens: int | None = None,
              level: int | None = None, compile_speedup: float | None = None) -> Reward | None:
        """The reward of one result (`result` None: the answer held no code to evaluate).

        Returns None for a `task_error` result: the task, not the candidate, failed, so there is
        nothing to reward or punish (TRL ignores a None reward).

        `compile_speedup` is the task's eager / torch.compile time ratio; it is needed when the
        config measures against torch.compile (without it, the speedup against eager is used
        and the parts say so).
        """
        cfg = self.config
        if result is not None and result.status is Status.TASK_ERROR:
            return None
        parts: dict[str, float] = {}
        speedup = None
        if result is None:
            parts["penalty"] = cfg.penalties.no_code
        elif result.status is Status.CORRECT and result.speedup is not None and result.speedup > 0:
            speedup = result.speedup
            if cfg.baseline is BaselineKind.COMPILE:
                if compile_speedup is not None and compile_speedup > 0:
                    speedup = result.speedup / compile_speedup
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
        value, bound = raw, None
        status = result.status if result is not None else None
        if speedup is not None and cfg.smoothing.enabled:
            value, bound = self._clip(result.task, level, raw)
        return Reward(value=value, raw=raw, clipped=value < raw, bound=bound, status=status, speedup=speedup,
                      parts=parts)

    def _clip(self, task: str, level: int | None, raw: float) -> tuple[float, float | None]:
        sm = self.config.smoothing
        with self._lock:
            own = self._by_task.setdefault(task, deque(maxlen=self._size))
            by_level = self._by_level.setdefault(level, deque(maxlen=self._size))
            window = own if len(own) >= sm.min_samples else by_level if len(by_level) >= sm.min_samples else None
            bound = None
            value = raw
            if window is not None:
                bound = statistics.fmean(window) + sm.k * statistics.pstdev(window)
                value = min(raw, bound)
            own.append(value)
            by_level.append(value)
        return value, bound

    def window(self, task: str) -> list[float]:
        """The task's current window (for logs and tests)."""
        with self._lock:
            return list(self._by_task.get(task, ()))

    def state(self) -> dict[str, Any]:
        """Every running window as JSON-able values, for a trainer's checkpoints."""
        with self._lock:
            return {"tasks": {name: list(w) for name, w in self._by_task.items()},
                    "levels": [[level, list(w)] for level, w in self._by_level.items()]}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore windows saved by `state()`, so a resumed run clips as the interrupted one would."""
        with self._lock:
            self._by_task = {str(name): deque(map(float, w), maxlen=self._size)
                             for name, w in state.get("tasks", {}).items()}
            self._by_level = {level: deque(map(float, w), maxlen=self._size) for level, w in state.get("levels", [])}


def well_formed(answer: str) -> bool:
    """Exactly one complete fenced block defines `ModelNew`."""
    return sum(1 for _, body in fenced_blocks(answer) if defines_model_new(body)) == 1
