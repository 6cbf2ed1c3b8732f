"""Chains: the per-task state of a search, and how a resumed run rebuilds it.

A task has `chains` chains; each chain holds its step and its current best (the candidate it
asks the proposer to improve on) and, in a multi-turn run, its refinement episode under way
(`kernelrl.episodes.episode`: each turn is shown the chain's earlier turns and their verdicts).
`rebuild` recovers them from a run's stored candidates: a chain's step follows its last stored
step, its best at that step is that step's parent, and its unfinished episode is the trailing
run of turns 1, 2, ... it stored (all judged; otherwise the next step starts a fresh episode).

Guarantees: `better(a, b)` is True only for a correct `a` strictly faster than `b` (a correct
candidate beats none); rebuilding never asks a model anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kernelrl.episodes.episode import Episode, EpisodeConfig
from kernelrl.result import EvalResult
from kernelrl.store import Database
from kernelrl.store.records import BaselineRecord, CandidateRecord, RunMeta
from kernelrl.tasks.task import Task

if TYPE_CHECKING:
    from rich.progress import TaskID


@dataclass
class Chain:
    task: str
    index: int
    step: int = 0  # next step number
    best: CandidateRecord | None = None
    busy: bool = False
    episode: Episode | None = None  # the refinement episode under way (multi-turn runs)
    episodes: int = 0  # episodes this chain started
    last_turn: CandidateRecord | None = None  # the episode's latest judged turn (the next one's parent)

    def next_turn(self, prompt: str, config: EpisodeConfig, template_dir: Path | None
                  ) -> tuple[str, CandidateRecord | None]:
        """The next turn's prompt (the contrastive one plus the episode's history) and its parent
        (the previous turn, or the chain's best on an episode's first turn); a new episode starts
        when none is under way."""
        if self.episode is None or self.episode.done:
            self.episode = Episode(task=self.task, config=config, template_dir=template_dir)
            self.episodes += 1
            self.last_turn = None
        parent = self.last_turn if self.episode.turns and self.last_turn is not None else self.best
        return self.episode.prompt(prompt), parent

    def turn_meta(self) -> RunMeta:
        """Where the next candidate sits in the chain's episodes (nothing in single-turn runs)."""
        if self.episode is None:
            return RunMeta()
        return RunMeta(turn=self.episode.turn, episode=self.episodes)

    def record_turn(self, rec: CandidateRecord, result: EvalResult, baseline: BaselineRecord | None) -> None:
        """A verdict joins the chain's episode; the next turn reads it (against torch.compile too,
        when the task's baseline is known)."""
        assert self.episode is not None
        compile_speedup = baseline.eager_ms / baseline.compile_ms if baseline and baseline.compile_ms else None
        judged = bool(rec.source.strip())
        self.episode.record(rec.answer, rec.source if judged else None, result if judged else None,
                            compile_speedup=compile_speedup, compile_ci=baseline.compile_ci if baseline else None,
                            candidate_id=rec.id)
        self.last_turn = rec
    active: bool = True  # False: a chain beyond `chains` left by an earlier run; finishes its pending work only


@dataclass
class TaskState:
    task: Task
    chains: list[Chain]
    proposed: int = 0  # candidates stored in this run
    in_flight: int = 0  # model calls under way
    evaluated: int = 0
    correct: int = 0
    best: CandidateRecord | None = None
    failures: int = 0  # consecutive proposer failures
    gave_up: str | None = None
    progress_id: TaskID | None = None  # its bar, once the search shows one
    # a task's first prompts wait for its baseline, so they can state eager and compile times
    baseline_pending: bool = False
    profile_pending: bool = False  # and for its profile (shapes, constants), read by a reference worker


def better(a: CandidateRecord | None, b: CandidateRecord | None) -> bool:
    """Is a strictly faster than b (a correct candidate beats none)?"""
    if a is None or not a.is_correct:
        return False
    if b is None or not b.is_correct:
        return True
    return (a.speedup or 0.0) > (b.speedup or 0.0)


def fmt_speedup(rec: CandidateRecord | None) -> str:
    return f"best {rec.speedup:.2f}x" if rec is not None and rec.speedup is not None else "best -"


def rebuild(ts: TaskState, db: Database, run_id: int, *, episodes: EpisodeConfig | None = None,
            template_dir: Path | None = None) -> None:
    """Chain state from the run's stored candidates (see the module docstring); in a multi-turn
    run (`episodes`), each chain's unfinished episode too, from the turns stored for it."""
    cands = db.candidates(task=ts.task.name, run_id=run_id)
    ts.proposed = len(cands)
    by_chain: dict[int, list[CandidateRecord]] = {}
    for c in cands:
        by_chain.setdefault(c.chain, []).append(c)
        if c.result is not None:
            ts.evaluated += 1
            ts.correct += c.is_correct
    for index in sorted(by_chain):
        while index >= len(ts.chains):
            ts.chains.append(Chain(task=ts.task.name, index=len(ts.chains), active=False))
        chain = ts.chains[index]
        own = sorted(by_chain[index], key=lambda c: (c.step, c.id))
        chain.step = own[-1].step + 1
        best: CandidateRecord | None = None
        if own[-1].parents:
            best = db.get_candidate(own[-1].parents[-1])
        for c in own:
            if better(c, best):
                best = c
        chain.best = best if best is not None and best.is_correct else None
        if better(chain.best, ts.best):
            ts.best = chain.best
        if episodes is not None and episodes.turns > 1:
            _rebuild_episode(chain, own, episodes, template_dir)


def _rebuild_episode(chain: Chain, own: list[CandidateRecord], config: EpisodeConfig,
                     template_dir: Path | None) -> None:
    """The chain's trailing episode, when it is unfinished and every turn of it was judged."""
    chain.episodes = max((c.meta.episode for c in own if c.meta.episode is not None), default=0)
    trailing: list[CandidateRecord] = []
    for c in reversed(own):
        if c.meta.turn is None:
            break
        trailing.append(c)
        if c.meta.turn == 1:
            break
    trailing.reverse()
    if ([c.meta.turn for c in trailing] != list(range(1, len(trailing) + 1))
            or not trailing or len(trailing) >= config.turns or any(c.result is None for c in trailing)):
        return  # finished, never started, or a turn still unjudged: the next step starts a fresh episode
    episode = Episode(task=chain.task, config=config, template_dir=template_dir)
    for c in trailing:
        judged = bool(c.source.strip())
        episode.record(c.answer, c.source if judged else None, c.result if judged else None, candidate_id=c.id)
    chain.episode, chain.last_turn = episode, trailing[-1]
