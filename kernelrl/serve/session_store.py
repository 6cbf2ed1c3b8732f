"""The session store: refinement episodes served over HTTP, their turns and verdicts, in SQLite.

A session is one client's refinement episode (`kernelrl.episodes.episode`) on one task: its
settings (turns, gamma, history budget, size, policy), the job that reads the task's profile,
the base prompt once built, and its turns. A turn is an answer (or a bare candidate), the code
judged, the idempotency key and the job that judges it, and once judged its result, its verdict
text (`kernelrl.episodes.feedback`) and its reward.

The tables live in the reward server's database, beside the jobs (`kernelrl.serve.jobs`): the
file, its tables and their versions are `kernelrl.serve.store.ServerStore`'s (WAL,
`synchronous=FULL`): what the server answered is on disk, so a server killed in any way and
started again on the same database keeps every session and every turn. A session store opened
alone on a new file makes it whole (jobs' tables included): it does not rely on the job store.

Guarantees:
- a session belongs to the client that created it (its token's name, `owner`): every read and
  write takes the owner and answers None or False for another owner's session;
- a session's creation key (`key`) is unique per owner: the same key returns the stored session;
- turns are numbered 1, 2, ... without gaps; `add_turn` stores turn N only when N is the next
  number, the session is open, no earlier turn is still being judged and fewer than `turns`
  turns were judged (`TurnRefused` says which), replacing a turn that `failed` (its job could
  not be finished: the client submits it again);
- `finish_turn` records a pending turn's verdict exactly once (only while it is pending);
- `purge` removes sessions with no activity since a cutoff, never one with a turn still pending.

Does not judge, score or build prompts (`kernelrl.serve.sessions` does), and does not talk to
the job store: a turn names its job by id and by idempotency key, so a turn stored just before
a crash is submitted again under the same key and never judged twice. Safe to call from several
threads (the server store's one connection and lock).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from kernelrl.backends.api import TurnState
from kernelrl.checks.policy import PolicyName
from kernelrl.episodes.episode import EpisodeConfig
from kernelrl.result import EvalResult
from kernelrl.reward import Reward
from kernelrl.serve.jobs import task_from_json, task_to_json
from kernelrl.serve.store import StoreTables
from kernelrl.tasks.task import Size, Task


class TurnRefused(Exception):
    """A turn that cannot be added now; the message says why (the client's mistake: 409)."""


class SessionLimit(Exception):
    """The client has as many sessions open as it may."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TurnRecord:
    number: int
    answer: str | None
    code: str | None
    key: str | None
    job: str | None
    state: TurnState
    result: EvalResult | None  # None: not judged yet, or no code to judge
    verdict: str | None
    reward: Reward | None  # None: not judged yet, or nothing to pay
    error: str | None
    created_s: float
    finished_s: float | None


@dataclass(frozen=True, kw_only=True, slots=True)
class SessionRecord:
    seq: int
    id: str
    owner: str
    key: str | None
    task: Task
    size: Size
    policy: PolicyName
    episode: EpisodeConfig
    profile_job: str | None
    base_prompt: str | None
    profile_error: str | None
    created_s: float
    closed_s: float | None
    turns: tuple[TurnRecord, ...]

    @property
    def judged(self) -> tuple[TurnRecord, ...]:
        return tuple(t for t in self.turns if t.state is TurnState.JUDGED)

    @property
    def pending(self) -> TurnRecord | None:
        return next((t for t in self.turns if t.state is TurnState.PENDING), None)

    @property
    def done(self) -> bool:
        """Every turn of the episode was judged."""
        return len(self.judged) >= self.episode.turns

    @property
    def next_turn(self) -> int:
        return len(self.judged) + 1


_SESSION_COLUMNS = ("seq, id, owner, key, task, size, policy, turns, gamma, history_tokens, profile_job, base_prompt, "
                    "profile_error, created_s, closed_s")
_TURN_COLUMNS = "number, answer, code, key, job, state, result, verdict, reward, error, created_s, finished_s"


class SessionStore(StoreTables):
    """The sessions of a reward server's database: on `store` (its connection and lock), or on a
    path (a `ServerStore` of its own, closed by `close`)."""

    # -- sessions -------------------------------------------------------------------------------

    def find_key(self, owner: str, key: str) -> SessionRecord | None:
        with self._lock:
            row = self._db.execute(f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE owner = ? AND key = ?",
                                   (owner, key)).fetchone()
            return None if row is None else self._record(row)

    def create(self, *, owner: str, task: Task, size: Size, policy: PolicyName, episode: EpisodeConfig,
               profile_job: str | None, key: str | None = None, max_open: int | None = None) -> SessionRecord:
        """Store a new session; with a key already stored for this owner, that session instead.
        Raises SessionLimit when the owner already has `max_open` sessions open."""
        now = time.time()
        with self._write() as db:
            if key is not None:
                row = db.execute(f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE owner = ? AND key = ?",
                                 (owner, key)).fetchone()
                if row is not None:
                    return self._record(row)
            if max_open is not None:
                n = db.execute("SELECT COUNT(*) FROM sessions WHERE owner = ? AND closed_s IS NULL",
                               (owner,)).fetchone()[0]
                if n >= max_open:
                    raise SessionLimit(f"{n} sessions are open for this client (the limit is {max_open}): close "
                                       "finished ones (DELETE /v1/sessions/ID)")
            session_id = uuid.uuid4().hex
            db.execute("INSERT INTO sessions (id, owner, key, task, size, policy, turns, gamma, history_tokens, "
                       "profile_job, created_s, updated_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (session_id, owner, key, task_to_json(task), str(size), str(policy), episode.turns,
                        episode.gamma, episode.history_tokens, profile_job, now, now))
            row = db.execute(f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE id = ?", (session_id,)).fetchone()
            return self._record(row)

    def get(self, session_id: str, *, owner: str) -> SessionRecord | None:
        """A session with its turns, or None for an unknown session or another owner's."""
        with self._lock:
            row = self._db.execute(f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE id = ? AND owner = ?",
                                   (session_id, owner)).fetchone()
            return None if row is None else self._record(row)

    def set_prompt(self, seq: int, *, base_prompt: str, profile_error: str | None) -> None:
        """Record the base prompt (once: a prompt already stored is kept, so every turn reads the same)."""
        with self._write() as db:
            db.execute("UPDATE sessions SET base_prompt = ?, profile_error = ?, updated_s = ? WHERE seq = ? "
                       "AND base_prompt IS NULL", (base_prompt, profile_error, time.time(), seq))

    def close_session(self, session_id: str, *, owner: str) -> bool:
        """Close a session (no more turns); False for an unknown session or another owner's."""
        now = time.time()
        with self._write() as db:
            row = db.execute("SELECT seq FROM sessions WHERE id = ? AND owner = ?", (session_id, owner)).fetchone()
            if row is None:
                return False
            db.execute("UPDATE sessions SET closed_s = COALESCE(closed_s, ?), updated_s = ? WHERE seq = ?",
                       (now, now, row[0]))
        return True

    def purge(self, *, idle_before_s: float) -> int:
        """Remove the sessions with no activity since this time, except those with a turn pending."""
        with self._write() as db:
            seqs = [s for (s,) in db.execute(
                "SELECT s.seq FROM sessions s WHERE s.updated_s < ? AND NOT EXISTS (SELECT 1 FROM session_turns t "
                "WHERE t.session_seq = s.seq AND t.state = 'pending')", (idle_before_s,))]
            db.executemany("DELETE FROM session_turns WHERE session_seq = ?", [(s,) for s in seqs])
            db.executemany("DELETE FROM sessions WHERE seq = ?", [(s,) for s in seqs])
        return len(seqs)

    # -- turns ----------------------------------------------------------------------------------

    def add_turn(self, seq: int, number: int, *, answer: str | None, code: str | None, key: str | None,
                 verdict: str | None = None, reward: Reward | None = None) -> TurnRecord:
        """Store turn `number`: pending (to be judged) when it has code, judged at once (with its
        verdict and reward) when it has none. Raises TurnRefused (see the module docstring)."""
        now = time.time()
        judged_now = code is None
        with self._write() as db:
            session = db.execute("SELECT turns, closed_s FROM sessions WHERE seq = ?", (seq,)).fetchone()
            if session is None:
                raise TurnRefused("no such session")
            turns, closed_s = session
            if closed_s is not None:
                raise TurnRefused("the session is closed")
            states = dict(db.execute("SELECT number, state FROM session_turns WHERE session_seq = ?", (seq,)))
            judged = sum(1 for s in states.values() if s == TurnState.JUDGED)
            pending = [n for n, s in states.items() if s == TurnState.PENDING]
            if judged >= turns:
                raise TurnRefused(f"the episode is done: its {turns} turns were judged")
            if pending:
                raise TurnRefused(f"turn {pending[0]} is still being judged; its verdict comes first "
                                  f"(GET its turn with ?wait=)")
            if number != judged + 1:
                raise TurnRefused(f"the next turn is {judged + 1}, not {number}")
            db.execute("DELETE FROM session_turns WHERE session_seq = ? AND number = ? AND state = 'failed'",
                       (seq, number))
            db.execute("INSERT INTO session_turns (session_seq, number, answer, code, key, state, verdict, reward, "
                       "created_s, finished_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (seq, number, answer, code, key, str(TurnState.JUDGED if judged_now else TurnState.PENDING),
                        verdict, _json(reward) if judged_now else None, now, now if judged_now else None))
            db.execute("UPDATE sessions SET updated_s = ? WHERE seq = ?", (now, seq))
            row = db.execute(f"SELECT {_TURN_COLUMNS} FROM session_turns WHERE session_seq = ? AND number = ?",
                             (seq, number)).fetchone()
        return _turn(row)

    def set_job(self, seq: int, number: int, job: str) -> None:
        with self._write() as db:
            db.execute("UPDATE session_turns SET job = ? WHERE session_seq = ? AND number = ? AND state = 'pending'",
                       (job, seq, number))

    def drop_pending(self, seq: int, number: int) -> None:
        """Remove a pending turn that no job was stored for (the queue refused it)."""
        with self._write() as db:
            db.execute("DELETE FROM session_turns WHERE session_seq = ? AND number = ? AND state = 'pending' "
                       "AND job IS NULL", (seq, number))

    def finish_turn(self, seq: int, number: int, *, result: EvalResult | None = None, verdict: str | None = None,
                    reward: Reward | None = None, error: str | None = None) -> bool:
        """Record a pending turn's verdict (or, with `error`, that it failed); False (nothing
        written) when it is no longer pending."""
        now = time.time()
        state = TurnState.FAILED if error is not None else TurnState.JUDGED
        with self._write() as db:
            n = db.execute("UPDATE session_turns SET state = ?, result = ?, verdict = ?, reward = ?, error = ?, "
                           "finished_s = ? WHERE session_seq = ? AND number = ? AND state = 'pending'",
                           (str(state), _json(result), verdict, _json(reward), error, now, seq, number)).rowcount
            if n:
                db.execute("UPDATE sessions SET updated_s = ? WHERE seq = ?", (now, seq))
        return bool(n)

    # ------------------------------------------------------------------------------------------

    def _record(self, row: tuple[Any, ...]) -> SessionRecord:
        (seq, session_id, owner, key, task, size, policy, turns, gamma, history_tokens, profile_job, base_prompt,
         profile_error, created_s, closed_s) = row
        rows = self._db.execute(f"SELECT {_TURN_COLUMNS} FROM session_turns WHERE session_seq = ? ORDER BY number",
                                (seq,)).fetchall()
        return SessionRecord(seq=seq, id=session_id, owner=owner, key=key, task=task_from_json(task), size=Size(size),
                             policy=PolicyName(policy),
                             episode=EpisodeConfig(turns=turns, gamma=gamma, history_tokens=history_tokens),
                             profile_job=profile_job, base_prompt=base_prompt, profile_error=profile_error,
                             created_s=created_s, closed_s=closed_s, turns=tuple(_turn(r) for r in rows))


def _turn(row: tuple[Any, ...]) -> TurnRecord:
    number, answer, code, key, job, state, result, verdict, reward, error, created_s, finished_s = row
    return TurnRecord(number=number, answer=answer, code=code, key=key, job=job, state=TurnState(state),
                      result=EvalResult.from_dict(json.loads(result)) if result is not None else None, verdict=verdict,
                      reward=_reward(reward), error=error, created_s=created_s, finished_s=finished_s)


def _json(record: EvalResult | Reward | None) -> str | None:
    # Both are stored as their JSON (the columns are text); None stays NULL.
    return json.dumps(record.to_dict()) if record is not None else None


def _reward(text: str | None) -> Reward | None:
    # A reward stored before nothing-to-pay was NULL was written as JSON `null`.
    data = json.loads(text) if text is not None else None
    return Reward.from_dict(data) if data is not None else None
