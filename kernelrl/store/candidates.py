"""A run database's candidates, their results and findings: the writes of a search or a trainer,
and the reads of a whole run.

Guarantees:
- a candidate is stored `proposed` (source, prompt, raw answer, token counts) before it is judged,
  and its result, findings, hack cases and the change to `evaluated` land in one transaction
  (`store_result`); a second result for one candidate is refused;
- results are stored in full (`EvalResult.to_dict` JSON), with status, speedup and times also as
  columns for queries; `CandidateRecord.result` is the typed `EvalResult`;
- every refused (flagged) program judged here (not reused) is kept in the hack-case table with
  each rule that refused it, whatever refused it;
- `find_verdict` is the dedup lookup behind `kernelrl.judge.reuse.judged_before`: the first result
  of a source for a task judged under the same evaluator fingerprint against the task's current
  source (and, given it, the key's task hash), never a reused one, a judge error or one stored
  without a fingerprint;
- a candidate's `meta` is one JSON object (`RunMeta`), merged field by field by `merge_meta`.
"""

from __future__ import annotations

import json
import time
from typing import Any

from kernelrl.judge.reuse import JudgedKey, Known
from kernelrl.result import EvalResult, Severity, Status
from kernelrl.store.connection import Connection
from kernelrl.store.records import CandidateRecord, CandidateState, FindingRecord, NewCandidate, RunMeta
from kernelrl.store.schema import DatabaseError

# A candidate row with its result (`candidate_row` reads it).
CAND_COLS = ("c.id, c.run_id, c.task, c.hash, c.source, c.parents, c.chain, c.step, c.proposer, c.prompt, "
             "c.answer, c.prompt_tokens, c.completion_tokens, c.created, c.state, c.meta, r.result")
CAND_FROM = "candidates c LEFT JOIN results r ON r.candidate_id = c.id"


