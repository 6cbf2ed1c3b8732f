"""The code database: schema, WAL, typed round-trips, dedup, contrast selection, SIGKILL safety."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kernelrl.judge.eval_config import EvalConfig, config_fingerprint
from kernelrl.judge.reuse import JudgedKey, judged_before
from kernelrl.report.export import export_jsonl
from kernelrl.result import NO_CODE_HASH, NO_CODE_MESSAGE, EvalResult, Finding, Severity, Status, TimingStats
from kernelrl.store import (
    SCHEMA_VERSION,
    CandidateState,
    Database,
    DatabaseError,
    NewCandidate,
    RunStatus,
)
from kernelrl.store.records import ContrastDraw, RunMeta
from kernelrl.tasks.task import Task


def _result(task: str, status: Status, speedup: float | None = None, h: str = "", findings=()) -> EvalResult:
    cand = TimingStats(median_ms=10.0 / speedup, mean_ms=10.0 / speedup, min_ms=9.0 / speedup, iqr_ms=0.1, n=5) \
        if speedup else None
    return EvalResult(task=task, status=status, speedup=speedup, candidate_hash=h, cand_time=cand,
                      ref_time=TimingStats(median_ms=10.0, mean_ms=10.0, min_ms=9.5, iqr_ms=0.2, n=5),
                      findings=list(findings), message=f"{status.value}", config_fingerprint=DEFAULT_FP)


# The fingerprint of the evaluator config the stored results were judged under.
DEFAULT_FP = config_fingerprint(EvalConfig())


def _add(db: Database, task: str, src: str, status: Status, speedup: float | None = None, findings=(),
         **kw) -> int:
    h = f"h-{src}"
    rec = db.add_candidate(NewCandidate(task=task, hash=h, source=src, prompt=f"prompt {src}",
                                        answer=f"```python\n{src}\n```", **kw))
    db.store_result(rec.id, _result(task, status, speedup, h, findings))
    return rec.id


def test_schema_version_and_wal(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    with Database(path) as db:
        assert db.schema_version == SCHEMA_VERSION
        assert db.journal_mode == "wal"
    conn = sqlite3.connect(path)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"runs", "tasks", "baselines", "candidates", "results", "findings", "schema_version"} <= tables
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")  # written by a newer kernelrl
    conn.commit()
    conn.close()
    with pytest.raises(DatabaseError, match="schema version"):
        Database(path)


def test_not_a_database_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.db"
    bad.write_text("this is not sqlite " * 100)
    with pytest.raises(DatabaseError, match="not a usable SQLite"):
        Database(bad)
    with pytest.raises(DatabaseError, match="no database"):
        Database(tmp_path / "missing.db", readonly=True)


def test_candidate_and_result_round_trip(tmp_path: Path) -> None:
    with Database(tmp_path / "k.db") as db:
        run = db.start_run({"budget": 3})
        new = NewCandidate(task="t", hash="abc", source="class ModelNew: pass\n", parents=(4, 7), chain=2, step=3,
                           proposer="openai:m", prompt="P", answer="A", prompt_tokens=11, completion_tokens=22,
                           run_id=run, meta=RunMeta(proposer={"model": "m"}, turn=2))
        rec = db.add_candidate(new)
        assert rec.state is CandidateState.PROPOSED and rec.result is None
        assert db.pending_candidates(run)[0].id == rec.id
        res = _result("t", Status.FLAGGED, None, "abc",
                      [Finding(rule="extra_stream", message="m", severity=Severity.REJECT, stage="static", line=3),
                       Finding(rule="note", message="w", severity=Severity.WARN)])
        db.store_result(rec.id, res)
        got = db.get_candidate(rec.id)
        assert got is not None
        assert got.state is CandidateState.EVALUATED
        assert got.parents == (4, 7) and got.chain == 2 and got.step == 3 and got.proposer == "openai:m"
        assert (got.prompt_tokens, got.completion_tokens) == (11, 22) and got.meta == RunMeta(proposer={"model": "m"}, turn=2)
        assert got.result == res  # full EvalResult survives, findings included
        assert got.result.rejecting_rules == ["extra_stream"]
        assert db.pending_candidates(run) == []
        assert [(f.rule, f.severity, f.stage) for f in db.findings()] == [
            ("extra_stream", Severity.REJECT, "static"), ("note", Severity.WARN, "dynamic")]
        with pytest.raises(DatabaseError, match="already has a result"):
            db.store_result(rec.id, res)
        assert db.token_totals(run) == (11, 22)
        db.finish_run(run, RunStatus.FINISHED)
        r = db.get_run(run)
        assert r is not None and r.status is RunStatus.FINISHED and r.config == {"budget": 3} and r.finished


def test_a_judge_error_is_never_reused(tmp_path: Path) -> None:
    with Database(tmp_path / "k.db") as db:
        _add(db, "t", "x", Status.JUDGE_ERROR)
        assert db.find_result("t", "h-x", fingerprint=DEFAULT_FP) is None
        judged = _add(db, "t", "x", Status.CORRECT, 2.0)
        assert db.find_result("t", "h-x", fingerprint=DEFAULT_FP)[0] == judged


def test_dedup_lookup_matches_task_and_settings(tmp_path: Path) -> None:
    with Database(tmp_path / "k.db") as db:
        first = _add(db, "t", "x", Status.CORRECT, 2.0)
        hit = db.find_result("t", "h-x", fingerprint=DEFAULT_FP)
        assert hit is not None and hit[0] == first and hit[1].speedup == 2.0
        # other task, device or policy: not the same evaluation
        assert db.find_result("u", "h-x", fingerprint=DEFAULT_FP) is None
        for other in (EvalConfig(device="cuda"), EvalConfig(policy="strict"), EvalConfig(size="full")):
            assert db.find_result("t", "h-x", fingerprint=config_fingerprint(other)) is None
        # a reused result points at the original, and lookups keep finding the original
        again = db.add_candidate(NewCandidate(task="t", hash="h-x", source="x"))
        db.store_reused_result(again.id, hit[0], hit[1])
        assert db.get_candidate(again.id).result.speedup == 2.0
        assert db.find_result("t", "h-x", fingerprint=DEFAULT_FP)[0] == first
        # the task's file changed: earlier verdicts were about another program
        db.upsert_task(name="t", source="new", identity_hash="new", level=None, size="small")
        assert db.find_result("t", "h-x", fingerprint=DEFAULT_FP) is None


def test_a_stored_verdict_is_not_reused_under_another_tolerance_or_number_of_sets(tmp_path: Path) -> None:
    with Database(tmp_path / "k.db") as db:
        _add(db, "t", "x", Status.CORRECT, 2.0)
        assert db.find_result("t", "h-x", fingerprint=DEFAULT_FP) is not None
        looser = config_fingerprint(EvalConfig(tol_scale=10.0))
        more_sets = config_fingerprint(EvalConfig(n_correctness=8))
        assert len({DEFAULT_FP, looser, more_sets}) == 3
        assert db.find_result("t", "h-x", fingerprint=looser) is None
        assert db.find_result("t", "h-x", fingerprint=more_sets) is None
        # where caches live and how many run at once do not change a verdict
        assert config_fingerprint(EvalConfig(cache_dir=tmp_path, concurrency=1)) == DEFAULT_FP


def test_results_stored_before_fingerprints_are_not_reused(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with Database(path) as db:
        rec = db.add_candidate(NewCandidate(task="t", hash="h-x", source="x"))
        db.store_result(rec.id, dataclasses.replace(_result("t", Status.CORRECT, 2.0, "h-x"), config_fingerprint=""))
        assert db.find_result("t", "h-x", fingerprint=DEFAULT_FP) is None
        assert db.find_result("t", "h-x", fingerprint="") is None


def test_top_candidates_distinct_and_ordered(tmp_path: Path) -> None:
    with Database(tmp_path / "k.db") as db:
        _add(db, "t", "a", Status.CORRECT, 1.5)
        _add(db, "t", "b", Status.CORRECT, 3.0)
        _add(db, "t", "c", Status.INCORRECT)
        _add(db, "t", "b", Status.CORRECT, 3.0)  # same source again
        _add(db, "u", "z", Status.CORRECT, 9.0)
        top = db.top_candidates("t", 5)
        assert [c.source for c in top] == ["b", "a"]
        assert [c.speedup for c in db.top_candidates("t", 1)] == [3.0]


def test_contrast_set_has_best_and_clearly_weaker(tmp_path: Path) -> None:
    with Database(tmp_path / "k.db") as db:
        speeds = [4.0, 3.9, 3.8, 2.0, 1.5, 1.0, 0.8, 0.5, 0.3]
        for i, s in enumerate(speeds):
            _add(db, "t", f"s{i}", Status.CORRECT, s)
        for seed in range(5):
            picked = db.contrast_set("t", 4, random.Random(seed))
            sp = [c.speedup for c in picked]
            assert len(sp) == 4 and sp[0] == 4.0 and sp == sorted(sp, reverse=True)
            # no near-ties with the best: those teach nothing
            assert all(s <= 4.0 / 1.2 for s in sp[1:])
            # one from each third of the weaker ones: spans fast to slow
            assert sp[1] in (2.0, 1.5) and sp[2] in (1.0, 0.8) and sp[3] in (0.5, 0.3)
        # too few clearly weaker ones: the next fastest fill the set
        with Database(tmp_path / "k2.db") as db2:
            for i, s in enumerate([2.0, 1.95, 1.9, 1.0]):
                _add(db2, "t", f"s{i}", Status.CORRECT, s)
            assert [c.speedup for c in db2.contrast_set("t", 3, random.Random(0))] == [2.0, 1.95, 1.0]
        assert db.contrast_set("none", 3, random.Random(0)) == []


def test_contrast_set_drawn_by_score_follows_the_weights(tmp_path: Path) -> None:
    with Database(tmp_path / "k.db") as db:
        for i, s in enumerate([4.0, 2.0, 1.0, 1.0]):
            _add(db, "t", f"s{i}", Status.CORRECT, s)
        _add(db, "t", "bad", Status.INCORRECT)
        rng = random.Random(0)
        draws = [db.contrast_set("t", 1, rng, draw=ContrastDraw.SCORE) for _ in range(4000)]
        firsts = [d[0].speedup for d in draws]
        # one drawn with weight speedup: the best 4/8 of the time, the 2.0x one 2/8, each 1.0x 1/8
        assert abs(firsts.count(4.0) / 4000 - 0.5) < 0.03 and abs(firsts.count(2.0) / 4000 - 0.25) < 0.03
        # a lower temperature favours the fast ones: weights 16, 4, 1, 1
        cold = [db.contrast_set("t", 1, rng, draw=ContrastDraw.SCORE, temperature=0.5)[0].speedup for _ in range(4000)]
        assert abs(cold.count(4.0) / 4000 - 16 / 22) < 0.03
        pairs = [db.contrast_set("t", 2, rng, draw=ContrastDraw.SCORE) for _ in range(200)]
        # without replacement, fastest first, never a failure
        assert all(len({c.id for c in p}) == 2 and p[0].speedup >= p[1].speedup for p in pairs)
        assert not any(c.status is Status.INCORRECT for p in pairs for c in p)
        assert len(db.contrast_set("t", 9, rng, draw=ContrastDraw.SCORE)) == 4


def test_recent_refused_newest_first_with_rules(tmp_path: Path) -> None:
    with Database(tmp_path / "k.db") as db:
        _add(db, "t", "h1", Status.FLAGGED, findings=[Finding(rule="cached_output", message="m")])
        _add(db, "t", "ok", Status.CORRECT, 2.0)
        _add(db, "t", "h2", Status.FLAGGED, findings=[Finding(rule="extra_stream", message="m")])
        _add(db, "t", "h2", Status.FLAGGED, findings=[Finding(rule="extra_stream", message="m")])
        refused = db.recent_refused("t", 5)
        assert [c.source for c in refused] == ["h2", "h1"]
        assert [c.result.rejecting_rules for c in refused] == [["extra_stream"], ["cached_output"]]
        assert len(db.recent_refused("t", 1)) == 1


def test_every_refused_program_is_a_hack_case_with_its_rule(tmp_path: Path) -> None:
    with Database(tmp_path / "k.db") as db:
        first = _add(db, "t", "h1", Status.FLAGGED, findings=[
            Finding(rule="module_patching", message="torch.allclose rebound", stage="static", line=3),
            Finding(rule="rng_seeding", message="seeds", severity=Severity.WARN, stage="static")])
        _add(db, "t", "ok", Status.CORRECT, 2.0)
        _add(db, "u", "h3", Status.FLAGGED, findings=[Finding(rule="llm_judge", message="the model says: cached")])
        reused = db.add_candidate(NewCandidate(task="t", hash="h-h1", source="h1", prompt="p", answer="a"))
        db.store_reused_result(reused.id, first, db.get_candidate(first).result)
        cases = db.hack_cases()
        assert [(c.task, c.rule, c.stage, c.line) for c in cases] == [("u", "llm_judge", "dynamic", None),
                                                                       ("t", "module_patching", "static", 3)]
        assert cases[1].source == "h1" and cases[1].candidate_id == first  # the reuse added nothing
        assert [c.rule for c in db.hack_cases(task="t")] == ["module_patching"]
        assert db.hack_case_counts() == {"llm_judge": 1, "module_patching": 1}


def test_a_version_1_file_gains_its_hack_cases(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    with Database(path) as db:
        _add(db, "t", "h1", Status.FLAGGED, findings=[Finding(rule="cached_output", message="m")])
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE hack_cases")
    conn.execute("UPDATE schema_version SET version = 1")
    conn.execute("PRAGMA user_version = 0")  # as a kernelrl of version 1 left it: the version in its table
    conn.commit()
    conn.close()
    with Database(path) as db:
        assert db.schema_version == SCHEMA_VERSION
        assert [(c.task, c.rule, c.source) for c in db.hack_cases()] == [("t", "cached_output", "h1")]


def test_a_version_4_file_keeps_its_tasks_under_the_renamed_hash_column(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    with Database(path) as db:
        db.upsert_task(name="t", source="src", identity_hash="hh", level=1, size="small")
    conn = sqlite3.connect(path)
    conn.execute("ALTER TABLE tasks RENAME COLUMN identity_hash TO source_hash")  # as version 4 named it
    conn.execute("UPDATE schema_version SET version = 4")
    conn.execute("PRAGMA user_version = 4")
    conn.commit()
    conn.close()
    with Database(path) as db:
        assert db.schema_version == SCHEMA_VERSION
        assert [(t.name, t.identity_hash) for t in db.tasks()] == [("t", "hh")]


def test_baselines_and_tasks(tmp_path: Path) -> None:
    with Database(tmp_path / "k.db") as db:
        db.upsert_task(name="t", source="src", identity_hash="hh", level=1, size="small")
        db.upsert_task(name="t", source="src2", identity_hash="h2", level=1, size="small")
        assert [(t.name, t.source) for t in db.tasks()] == [("t", "src2")]
        db.put_baseline(task="t", device="cpu", size="small", eager_ms=2.0, compile_ms=None)
        b = db.get_baseline("t", "cpu", "small")
        assert b is not None and b.eager_ms == 2.0 and b.compile_ms is None
        assert db.get_baseline("t", "cuda", "small") is None
        with pytest.raises(ValueError):
            db.put_baseline(task="t", device="cpu", size="small", eager_ms=0.0, compile_ms=1.0)


def test_export_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    with Database(path) as db:
        _add(db, "t", "a", Status.CORRECT, 1.5)
        _add(db, "t", "b", Status.INCORRECT)
        db.add_candidate(NewCandidate(task="t", hash="p", source="pending"))
    out = tmp_path / "x.jsonl"
    assert export_jsonl(path, out) == 2
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert set(rows[0]) == {"task", "prompt", "answer", "code", "result"}
    assert rows[0]["code"] == "a" and rows[0]["result"]["speedup"] == 1.5 and rows[0]["prompt"] == "prompt a"
    assert export_jsonl(path, out, only_correct=True) == 1


_WRITER = textwrap.dedent("""
    import sys, time
    from kernelrl.store import Database, NewCandidate
    from kernelrl.result import EvalResult, Status
    db = Database(sys.argv[1])
    i = 0
    while True:
        rec = db.add_candidate(NewCandidate(task="t", hash=f"h{i}", source="x" * 5000 + str(i)))
        db.store_result(rec.id, EvalResult(task="t", status=Status.INCORRECT, message="m" * 2000))
        print(rec.id, flush=True)  # printed only after both transactions committed
        i += 1
