"""Rollouts: generated answers for tasks, judged in one batch and written to the code database.

Every stage that asks a model and keeps what the evaluator accepts goes through here: the GRPO
reward function, rejection-sampling rounds, `kernelrl collect` and `kernelrl bench`.

- `evaluate_rollouts(backend, rollouts, tasks, db=..., reuse=...)` extracts each answer's code
  (`kernelrl.candidate.extract_code`), answers without code are not evaluated (their result is
  None), and everything else is judged by ONE `backend.evaluate_batch` call, each program once:
  the same source twice in a batch for one task shares the first one's verdict (identical programs
  are paid identically, not by two measurements of the same code); with `reuse`
  (the evaluator's settings) a source judged before for the task under those settings takes the
  stored result instead (`kernelrl.judge.reuse.judged_before` on the database: its one key and
  rule; a stored `task_error` is judged again: the task may have been fixed or the machine less busy);
- `store_rollouts(db, judged, ...)` writes each rollout as a candidate (prompt, answer, token
  counts, proposer, parents) and its result in the same order; an answer without code is stored
  with a `no_code` result (`EvalResult.no_code`), as the search loop stores it, so every stored
  candidate has a verdict. Flagged results land in the database's hack-case table through `store_result`.

Guarantees: results come back in the order given; `evaluate_rollouts` never raises for a
candidate's or task's fault (that is the backend's contract); a rollout naming a task not in
`tasks` is a `KeyError` naming it (a caller's bug, not a model's).

Does not score: `kernelrl.reward.RewardModel` does that.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kernelrl.candidate import Candidate, extract_code, source_hash
from kernelrl.judge.contract import BatchJudge
from kernelrl.judge.eval_config import EvalConfig, config_fingerprint
from kernelrl.judge.reuse import JudgedKey, judged_before
from kernelrl.result import EvalResult, Status
from kernelrl.tasks.task import Task

if TYPE_CHECKING:
    from kernelrl.judge.contract import ProfilingJudge
    from kernelrl.judge.harness.profile import TaskProfile
    from kernelrl.store import Database
    from kernelrl.store.records import RunMeta


def task_profiles(backend: ProfilingJudge, tasks: Sequence[Task]) -> dict[str, TaskProfile | None]:
    """Each task's `TaskProfile` (constants and shapes for prompts), read by the backend's
    reference workers when it can (an `Evaluator` can; without one, prompts say the shapes are
    unavailable: no task code runs in the trainer's process)."""
    read = getattr(backend, "profile", None)
    out: dict[str, TaskProfile | None] = {}
    for t in tasks:
        try:
            out[t.name] = read(t) if callable(read) else None
        except Exception:  # noqa: BLE001 - a task whose reference fails is judged task_error later
            out[t.name] = None
    return out


@dataclass(frozen=True, kw_only=True)
class EvalSettings:
    """What makes a stored verdict reusable: the evaluator config it was judged under (its
    fingerprint, `kernelrl.judge.eval_config.config_fingerprint`); device, size and policy are
    also recorded on results that were never judged (no code)."""

    device: str
    size: str
    policy: str
    fingerprint: str

    @classmethod
    def of(cls, config: EvalConfig) -> EvalSettings:
        return cls(device=str(config.device), size=str(config.size), policy=str(config.policy),
                   fingerprint=config_fingerprint(config))


@dataclass(frozen=True, kw_only=True)
class Rollout:
    """One answer a model gave for a task."""

    task: str
    prompt: str
    answer: str
    prompt_tokens: int = 0
    completion_tokens: int | None = None  # None: not counted (no length term then)
    parents: tuple[int, ...] = ()  # database ids of the versions the prompt built on
    # the database ids of the versions the prompt showed (a copy of one is paid at most as no
    # speedup); None: not recorded, read from `prompt`'s blocks (`kernelrl.train.copies.shown_versions`).
    # A refinement turn's are its row's: repeating the episode's own earlier answer is not a copy
    shown: tuple[int, ...] | None = None
    shown_text: str | None = None  # without ids, the text whose blocks count as shown (None: `prompt`)


@dataclass(frozen=True, kw_only=True)
class Judged:
    rollout: Rollout
    code: str | None  # None: no complete code block, never evaluated
    result: EvalResult | None  # None exactly when code is None
    reused_from: int | None = None  # the database candidate whose stored verdict this is
    candidate_id: int | None = None  # set by store_rollouts
    same_as: int | None = None  # the rollout of the same batch whose verdict this is (the same program)

    @property
    def status(self) -> Status | None:
        return self.result.status if self.result is not None else None

    @property
    def judged_here(self) -> bool:
        """Its program was sent to the backend (not reused, not the same as another of its batch)."""
        return self.code is not None and self.reused_from is None and self.same_as is None


def evaluate_rollouts(backend: BatchJudge, rollouts: Sequence[Rollout], tasks: Mapping[str, Task], *,
                      db: Database | None = None, reuse: EvalSettings | None = None) -> list[Judged]:
    """Judge every rollout (see the module docstring); one `evaluate_batch` call at most."""
    codes = [extract_code(r.answer) for r in rollouts]
    out: list[Judged | None] = [None] * len(rollouts)
    pending: list[int] = []
    first: dict[tuple[str, str], int] = {}  # (task, source hash) -> the batch's first rollout of it
    same_as: dict[int, int] = {}
    for i, (r, code) in enumerate(zip(rollouts, codes)):
        task = tasks[r.task]
        if code is None:
            out[i] = Judged(rollout=r, code=None, result=None)
            continue
        if db is not None and reuse is not None:
            known = judged_before(db, JudgedKey.of(task, source_hash(code), reuse.fingerprint))
            if known is not None:
                out[i] = Judged(rollout=r, code=code, result=known.result, reused_from=known.candidate_id)
                continue
        key = (r.task, source_hash(code))
        if key in first:
            same_as[i] = first[key]  # the same program twice in one batch: judged once, paid alike
            continue
        first[key] = i
        pending.append(i)
    if pending:
        items = [(tasks[rollouts[i].task], Candidate(source=codes[i] or "", origin=f"rollout {i}")) for i in pending]
        results = backend.evaluate_batch(items)
        if len(results) != len(items):
            raise RuntimeError(f"the backend returned {len(results)} results for {len(items)} candidates")
        for i, res in zip(pending, results):
            out[i] = Judged(rollout=rollouts[i], code=codes[i], result=res)
    for i, j in same_as.items():
        original = out[j]
        assert original is not None
        out[i] = Judged(rollout=rollouts[i], code=codes[i], result=original.result, same_as=j)
    return [j for j in out if j is not None]


def store_rollouts(db: Database, judged: Sequence[Judged], *, proposer: str, step: int = 0, chain: int = 0,
                   run_id: int | None = None, meta: Sequence[RunMeta] | None = None,
                   settings: EvalSettings | None = None) -> list[Judged]:
    """Write each rollout and its verdict to the code database; the judged rows with their ids."""
    from kernelrl.store.records import NewCandidate, RunMeta

    out = []
    for i, j in enumerate(judged):
        r = j.rollout
        source = j.code or ""
        rec = db.add_candidate(NewCandidate(
            task=r.task, hash=source_hash(source), source=source, parents=tuple(r.parents), chain=chain, step=step,
            proposer=proposer, prompt=r.prompt, answer=r.answer, prompt_tokens=max(0, int(r.prompt_tokens)),
            completion_tokens=max(0, int(r.completion_tokens or 0)), run_id=run_id,
            meta=meta[i] if meta is not None else RunMeta()))
        result = j.result if j.result is not None else no_code_result(r.task, settings)
        if j.result is not None and not result.config_fingerprint and settings is not None:
            # A judge that does not say (a test double, an older server) judged under the run's config.
            result = dataclasses.replace(result, config_fingerprint=settings.fingerprint)
        if j.reused_from is not None:
            db.store_reused_result(rec.id, j.reused_from, result)
        else:
            db.store_result(rec.id, result)
        out.append(dataclasses.replace(j, candidate_id=rec.id))
    return out


def no_code_result(task: str, settings: EvalSettings | None = None) -> EvalResult:
    if settings is None:
        return EvalResult.no_code(task)
    return EvalResult.no_code(task, device=settings.device, size=settings.size, policy=settings.policy)


@dataclass(frozen=True, kw_only=True)
class StatusCounts:
    """How a batch of rollouts fared, for logs."""

    counts: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, judged: Sequence[Judged]) -> StatusCounts:
        counts: dict[str, int] = {}
        for j in judged:
            key = (j.status or Status.NO_CODE).value
            counts[key] = counts.get(key, 0) + 1
        return cls(counts=counts)
