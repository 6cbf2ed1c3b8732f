"""The search's settings: `SearchConfig`, read from a run config (`kernelrl/configs/*.toml`) and
the flags of `kernelrl optimize`.

Holds an `EvalConfig` (`eval`), itself holding the timing and sandbox configs; validated when built.
Imports no runtime (torch, the evaluator, a model): a command reads, checks and prints its settings
before anything starts, and `kernelrl optimize --help` is generated from these fields' comments.

Does not read files or flags: `kernelrl.config` and the CLI build it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelrl.config import to_dict
from kernelrl.episodes.episode import EpisodeConfig
from kernelrl.judge.eval_config import EvalConfig
from kernelrl.web.config import WatchConfig

if TYPE_CHECKING:
    from kernelrl.jsontypes import JSONObject, JSONValue

__all__ = ["SearchConfig"]


@dataclass(frozen=True, kw_only=True)
class SearchConfig:
    tasks: tuple[str, ...]  # task specs for kernelrl.tasks.suites.load_tasks: suites, names, files, folders
    db_path: Path  # the run's SQLite code database (made when missing; a new run is added to an existing one)
    proposer: str = "heuristic"  # spec for kernelrl.proposers.make_proposer
    # options of the proposer, e.g. base_url=URL temperature=0.7 max_tokens=4096
    proposer_opts: dict[str, object] = field(default_factory=dict)
    budget: int = 8  # candidates (model answers) per task in this run, split evenly over its chains
    chains: int = 2  # parallel chains per task
    # prompt + completion tokens over the run; None: no limit. (A per-answer limit is a proposer
    # option: proposer_opts={"max_tokens": N} for openai.)
    token_budget: int | None = None
    wall_time_s: float | None = None  # per invocation; None: no limit
    exchange_every: int = 2  # steps between a chain's looks at the task's best; 0: never
    model_concurrency: int = 4  # proposer calls at once
    k_shown: int = 4  # earlier candidates shown in a prompt
    seed: int = 0  # seeds the prompts' random choices (the judge's seeds stay secret whatever this is)
    resume: bool = False  # continue the database's latest search run instead of starting a new one
    baselines: bool = True  # measure eager and torch.compile times once per task
    batch_wait_s: float = 5.0  # a candidate waits at most this long for others to join its batch
    template_dir: Path | None = None  # prompt templates overriding the built-in ones
    # Refinement: each chain answers in episodes of episode.turns turns, every turn shown its
    # earlier answers and their verdicts within episode.history_tokens (kernelrl.episodes.episode,
    # counted as characters / 4); turns = 1: every prompt fresh.
    episode: EpisodeConfig = field(default_factory=EpisodeConfig)
    # How candidates are judged: device, size, policy, limits, timing, sandbox.
    eval: EvalConfig = field(default_factory=EvalConfig)
    watch: WatchConfig = field(default_factory=WatchConfig)  # the run page served while the run goes: watch.port

    def __post_init__(self) -> None:
        specs = (self.tasks,) if isinstance(self.tasks, str) else self.tasks
        # "a.py,b.py" and ["a.py", "b.py"] mean the same
        object.__setattr__(self, "tasks", tuple(s.strip() for v in specs for s in v.split(",") if s.strip()))
        object.__setattr__(self, "db_path", Path(self.db_path))
        if self.template_dir is not None:
            object.__setattr__(self, "template_dir", Path(self.template_dir))
        if not self.tasks:
            raise ValueError("no tasks given")
        if self.budget < 1:
            raise ValueError(f"budget must be >= 1 candidate per task, got {self.budget}")
        if self.chains < 1:
            raise ValueError(f"chains must be >= 1, got {self.chains}")
        if self.token_budget is not None and self.token_budget < 1:
            raise ValueError(f"token_budget must be >= 1 or None, got {self.token_budget}")
        if self.wall_time_s is not None and not self.wall_time_s > 0:
            raise ValueError(f"wall_time_s must be > 0 or None, got {self.wall_time_s}")
        if self.exchange_every < 0:
            raise ValueError(f"exchange_every must be >= 0, got {self.exchange_every}")
        if self.model_concurrency < 1:
            raise ValueError("model_concurrency must be >= 1")
        if self.k_shown < 0:
            raise ValueError(f"k_shown must be >= 0, got {self.k_shown}")
        if self.batch_wait_s < 0:
            raise ValueError(f"batch_wait_s must be >= 0, got {self.batch_wait_s}")

    def judge_config(self) -> EvalConfig:
        """The evaluator settings a search's in-process judge is built with: its baselines (eager
        and torch.compile) are measured in each task's first timing group when `baselines` is on."""
        return dataclasses.replace(self.eval, compile_baseline=self.baselines)

    def proposer_options(self) -> dict[str, Any]:  # Any: forwarded as keyword arguments, which the proposer checks
        """The options the search's proposer is built with: `proposer_opts`, and for an
        OpenAI-compatible endpoint as many requests in flight as the loop makes calls at once."""
        opts = dict(self.proposer_opts)
        if self.proposer.startswith("openai:"):
            opts.setdefault("concurrency", self.model_concurrency)
        return opts

    def to_json(self) -> JSONObject:
        d = to_dict(self)
        # options may hold an API key: the database keeps only their names
        names: list[JSONValue] = [*sorted(self.proposer_opts)]
        d["proposer_opts"] = names
        return d