""")


def test_sigkill_keeps_every_committed_row(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    Database(path).close()
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    acked: list[int] = []
    assert proc.stdout is not None
    deadline = time.time() + 60
    while len(acked) < 40 and time.time() < deadline:
        acked.append(int(proc.stdout.readline()))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert len(acked) >= 40
    with Database(path) as db:
        assert db.journal_mode == "wal"
        evaluated = {c.id for c in db.candidates(state=CandidateState.EVALUATED)}
        assert set(acked) <= evaluated  # every acknowledged write survived
        # no half rows: an evaluated candidate has its result, a result has its candidate
        for c in db.candidates():
            assert (c.result is None) == (c.state is CandidateState.PROPOSED)
        assert sqlite3.connect(path).execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_baselines_keep_their_interval_and_say_when_it_holds_one(tmp_path: Path) -> None:
    with Database(tmp_path / "k.db") as db:
        db.put_baseline(task="t", device="cpu", size="small", eager_ms=2.0, compile_ms=1.9, compile_ci=(0.97, 1.08))
        db.put_baseline(task="u", device="cpu", size="small", eager_ms=2.0, compile_ms=1.0, compile_ci=(1.9, 2.1))
        db.put_baseline(task="v", device="cpu", size="small", eager_ms=2.0, compile_ms=None, compile_ci=(0.9, 1.1))
        t, u, v = (db.get_baseline(n, "cpu", "small") for n in "tuv")
    assert t is not None and t.compile_ci == (0.97, 1.08) and t.compile_within_noise
    assert u is not None and not u.compile_within_noise
    assert v is not None and v.compile_ci is None  # no compiled time, no interval


def _open_at_once(path: str, barrier, errors) -> None:  # noqa: ANN001 - multiprocessing plumbing
    from kernelrl.store import Database

    barrier.wait(timeout=30)
    try:
        with Database(path) as db:
            db.count_candidates()
    except Exception as e:  # noqa: BLE001 - reported to the parent
        errors.put(f"{type(e).__name__}: {e}")


def test_a_fresh_database_opened_by_four_processes_at_once_never_fails(tmp_path):
    """A run's ranks open the run's new database together: one creates it, the others wait
    (without the lock, 3 of 240 opens failed with "database is locked")."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    errors = ctx.Queue()
    for attempt in range(30):
        path = str(tmp_path / f"fresh{attempt}.db")
        barrier = ctx.Barrier(4)
        procs = [ctx.Process(target=_open_at_once, args=(path, barrier, errors)) for _ in range(4)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=60)
            assert p.exitcode == 0
    assert errors.empty(), errors.get()


