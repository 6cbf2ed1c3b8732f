"""verl's custom reward: `compute_score` (one sample) and `compute_score_batch` (verl's batch manager).

verl configuration (one sample at a time, verl's default `naive` reward manager):

    custom_reward_function.path=$(python -c "import kernelrl.serve.verl as m; print(m.__file__)")
    custom_reward_function.name=compute_score

or, better for kernels (one job per training step instead of one per sample):

    reward_model.reward_manager=batch custom_reward_function.name=compute_score_batch

Each dataset row holds the task in `reward_model.ground_truth` (a built-in task name or a full
KernelBench-format source) and may hold `extra_info.task_name` (the name of a task given as
source) and `extra_info.level` (the reward's smoothing window falls back to the level's).

Where the verdicts come from, first match wins: keyword arguments (verl's
`custom_reward_function.reward_kwargs`: `url`, `token_file`, `timeout_s` — one call to the
server, an hour by default —, `eval` — a table of `kernelrl.judge.evaluator.EvalConfig`
settings (device, size, policy, timeout_s, timing...) — and `reward` — a table of
`kernelrl.reward.RewardConfig` settings), then the environment (`KERNELRL_SERVE_URL`,
`KERNELRL_SERVE_TOKEN_FILE`); with a URL the reward server judges
(`kernelrl.backends.client.RewardClient`; the `eval` table's size and policy go with each job),
without one an in-process `Evaluator` built from the `eval` table.

Other keywords are accepted and not used: verl's reward loop adds its own to every call
(`reward_router_address` and `reward_model_tokenizer` in its naive, dapo and limited reward
managers, with a reward model), and a later verl may add more. Those not known to come from
verl are named once in a warning, so a misspelt setting does not go unnoticed.

Guarantees: the answer's code is extracted like everywhere else (`extract_code`), and an answer
without a complete code block gets the reward model's `no_code` penalty without being evaluated;
the scalar comes from `kernelrl.reward.RewardModel` (CUDA-L1's clip included; its running window
lives in this process, one per configuration); every returned dict has the same keys (`score`,
`raw`, `clipped`, `correct`, `scored`: numbers, as verl's metric aggregation needs); a task
whose reference cannot run (`task_error`) scores 0.0 with `scored` 0.0, since verl cannot
ignore a sample. Task sources are checked with `ast` only: they run in sandboxed workers.

Does not tokenise: no length penalty is applied (verl does not pass token counts here).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelrl.backends.api import BadItem, is_task_name, resolve_task
from kernelrl.candidate import extract_code
from kernelrl.result import EvalResult, Status
from kernelrl.reward import Reward, RewardConfig, RewardModel
from kernelrl.tasks.task import Task

if TYPE_CHECKING:
    from kernelrl.judge.contract import OwnedJudge

log = logging.getLogger("kernelrl.serve")

ENV_URL = "KERNELRL_SERVE_URL"
ENV_TOKEN_FILE = "KERNELRL_SERVE_TOKEN_FILE"
SCORE_KEYS = ("score", "raw", "clipped", "correct", "scored")
SETTINGS = ("url", "token_file", "timeout_s", "eval", "reward")
# What verl's reward loop passes to compute_score besides its own arguments (not ours to use).
VERL_KEYWORDS = frozenset({"reward_router_address", "reward_model_tokenizer"})
_warned: set[str] = set()


@dataclass(frozen=True, kw_only=True, slots=True)
class VerlSettings:
    """What a scorer is built from. Tables are kept as JSON text, so settings are hashable and
    name one cached scorer per process."""

    url: str | None = None
    token_file: str | None = None
    timeout_s: float | None = None  # one call to the server; None: the client's default
    eval: str = "{}"  # EvalConfig settings
    reward: str = "{}"  # RewardConfig settings

    @classmethod
    def resolve(cls, kwargs: Mapping[str, Any], env: Mapping[str, str] | None = None) -> VerlSettings:
        env = os.environ if env is None else env
        unknown = sorted(set(kwargs) - set(SETTINGS) - VERL_KEYWORDS - _warned)
        if unknown:
            _warned.update(unknown)
            log.warning("kernelrl reward: ignoring keyword(s) %s (the settings are %s)", ", ".join(unknown),
                        ", ".join(SETTINGS))
        timeout = kwargs.get("timeout_s")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0):
            raise TypeError(f"timeout_s must be a positive number of seconds, not {timeout!r}")
        tables = {}
        for name in ("eval", "reward"):
            table = kwargs.get(name) or {}
            if not isinstance(table, Mapping):
                raise TypeError(f"{name} must be a table of settings, not {type(table).__name__}")
            tables[name] = json.dumps(_plain(table), sort_keys=True)
        return cls(url=kwargs.get("url") or env.get(ENV_URL) or None,
                   token_file=kwargs.get("token_file") or env.get(ENV_TOKEN_FILE) or None,
                   timeout_s=float(timeout) if timeout is not None else None, **tables)


def _plain(d: Mapping[str, Any]) -> dict[str, Any]:
    # verl hands OmegaConf containers; plain dicts are what the config builder reads
    return {str(k): _plain(v) if isinstance(v, Mapping) else v for k, v in d.items()}


class VerlScorer:
    """One backend and one reward model for one configuration (cached per process)."""

    def __init__(self, settings: VerlSettings) -> None:
        from kernelrl.backends.judges import SERVER_SETTINGS, BackendConfig, make_judge
        from kernelrl.config import build
        from kernelrl.judge.eval_config import EvalConfig

        self.settings = settings
        self.model = RewardModel(build(RewardConfig, json.loads(settings.reward)))
        table = json.loads(settings.eval)
        eval_config = build(EvalConfig, table)  # checked even when a server judges
        # A server judges at the size and policy the table names; those it leaves out are the server's.
        self.backend: OwnedJudge = make_judge(
            eval_config, BackendConfig(url=settings.url, timeout_s=settings.timeout_s,
                                      token_file=Path(settings.token_file) if settings.token_file else None),
            server_chooses=sorted(SERVER_SETTINGS - table.keys()))
        atexit.register(self.backend.close)

    def score_batch(self, solution_strs: Sequence[str], ground_truths: Sequence[object],
                    extra_infos: Sequence[Mapping[str, Any] | None]) -> list[dict[str, float]]:
        codes = [extract_code(s or "") for s in solution_strs]
        tasks: list[Task] = []
        levels: list[int | None] = []
        for truth, extra in zip(ground_truths, extra_infos):
            extra = extra or {}
            try:
                task = resolve_task(str(truth), None if is_task_name(str(truth)) else extra.get("task_name"))
            except BadItem as e:
                raise ValueError(f"kernelrl reward: the ground truth is not a task: {e}") from None
            tasks.append(task)
            level = extra.get("level", task.level)
            levels.append(int(level) if level is not None else None)
        todo = [(i, c) for i, c in enumerate(codes) if c is not None]
        results: dict[int, EvalResult] = {}
        if todo:
            judged = self.backend.evaluate_batch([(tasks[i], code) for i, code in todo])
            results = {i: r for (i, _), r in zip(todo, judged)}
        # One clip for the batch: every band is the window's before it, so no score depends on the
        # order of the batch (RewardModel.clip_batch).
        raws = [self.model.raw(results.get(i), answer=answer) for i, answer in enumerate(solution_strs)]
        clipped = self.model.clip_batch([(r, tasks[i].name, levels[i]) if i in results else (r, "", None)
                                         for i, r in enumerate(raws)])
        return [_as_dict(r) for r in clipped]


def _as_dict(reward: Reward | None) -> dict[str, float]:
    if reward is None:  # task_error: nothing to reward or punish
        return {"score": 0.0, "raw": 0.0, "clipped": 0.0, "correct": 0.0, "scored": 0.0}
    return {"score": float(reward.value), "raw": float(reward.raw), "clipped": float(reward.clipped),
            "correct": float(reward.status is Status.CORRECT), "scored": 1.0}


_SCORERS: dict[VerlSettings, VerlScorer] = {}
_SCORERS_LOCK = threading.Lock()


def scorer(settings: VerlSettings) -> VerlScorer:
    with _SCORERS_LOCK:
        found = _SCORERS.get(settings)
        if found is None:
            found = _SCORERS[settings] = VerlScorer(settings)
        return found


def compute_score(data_source: str, solution_str: str, ground_truth: object, extra_info: Mapping[str, Any] | None = None,
                  **kwargs: Any) -> dict[str, float]:
    """verl's per-sample reward: a dict with `score` (see the module docstring)."""
    return scorer(VerlSettings.resolve(kwargs)).score_batch([solution_str], [ground_truth], [extra_info])[0]


def compute_score_batch(data_sources: Sequence[str], solution_strs: Sequence[str], ground_truths: Sequence[object],
                        extra_infos: Sequence[Mapping[str, Any] | None] | None = None,
                        **kwargs: Any) -> list[dict[str, float]]:
    """verl's batch reward (`reward_model.reward_manager=batch`): one dict per sample, in order."""
    n = len(solution_strs)
    if len(ground_truths) != n:
        raise ValueError(f"{n} solutions but {len(ground_truths)} ground truths")
    extras = list(extra_infos) if extra_infos is not None else [None] * n
    return scorer(VerlSettings.resolve(kwargs)).score_batch(list(solution_strs), list(ground_truths), extras)