class CandidateRows(Connection):
    """The `candidates`, `results`, `findings` and `hack_cases` writes of a `Database`, and its reads
    of candidates by id, task, run and state."""

    def add_candidate(self, new: NewCandidate) -> CandidateRecord:
        """Store a proposal (state `proposed`) in one transaction and return its record."""
        created = time.time()
        with self._tx() as c:
            cur = c.execute(
                "INSERT INTO candidates (run_id, task, hash, source, parents, chain, step, proposer, prompt, answer, "
                "prompt_tokens, completion_tokens, created, state, meta) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (new.run_id, new.task, new.hash, new.source, json.dumps(list(new.parents)), new.chain, new.step,
                 new.proposer, new.prompt, new.answer, new.prompt_tokens, new.completion_tokens, created,
                 CandidateState.PROPOSED.value, json.dumps(new.meta.to_dict(), default=str)))
            cid = int(cur.lastrowid or 0)
        return CandidateRecord(id=cid, run_id=new.run_id, task=new.task, hash=new.hash, source=new.source,
                               parents=tuple(new.parents), chain=new.chain, step=new.step, proposer=new.proposer,
                               prompt=new.prompt, answer=new.answer, prompt_tokens=new.prompt_tokens,
                               completion_tokens=new.completion_tokens, created=created,
                               state=CandidateState.PROPOSED, meta=new.meta)

    def merge_meta(self, candidate_id: int, meta: RunMeta) -> None:
        """Add to a candidate's meta what training learned of it later (a multi-turn turn's return,
        once its episode has ended): every field `meta` sets replaces the stored one."""
        with self._tx() as c:
            rows = c.execute("SELECT meta FROM candidates WHERE id = ?", (candidate_id,)).fetchall()
            if not rows:
                raise DatabaseError(f"no candidate {candidate_id}")
            stored = RunMeta.from_dict(json.loads(rows[0][0] or "{}"))
            c.execute("UPDATE candidates SET meta = ? WHERE id = ?",
                      (json.dumps(stored.merged(meta).to_dict(), default=str), candidate_id))

    def store_result(self, candidate_id: int, result: EvalResult, *, reused_from: int | None = None) -> None:
        """Result, findings and the state change of one candidate, in one transaction."""
        with self._tx() as c:
            cand = c.execute("SELECT task, hash, state FROM candidates WHERE id = ?", (candidate_id,)).fetchall()
            if not cand:
                raise DatabaseError(f"no candidate {candidate_id}")
            task, h, state = cand[0]
            if state == CandidateState.EVALUATED.value:
                raise DatabaseError(f"candidate {candidate_id} already has a result")
            # task_hash: the task's source when this was judged; a changed task file is a new task
            # for dedup purposes
            c.execute("INSERT INTO results (candidate_id, task, hash, status, speedup, cand_ms, ref_ms, device, size, "
                      "policy, result, evaluated, reused_from, fingerprint, task_hash) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,"
                      "COALESCE((SELECT identity_hash FROM tasks WHERE name = ?), ''))",
                      (candidate_id, task, h, result.status.value, result.speedup,
                       result.cand_time.median_ms if result.cand_time else None,
                       result.ref_time.median_ms if result.ref_time else None,
                       result.device, result.size, result.policy, json.dumps(result.to_dict(), default=str),
                       time.time(), reused_from, result.config_fingerprint, task))
            c.executemany("INSERT INTO findings (candidate_id, rule, severity, stage, message) VALUES (?,?,?,?,?)",
                          [(candidate_id, f.rule, f.severity.value, f.stage, f.message) for f in result.findings])
            if result.status is Status.FLAGGED and reused_from is None:
                # Every refused program is a hack case, whatever refused it (static rule, dynamic
                # defence, degenerate task, LLM judge): prompts and trainers show them.
                c.executemany("INSERT OR IGNORE INTO hack_cases (candidate_id, task, hash, rule, stage, message, "
                              "line, created) VALUES (?,?,?,?,?,?,?,?)",
                              [(candidate_id, task, h, f.rule, f.stage, f.message, f.line, time.time())
                               for f in result.findings if f.severity is Severity.REJECT])
            c.execute("UPDATE candidates SET state = ? WHERE id = ?", (CandidateState.EVALUATED.value, candidate_id))

    def find_result(self, task: str, source_hash: str, *, fingerprint: str,
                    task_hash: str | None = None) -> tuple[int, EvalResult] | None:
        """The stored evaluation of this source for this task, judged under the evaluator config
        whose fingerprint is given (device, size, policy, tolerances, correctness sets, timing...):
        (candidate id, result). Callers deciding whether to reuse it ask `find_verdict` through
        `kernelrl.judge.reuse.judged_before`, which applies the reuse rule.

        Only results judged against the task's current source count (see `upsert_task`), and,
        given `task_hash`, against that source too; a result stored without a fingerprint is
        never reused.
        """
        if not fingerprint:
            return None
        also, extra = ("AND task_hash = ? ", (task_hash,)) if task_hash is not None else ("", ())
        rows = self._query("SELECT candidate_id, result FROM results WHERE task = ? AND hash = ? AND fingerprint = ? "
                           "AND reused_from IS NULL AND status != 'judge_error' "
                           "AND task_hash = COALESCE((SELECT identity_hash FROM tasks WHERE name = ?), '') "
                           f"{also}ORDER BY candidate_id LIMIT 1", (task, source_hash, fingerprint, task, *extra))
        if not rows:
            return None
        return int(rows[0][0]), EvalResult.from_dict(json.loads(rows[0][1]))

    def find_verdict(self, key: JudgedKey) -> Known | None:
        """The first stored evaluation for `key` (a `kernelrl.judge.reuse.VerdictStore`)."""
        hit = self.find_result(key.task, key.source_hash, fingerprint=key.fingerprint, task_hash=key.task_hash)
        return Known(result=hit[1], candidate_id=hit[0]) if hit is not None else None

    def store_reused_result(self, candidate_id: int, original_id: int, result: EvalResult) -> None:
        self.store_result(candidate_id, result, reused_from=original_id)

    def get_candidate(self, candidate_id: int) -> CandidateRecord | None:
        rows = self._query(f"SELECT {CAND_COLS} FROM {CAND_FROM} WHERE c.id = ?", (candidate_id,))
        return candidate_row(rows[0]) if rows else None

    def candidates(self, *, task: str | None = None, run_id: int | None = None,
                   state: CandidateState | None = None) -> list[CandidateRecord]:
        """Candidates in creation order, filtered by task, run and state."""
        where, params = _where(task=task, run_id=run_id, state=state)
        return [candidate_row(r) for r in self._query(f"SELECT {CAND_COLS} FROM {CAND_FROM}{where} ORDER BY c.id",
                                                   params)]

    def pending_candidates(self, run_id: int | None = None) -> list[CandidateRecord]:
        """Proposed but not evaluated: what a resumed run evaluates before asking the model again."""
        return self.candidates(run_id=run_id, state=CandidateState.PROPOSED)

    def count_candidates(self, *, task: str | None = None, run_id: int | None = None) -> int:
        where, params = _where(task=task, run_id=run_id, state=None)
        return int(self._query(f"SELECT COUNT(*) FROM candidates c{where}", params)[0][0])

    def token_totals(self, run_id: int | None = None) -> tuple[int, int]:
        """(prompt tokens, completion tokens) over a run, or over the whole file."""
        where, params = _where(task=None, run_id=run_id, state=None)
        row = self._query(f"SELECT COALESCE(SUM(prompt_tokens),0), COALESCE(SUM(completion_tokens),0) "
                          f"FROM candidates c{where}", params)[0]
        return int(row[0]), int(row[1])

    def findings(self, *, rule: str | None = None) -> list[FindingRecord]:
        sql = "SELECT candidate_id, rule, severity, stage, message FROM findings"
        params: tuple[str, ...] = ()
        if rule is not None:
            sql += " WHERE rule = ?"
            params = (rule,)
        return [FindingRecord(candidate_id=r[0], rule=r[1], severity=Severity(r[2]), stage=r[3], message=r[4])
                for r in self._query(sql + " ORDER BY id", params)]


def _where(*, task: str | None, run_id: int | None,
           state: CandidateState | None) -> tuple[str, tuple[str | int, ...]]:
    clauses: list[str] = []
    params: list[str | int] = []
    if task is not None:
        clauses.append("c.task = ?")
        params.append(task)
    if run_id is not None:
        clauses.append("c.run_id = ?")
        params.append(run_id)
    if state is not None:
        clauses.append("c.state = ?")
        params.append(state.value)
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), tuple(params)


def candidate_row(r: tuple[Any, ...]) -> CandidateRecord:
    return CandidateRecord(id=r[0], run_id=r[1], task=r[2], hash=r[3], source=r[4], parents=tuple(json.loads(r[5])),
                           chain=r[6], step=r[7], proposer=r[8], prompt=r[9], answer=r[10], prompt_tokens=r[11],
                           completion_tokens=r[12], created=r[13], state=CandidateState(r[14]),
                           meta=RunMeta.from_dict(json.loads(r[15])),
                           result=EvalResult.from_dict(json.loads(r[16])) if r[16] is not None else None)
