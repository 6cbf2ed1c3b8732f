"""A run database's reads for prompts and trainers: the fastest correct programs of a task, contrast
sets, refused programs and hack cases, recent verdicts of a kind.

Guarantees: the candidate lists (`top_candidates`, `contrast_set`, `recent_refused`,
`recent_with_status`) hold one candidate per distinct source (its first in the order asked:
fastest, or newest); `hack_cases` one row per refusing rule; only correct candidates are ever shown as versions to improve
(`top_candidates`, `contrast_set`), and refused ones only as what not to do (`recent_refused`,
`hack_cases`). Reads only: nothing here writes.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from kernelrl.result import Status
from kernelrl.store.candidates import CAND_COLS, CAND_FROM, CandidateRows, candidate_row
from kernelrl.store.records import CandidateRecord, ContrastDraw, HackCase

# A weaker candidate is shown for contrast only when the best is at least this many times faster:
# close scores are timing noise, not a lesson.
CONTRAST_RATIO = 1.2


class PromptQueries(CandidateRows):
    """The reads a prompt, a trainer or a report makes of a `Database`'s candidates and hack cases."""

    def top_candidates(self, task: str, k: int) -> list[CandidateRecord]:
        """The k fastest correct candidates of a task, fastest first, one per distinct source."""
        if k <= 0:
            return []
        return self._correct_distinct(task)[:k]

    def contrast_set(self, task: str, k: int, rng: random.Random | None = None, *,
                     draw: ContrastDraw = ContrastDraw.BEST, temperature: float = 1.0) -> list[CandidateRecord]:
        """Up to k correct candidates chosen for contrast, fastest first.

        `ContrastDraw.BEST`: the best one, then candidates clearly weaker than it (at most
        best/CONTRAST_RATIO), drawn by `rng` one from each of k-1 equal slices of the weaker ones
        ranked by speed, so the set spans the range of speeds rather than bunching at one end.
        When there are too few clearly weaker ones, the next fastest fill the set.
        `ContrastDraw.SCORE`: k drawn by `rng` without replacement, each with weight
        speedup ** (1 / temperature) (lower temperature: the fast ones more often).
        Refused candidates are not in this set: ask `recent_refused` for them.
        """
        if k <= 0:
            return []
        if temperature <= 0:
            raise ValueError("contrast temperature must be > 0")
        rng = rng or random.Random(0)
        ranked = self._correct_distinct(task)
        if not ranked:
            return []
        if draw is ContrastDraw.SCORE:
            pool = list(ranked)
            drawn: list[CandidateRecord] = []
            while pool and len(drawn) < k:
                weights = [max(c.speedup or 0.0, 1e-3) ** (1.0 / temperature) for c in pool]
                drawn.append(pool.pop(rng.choices(range(len(pool)), weights=weights)[0]))
            return sorted(drawn, key=lambda c: -(c.speedup or 0.0))
        best = ranked[0]
        limit = (best.speedup or 0.0) / CONTRAST_RATIO
        weaker = [c for c in ranked[1:] if (c.speedup or 0.0) <= limit]
        picked: list[CandidateRecord] = [best]
        slots = k - 1
        if slots > 0 and weaker:
            n = min(slots, len(weaker))
            for i in range(n):
                lo, hi = i * len(weaker) // n, (i + 1) * len(weaker) // n
                picked.append(weaker[rng.randrange(lo, hi)])
        if len(picked) < k:
            chosen = {c.id for c in picked}
            picked.extend([c for c in ranked if c.id not in chosen][: k - len(picked)])
        return sorted(picked, key=lambda c: -(c.speedup or 0.0))

    def recent_refused(self, task: str, n: int) -> list[CandidateRecord]:
        """The n most recent refused programs of a task (hack cases, one per source), newest first.

        Each record's `result.findings` / `result.rejecting_rules` name the rules that refused it.
        """
        if n <= 0:
            return []
        ids = [r[0] for r in self._query("SELECT candidate_id FROM hack_cases WHERE task = ? "
                                         "GROUP BY hash ORDER BY MAX(id) DESC LIMIT ?", (task, n))]
        recs = [self.get_candidate(i) for i in ids]
        return [r for r in recs if r is not None]

    def hack_cases(self, *, task: str | None = None, limit: int | None = None) -> list[HackCase]:
        """Refused programs with the rule that refused each, newest first (one row per rule)."""
        params: list[str | int] = [task] if task is not None else []
        where = " WHERE h.task = ?" if task is not None else ""
        sql = ("SELECT h.candidate_id, h.task, h.hash, h.rule, h.stage, h.message, h.line, h.created, c.source "
               f"FROM hack_cases h JOIN candidates c ON c.id = h.candidate_id{where} ORDER BY h.id DESC")
        if limit is not None:
            sql += " LIMIT ?"
            params.append(int(limit))
        return [HackCase(candidate_id=r[0], task=r[1], hash=r[2], rule=r[3], stage=r[4], message=r[5], line=r[6],
                         created=r[7], source=r[8]) for r in self._query(sql, params)]

    def hack_case_counts(self) -> dict[str, int]:
        """Refused programs per rule."""
        return {r[0]: int(r[1]) for r in self._query("SELECT rule, COUNT(*) FROM hack_cases GROUP BY rule "
                                                     "ORDER BY COUNT(*) DESC, rule")}

    def recent_with_status(self, task: str, n: int, statuses: Sequence[Status]) -> list[CandidateRecord]:
        """The n most recent candidates of a task with one of `statuses`, one per source, newest first."""
        if n <= 0 or not statuses:
            return []
        marks = ",".join("?" * len(statuses))
        rows = self._query(f"SELECT {CAND_COLS} FROM {CAND_FROM} WHERE c.task = ? AND r.status IN ({marks}) "
                           f"ORDER BY c.id DESC", (task, *[s.value for s in statuses]))
        out: list[CandidateRecord] = []
        seen: set[str] = set()
        for r in rows:
            rec = candidate_row(r)
            if rec.hash in seen:
                continue
            seen.add(rec.hash)
            out.append(rec)
            if len(out) == n:
                break
        return out

    def _correct_distinct(self, task: str) -> list[CandidateRecord]:
        rows = self._query(f"SELECT {CAND_COLS} FROM {CAND_FROM} WHERE c.task = ? AND r.status = ? "
                           f"ORDER BY r.speedup DESC, c.id ASC", (task, Status.CORRECT.value))
        out: list[CandidateRecord] = []
        seen: set[str] = set()
        for r in rows:
            rec = candidate_row(r)
            if rec.hash not in seen:
                seen.add(rec.hash)
                out.append(rec)
        return out