def test_find_verdict_answers_for_the_key_and_the_reuse_rule_drops_task_errors(tmp_path: Path) -> None:
    task = Task(name="t", source="# t\n")
    key = JudgedKey.of(task, "h-x", DEFAULT_FP)
    with Database(tmp_path / "k.db") as db:
        db.upsert_task(name="t", source=task.source, identity_hash=task.identity_hash, level=None, size="small")
        broken = _add(db, "t", "x", Status.TASK_ERROR)
        known = db.find_verdict(key)
        assert known is not None and known.candidate_id == broken and judged_before(db, key) is None
        # the key's task source must be the one the verdict was judged against
        assert db.find_verdict(JudgedKey.of(Task(name="t", source="# other\n"), "h-x", DEFAULT_FP)) is None

    with Database(tmp_path / "k2.db") as db:
        db.upsert_task(name="t", source=task.source, identity_hash=task.identity_hash, level=None, size="small")
        judged = _add(db, "t", "x", Status.CORRECT, 2.0)
        known = judged_before(db, key)
        assert known is not None and known.candidate_id == judged and known.result.speedup == 2.0


def test_a_verdict_stored_at_one_presets_shapes_does_not_answer_for_another(tmp_path: Path) -> None:
    small = Task(name="t", source="# t\n", presets={"small": {"batch_size": 4}})
    larger = Task(name="t", source="# t\n", presets={"small": {"batch_size": 64}})
    with Database(tmp_path / "p.db") as db:
        db.register_task(small, size="small")  # under its identity hash: the source and its presets
        judged = _add(db, "t", "x", Status.CORRECT, 2.0)
        found = judged_before(db, JudgedKey.of(small, "h-x", DEFAULT_FP))
        assert found is not None and found.candidate_id == judged
        assert judged_before(db, JudgedKey.of(larger, "h-x", DEFAULT_FP)) is None
        # the run moves to the other presets (a search upserts its tasks at start): the old verdict is not reused
        db.register_task(larger, size="small")
        assert judged_before(db, JudgedKey.of(larger, "h-x", DEFAULT_FP)) is None


