"""What a client is shown of a refinement session (`kernelrl.serve.sessions`): its base prompt,
its episode, each turn's reply and the session's.

Guarantees:
- the base prompt is built once, when the session's profile job has ended (with the task's
  profile when its reference worker could read it, else saying why not), stored with the
  session, and the first one stored is the one every reader gets (`base_prompt`: None before);
- a turn's reply carries its verdict text, status, speedup (correct turns only), reward and
  error as recorded; only the latest judged turn of an open session carries the next prompt;
- the session's reply holds every turn, the rewards and the discounted returns of its judged
  turns (`Episode.returns`, the session's gamma).

Does not judge, settle or record anything but the base prompt (`SessionService` does).
"""

from __future__ import annotations

import random

from kernelrl.backends.api import JobState, ProfileOutcome, SessionReply, TurnReply, TurnState
from kernelrl.episodes.episode import Episode
from kernelrl.episodes.prompt import build_prompt
from kernelrl.judge.harness.profile import TaskProfile
from kernelrl.result import Status
from kernelrl.serve.config import ServeConfig
from kernelrl.serve.jobs import FINISHED, JobStore
from kernelrl.serve.session_store import SessionRecord, SessionStore, TurnRecord

PROMPT_SEED = 0  # the base prompt is built once per session; a fixed seed keeps it reproducible


class SessionReplies:
    """The read side of the session routes (in worker threads: it reads SQLite, and stores the base prompt)."""

    def __init__(self, config: ServeConfig, *, jobs: JobStore, store: SessionStore) -> None:
        self.config = config
        self.jobs = jobs
        self.store = store

    def base_prompt(self, rec: SessionRecord) -> tuple[str, str | None] | None:
        """The session's base prompt and why it holds no profile (None when it does), built once
        its profile job has ended; None before."""
        if rec.base_prompt is not None:
            return rec.base_prompt, rec.profile_error
        profile: TaskProfile | None = None
        error: str | None = None
        view = self.jobs.job(rec.profile_job, owner=rec.owner) if rec.profile_job else None
        if view is None:
            error = "the task's profile is not known here (its job was removed)"
        elif view.state not in FINISHED:
            return None
        elif view.state is JobState.FAILED:
            error = f"reading the task's profile failed on the server: {view.error}"
        elif view.results and view.results[0] is not None:
            outcome = ProfileOutcome.from_dict(view.results[0])
            error = outcome.error
            profile = TaskProfile.from_dict(outcome.profile) if outcome.profile else None
        base = build_prompt(rec.task, db=None, chain_best=None, policy=str(rec.policy),
                            device=str(self.config.eval.device), rng=random.Random(PROMPT_SEED), size=str(rec.size),
                            profile=profile)
        self.store.set_prompt(rec.seq, base_prompt=base, profile_error=error)
        stored = self.store.get(rec.id, owner=rec.owner)  # the first one stored, if another thread was first
        if stored is not None and stored.base_prompt is not None:
            return stored.base_prompt, stored.profile_error
        return base, error

    def episode(self, rec: SessionRecord) -> Episode:
        """The session's episode from its judged turns: each with the verdict text and the reward
        given when it was judged."""
        episode = Episode(task=rec.task.name, config=rec.episode)
        for t in rec.judged:
            episode.record(t.answer or "", t.code, t.result, verdict=t.verdict or "",
                           reward=t.reward.value if t.reward is not None else None)
        return episode

    def turn_reply(self, rec: SessionRecord, turn: TurnRecord) -> TurnReply:
        status = speedup = None
        if turn.state is TurnState.JUDGED:
            status = turn.result.status.value if turn.result is not None else Status.NO_CODE.value
            if turn.result is not None and turn.result.status is Status.CORRECT:
                speedup = turn.result.speedup
        reward = turn.reward.value if turn.reward is not None else None
        prompt = None
        latest = rec.judged[-1].number if rec.judged else None
        if turn.number == latest and not rec.done and rec.closed_s is None:
            built = self.base_prompt(rec)
            prompt = self.episode(rec).prompt(built[0]) if built is not None else None
        return TurnReply(session=rec.id, turn=turn.number, state=turn.state, job=turn.job, status=status,
                         speedup=speedup, verdict=turn.verdict, reward=reward, done=rec.done, prompt=prompt,
                         error=turn.error)

    def reply(self, rec: SessionRecord) -> SessionReply:
        episode = self.episode(rec)
        open_ = rec.closed_s is None and not rec.done
        return SessionReply(session=rec.id, task=rec.task.name, turns=rec.episode.turns,
                            next_turn=rec.next_turn if open_ else None, size=rec.size, policy=rec.policy,
                            gamma=rec.episode.gamma, done=rec.done, closed=rec.closed_s is not None,
                            history=[self.turn_reply(rec, t) for t in rec.turns],
                            rewards=[t.reward for t in episode.turns], returns=episode.returns())