def test_an_answer_without_code_is_stored_as_no_code_and_old_rows_read_the_same(tmp_path: Path) -> None:
    with Database(tmp_path / "k.db") as db:
        new = db.add_candidate(NewCandidate(task="t", hash=NO_CODE_HASH, source=""))
        db.store_result(new.id, EvalResult.no_code("t", device="cpu", size="small", policy="open"))
        old = db.add_candidate(NewCandidate(task="t", hash=NO_CODE_HASH, source=""))
        # what versions before the `no_code` status stored for an answer without code
        db.store_result(old.id, EvalResult(task="t", status=Status.COMPILE_ERROR, message=NO_CODE_MESSAGE,
                                           candidate_hash=NO_CODE_HASH))
        assert [db.get_candidate(i).result.status for i in (new.id, old.id)] == [Status.NO_CODE] * 2
        assert db.get_candidate(old.id).result.message == NO_CODE_MESSAGE
    conn = sqlite3.connect(tmp_path / "k.db")
    assert [r[0] for r in conn.execute("SELECT status FROM results ORDER BY candidate_id")] == [
        "no_code", "compile_error"]
    conn.close()
    # a real compile error keeps its name
    built = EvalResult.from_dict(EvalResult(task="t", status=Status.COMPILE_ERROR, message="does not build").to_dict())
    assert built.status is Status.COMPILE_ERROR
