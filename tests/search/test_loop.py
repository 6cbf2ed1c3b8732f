"""The search loop against a scripted proposer and evaluator: chains, exchange, budgets, dedup, resume."""

from __future__ import annotations

import io
import itertools
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console

from judge_fixtures import OneAtATime
from kernelrl.candidate import Candidate
from kernelrl.judge.evaluator import EvalConfig
from kernelrl.result import EvalResult, Finding, Status, TimingStats
from kernelrl.run_parts import build_run
from kernelrl.search.loop import SearchConfig, StopReason, run_search
from kernelrl.store import CandidateState, Database, RunStatus
from kernelrl.tasks.sizes import instantiate
from kernelrl.tasks.task import Task
from openai_server import Reply
from proposer_fixtures import load_program, openai_proposer
from run_fixtures import searched

_TASK_SRC = textwrap.dedent("""
    import torch
    class Model(torch.nn.Module):
        def forward(self, x):
            return x + 1
    N = 8
    def get_inputs():
        return [torch.ones(N)]
    def get_init_inputs():
        return []
""")


def _tasks(*names: str) -> list[Task]:
    return [Task(name=n, source=_TASK_SRC + f"# {n}\n") for n in names]


@dataclass
class Answer:
    answer: str
    code: str | None
    prompt_tokens: int = 10
    completion_tokens: int = 20
    meta: dict[str, Any] = field(default_factory=dict)


def parent_speed(req: Any) -> float:
    """The scripted speed of the chain's current best (its source), 1.0 for the reference."""
    if req.parent is None:
        return 1.0
    assert isinstance(req.parent, str)
    return float(re.search(r"SPEED = (\S+)", req.parent).group(1))


def _code(speed: float, tag: str) -> str:
    return f"# {tag}\nSPEED = {speed!r}\nclass ModelNew:\n    pass\n"


class ScriptedProposer:
    """Each answer is 0.5x faster than the parent it was asked to improve (1.0 from the reference)."""

    def __init__(self, speed_fn=None, tokens: int = 10) -> None:
        self.requests: list[Any] = []
        self.lock = threading.Lock()
        self.speed_fn = speed_fn or (lambda req: parent_speed(req) + 0.5)
        self.tokens = tokens

    def propose(self, req: Any) -> Answer:
        with self.lock:
            self.requests.append(req)
        speed = self.speed_fn(req)
        code = _code(speed, f"{req.task.name} c{req.chain} s{req.step}")
        return Answer(answer=f"analysis\n```python\n{code}```\n", code=None, prompt_tokens=self.tokens,
                      completion_tokens=self.tokens)


class ScriptedEvaluator:
    """Correct with speedup SPEED; SPEED < 0 is incorrect; a HACK marker is flagged."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.calls: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self.delay_s = delay_s

    def __call__(self, task: Task, cand: Candidate) -> EvalResult:
        with self.lock:
            self.calls.append((task.name, cand.hash))
        time.sleep(self.delay_s)
        return scripted_result(task, cand)


def scripted_result(task: Task, cand: Candidate) -> EvalResult:
    if "HACK" in cand.source:
        return EvalResult(task=task.name, status=Status.FLAGGED, candidate_hash=cand.hash,
                          findings=[Finding(rule="cached_output", message="same tensor every call")])
    speed = float(re.search(r"SPEED = (\S+)", cand.source).group(1))
    if speed < 0:
        return EvalResult(task=task.name, status=Status.INCORRECT, candidate_hash=cand.hash)
    t = TimingStats(median_ms=1.0 / speed, mean_ms=1.0 / speed, min_ms=1.0 / speed, iqr_ms=0.0, n=3)
    return EvalResult(task=task.name, status=Status.CORRECT, speedup=speed, cand_time=t, candidate_hash=cand.hash)


def fake_prompt(task: Task, *, db: Database, chain_best, policy: str, device: str, rng, k: int, size: str) -> str:
    shown = db.top_candidates(task.name, k)
    best = f"{chain_best.speedup:.2f}x" if chain_best else "reference"
    return f"improve {task.name} from {best}; shown " + ", ".join(f"{c.speedup:.2f}x" for c in shown)


def _run(tmp_path: Path, tasks: list[Task], proposer, evaluate, **kw):
    cfg = SearchConfig(tasks=tuple(t.name for t in tasks), db_path=tmp_path / "k.db", proposer="scripted",
                       **{"budget": 6, "chains": 2, **kw})
    console = Console(file=io.StringIO(), width=120)
    return searched(cfg, console=console, tasks=tasks, proposer=proposer, judge=OneAtATime(evaluate),
                    build_prompt=fake_prompt), cfg


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="budget"):
        SearchConfig(tasks=("t",), db_path=Path("x.db"), budget=0)
    with pytest.raises(ValueError, match="policy"):
        SearchConfig(tasks=("t",), db_path=Path("x.db"), eval=EvalConfig(policy="lenient"))
    with pytest.raises(ValueError, match="no tasks"):
        SearchConfig(tasks=(), db_path=Path("x.db"))


def test_chains_improve_and_store_everything(tmp_path: Path) -> None:
    proposer, evaluate = ScriptedProposer(), ScriptedEvaluator()
    summary, cfg = _run(tmp_path, _tasks("a", "b"), proposer, evaluate, exchange_every=0)
    assert summary.stop_reason is StopReason.BUDGET
    with Database(cfg.db_path) as db:
        run = db.get_run(summary.run_id)
        assert run is not None and run.status is RunStatus.FINISHED
        for name in ("a", "b"):
            cands = db.candidates(task=name)
            assert len(cands) == 6 and all(c.state is CandidateState.EVALUATED for c in cands)
            assert {c.chain for c in cands} == {0, 1}
            for chain in (0, 1):
                own = sorted((c for c in cands if c.chain == chain), key=lambda c: c.step)
                assert [c.step for c in own] == list(range(len(own)))
                # a chain's step improves on its own best: parent is the previous step, +0.5 each time
                assert own[0].parents == () and "from reference" in own[0].prompt
                for prev, cur in itertools.pairwise(own):
                    assert cur.parents == (prev.id,)
                    assert f"from {prev.speedup:.2f}x" in cur.prompt
                    assert cur.speedup == pytest.approx(prev.speedup + 0.5)
                assert all(c.answer.startswith("analysis") and c.prompt_tokens == 10 for c in own)
            best = max(c.speedup for c in cands)
            assert next(t for t in summary.tasks if t.task == name).best_speedup == best
    assert summary.evaluations == 12 and summary.reused == 0
    assert (summary.prompt_tokens, summary.completion_tokens) == (120, 120)


def test_exchange_lets_a_weak_chain_adopt_the_best(tmp_path: Path) -> None:
    # chain 0 writes ever faster code, chain 1 only wrong code (from the reference)
    def speed(req):
        if req.chain == 1 and req.parent is None:
            return -1.0
        return parent_speed(req) + 1.0

    for every, adopts in ((1, True), (0, False)):
        proposer = ScriptedProposer(speed)
        d = tmp_path / f"x{every}"
        d.mkdir()
        _run(d, _tasks("a"), proposer, ScriptedEvaluator(), budget=8, exchange_every=every, model_concurrency=1)
        with Database(d / "k.db") as db:
            cands = {c.id: c for c in db.candidates(task="a")}
        chain1 = [c for c in cands.values() if c.chain == 1]
        from_chain0 = [c for c in chain1 if c.parents and cands[c.parents[0]].chain == 0]
        assert bool(from_chain0) is adopts
        if adopts:  # after adopting, chain 1 improves on chain 0's code
            assert any(c.is_correct for c in chain1)


def test_same_source_is_evaluated_once(tmp_path: Path) -> None:
    proposer = ScriptedProposer(lambda req: 2.0)  # ...but the tag differs: make the code identical
    proposer.propose = lambda req: Answer(answer="```python\n" + _code(2.0, "same") + "```", code=None)  # type: ignore
    evaluate = ScriptedEvaluator(delay_s=0.05)
    summary, cfg = _run(tmp_path, _tasks("a", "b"), proposer, evaluate, budget=5, chains=3)
    assert sorted(t for t, _ in evaluate.calls) == ["a", "b"]  # once per task, not once per candidate
    assert summary.evaluations == 2 and summary.reused == 8
    with Database(cfg.db_path) as db:
        cands = db.candidates()
        assert len(cands) == 10 and all(c.result is not None and c.result.speedup == 2.0 for c in cands)
    # a later run on the same database reuses the stored results
    evaluate2 = ScriptedEvaluator()
    summary2, _ = _run(tmp_path, _tasks("a"), proposer, evaluate2, budget=2)
    assert evaluate2.calls == [] and summary2.reused == 2


def test_token_budget_stops_new_calls(tmp_path: Path) -> None:
    proposer = ScriptedProposer(tokens=50)  # 100 tokens per answer
    summary, cfg = _run(tmp_path, _tasks("a"), proposer, ScriptedEvaluator(), budget=20, chains=1, token_budget=250)
    assert summary.stop_reason is StopReason.TOKENS
    assert len(proposer.requests) == 3  # 300 >= 250 after the third answer
    with Database(cfg.db_path) as db:
        assert db.count_candidates() == 3 and db.token_totals() == (150, 150)


def test_wall_time_stops_early(tmp_path: Path) -> None:
    summary, _cfg = _run(tmp_path, _tasks("a"), ScriptedProposer(), ScriptedEvaluator(delay_s=0.3), budget=50,
                        chains=1, wall_time_s=0.5)
    assert summary.stop_reason is StopReason.WALL_TIME
    assert 1 <= summary.tasks[0].candidates < 5
    assert summary.tasks[0].evaluated == summary.tasks[0].candidates  # under way work finished


def test_answer_without_code_and_failing_proposer(tmp_path: Path) -> None:
    class NoCode:
        def propose(self, req):
            return Answer(answer="I think it is already optimal.", code=None)

    evaluate = ScriptedEvaluator()
    summary, cfg = _run(tmp_path, _tasks("a"), NoCode(), evaluate, budget=2, chains=1)
    assert evaluate.calls == []
    with Database(cfg.db_path) as db:
        assert [c.result.status for c in db.candidates()] == [Status.NO_CODE] * 2

    class Broken:
        def propose(self, req):
            raise ConnectionError("no route to model")

    d = tmp_path / "broken"
    d.mkdir()
    summary, _ = _run(d, _tasks("a"), Broken(), evaluate, budget=10, chains=1)
    assert summary.tasks[0].gave_up and summary.tasks[0].candidates == 0
    assert len(summary.errors) == 3 and "no route to model" in summary.errors[0]


def test_baselines_measured_once(tmp_path: Path) -> None:
    calls = []

    @dataclass
    class B:
        eager_ms: float
        compile_ms: float | None

    def baseline(task):
        calls.append(task.name)
        time.sleep(0.2)
        return B(eager_ms=2.0, compile_ms=1.0)

    def prompt(task, *, db, **kw):
        # the first prompt of a task is built after its baseline is stored
        assert db.get_baseline(task.name, "cpu", "small") is not None
        return fake_prompt(task, db=db, **kw)

    cfg = SearchConfig(tasks=("a", "b"), db_path=tmp_path / "k.db", budget=1, chains=1)
    for _ in range(2):
        searched(cfg, tasks=_tasks("a", "b"), proposer=ScriptedProposer(), judge=OneAtATime(ScriptedEvaluator()),
                 build_prompt=prompt, measure_baseline=baseline)
    assert sorted(calls) == ["a", "b"]
    with Database(cfg.db_path) as db:
        assert [(b.task, b.eager_ms, b.compile_ms) for b in db.baselines()] == [("a", 2.0, 1.0), ("b", 2.0, 1.0)]


# A run of the loop in its own process, logging every proposer and evaluator call to marker files
# (one line per call, appended and flushed before the call returns).
_RUNNER = textwrap.dedent("""
    import io, os, sys, time
    sys.path[:0] = [os.path.dirname(sys.argv[1]), os.path.dirname(os.path.dirname(sys.argv[1]))]
    from kernelrl.search.loop import SearchConfig
    from run_fixtures import searched
    import test_loop as T

    db, markers, resume, budget = sys.argv[2], sys.argv[3], sys.argv[4] == "1", int(sys.argv[5])
    delay = float(sys.argv[6]) if len(sys.argv) > 6 else 0.25

    def mark(kind, text):
        with open(os.path.join(markers, kind), "a") as f:
            f.write(text + "\\n")
            f.flush()

    class P(T.ScriptedProposer):
        def propose(self, req):
            out = super().propose(req)
            mark("propose", f"{req.task.name} {req.chain} {req.step}")
            return out

    def evaluate(task, cand):
        mark("evaluate", f"{task.name} {cand.hash}")
        time.sleep(delay)
        return T.scripted_result(task, cand)

    cfg = SearchConfig(tasks=("a", "b"), db_path=db, budget=budget, chains=2, resume=resume,
                       exchange_every=2)
    searched(cfg, tasks=T._tasks("a", "b"), proposer=P(), judge=T.OneAtATime(evaluate), build_prompt=T.fake_prompt)
""")


def _pending(db_path: Path) -> bool:
    try:
        with Database(db_path, readonly=True) as db:
            return any(c.state is CandidateState.PROPOSED for c in db.candidates())
    except Exception:  # noqa: BLE001 - the file is being created
        return False


def _evaluated_hashes(db_path: Path) -> set[tuple[str, str]]:
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        return {(t, h) for t, h in conn.execute("SELECT task, hash FROM results WHERE reused_from IS NULL")}
    except sqlite3.OperationalError:  # the runner has created the file but not its tables yet
        return set()
    finally:
        conn.close()


def test_resume_after_sigkill_loses_nothing_and_repeats_nothing(tmp_path: Path) -> None:
    db_path = tmp_path / "k.db"
    first, second = tmp_path / "m1", tmp_path / "m2"
    first.mkdir()
    second.mkdir()
    script = tmp_path / "runner.py"
    script.write_text(_RUNNER)
    here = str(Path(__file__))
    budget = 8
    proc = subprocess.Popen([sys.executable, str(script), here, str(db_path), str(first), "0", str(budget)])
    deadline = time.time() + 60
    while time.time() < deadline:
        # mid-run: some verdicts stored, and answers stored that wait for theirs
        if db_path.exists() and len(_evaluated_hashes(db_path)) >= 4 and _pending(db_path):
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()

    done_before = _evaluated_hashes(db_path)
    with Database(db_path) as db:
        stored_before = db.candidates()
        pending_before = [c for c in stored_before if c.state is CandidateState.PROPOSED]
        assert db.latest_run().status is RunStatus.RUNNING  # killed, never finished
    assert len(done_before) >= 4
    assert pending_before, "the kill should leave stored answers waiting for evaluation"
    assert len(stored_before) < 2 * budget

    subprocess.run([sys.executable, str(script), here, str(db_path), str(second), "1", str(budget)], check=True,
                   timeout=120)

    def lines(d: Path, kind: str) -> list[str]:
        p = d / kind
        return p.read_text().splitlines() if p.exists() else []

    with Database(db_path) as db:
        cands = db.candidates()
        assert len(db.runs()) == 1 and db.latest_run().status is RunStatus.FINISHED
    # nothing lost: every stored candidate of the first process is still there, now evaluated
    assert {c.id for c in stored_before} <= {c.id for c in cands}
    assert all(c.state is CandidateState.EVALUATED for c in cands)
    assert {c.task: 0 for c in cands}.keys() == {"a", "b"}
    for task in ("a", "b"):
        assert sum(c.task == task for c in cands) == budget
    # no step twice on one chain (chain state was rebuilt, not restarted)
    keys = [(c.task, c.chain, c.step) for c in cands]
    assert len(keys) == len(set(keys))
    # nothing evaluated twice: what the first process stored was not evaluated again
    resumed_evals = lines(second, "evaluate")
    assert not {tuple(x.split()) for x in resumed_evals} & done_before
    assert len(resumed_evals) == len(set(resumed_evals))
    # answers stored before the kill were evaluated without asking the model again
    assert {(c.task, c.hash) for c in pending_before} <= {tuple(x.split()) for x in resumed_evals}
    assert len(lines(second, "propose")) == len(cands) - len(stored_before)


def test_ctrl_c_finishes_work_under_way_and_stops(tmp_path: Path) -> None:
    db_path = tmp_path / "k.db"
    (tmp_path / "m").mkdir()
    script = tmp_path / "runner.py"
    script.write_text(_RUNNER)
    proc = subprocess.Popen([sys.executable, str(script), str(Path(__file__)), str(db_path), str(tmp_path / "m"),
                             "0", "40"])
    deadline = time.time() + 60
    while time.time() < deadline:
        if db_path.exists() and len(_evaluated_hashes(db_path)) >= 2:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 0
    with Database(db_path) as db:
        cands = db.candidates()
        assert db.latest_run().status is RunStatus.INTERRUPTED
    assert 2 <= len(cands) < 80
    assert all(c.state is CandidateState.EVALUATED for c in cands)  # no answer left half done


def test_finite_proposer_ends_chains_quietly(tmp_path: Path) -> None:
    from kernelrl.proposers import Exhausted

    class ThreeOnly(ScriptedProposer):
        def propose(self, req):
            with self.lock:
                if len(self.requests) >= 3:
                    raise Exhausted("nothing left")
            return super().propose(req)

    summary, _cfg = _run(tmp_path, _tasks("a"), ThreeOnly(), ScriptedEvaluator(), budget=10, chains=2)
    assert summary.tasks[0].candidates == 3 and summary.errors == ()
    assert summary.stop_reason is StopReason.BUDGET and "exhausted" in summary.tasks[0].gave_up


def test_real_prompt_builder_and_heuristic_proposer(tmp_path: Path) -> None:
    """The shipped prompt builder and offline proposer, with a scripted verdict per rewrite."""
    from kernelrl.tasks.suites import load_task

    task = load_task("level1/softmax")

    def evaluate(t: Task, cand: Candidate) -> EvalResult:
        speed = 1.0 + int(cand.hash[:4], 16) % 200 / 100  # a fixed, source-dependent score
        return EvalResult(task=t.name, status=Status.CORRECT, speedup=speed, candidate_hash=cand.hash)

    cfg = SearchConfig(tasks=(task.name,), db_path=tmp_path / "k.db", proposer="heuristic", budget=6, chains=2)
    summary = searched(cfg, tasks=[task], judge=OneAtATime(evaluate))
    assert summary.tasks[0].candidates >= 2 and summary.errors == ()
    with Database(cfg.db_path) as db:
        cands = db.candidates()
    assert len({c.hash for c in cands}) == len(cands)  # the portfolio never repeats a rewrite
    later = [c for c in cands if c.parents]
    assert later, "a chain's second step improves on its best"
    for c in later:
        parent = next(p for p in cands if p.id == c.parents[0])
        # the prompt shows the chain's best with its measured speedup
        assert f"speedup {parent.speedup:.2f}x" in c.prompt


def test_scripted_openai_endpoint_three_tasks_two_chains_four_steps(tmp_path: Path) -> None:
    """The issue's acceptance run against a real HTTP server speaking the OpenAI chat API."""
    from kernelrl.tasks.suites import load_task
    from openai_server import OpenAIServer, Reply

    tasks = [load_task(n) for n in ("level1/softmax", "level1/rmsnorm", "level1/scaled_residual_add")]

    def evaluate(t: Task, cand: Candidate) -> EvalResult:
        speed = 0.5 + int(cand.hash[:4], 16) % 300 / 100  # fixed per source, between 0.5x and 3.5x
        return EvalResult(task=t.name, status=Status.CORRECT, speedup=speed, candidate_hash=cand.hash)

    with OpenAIServer() as server:
        # a rate limit and a malformed answer first: retried, and stored as a failed candidate
        server.add(Reply.error(429, retry_after_s=0.01), Reply.ok("I would rather not write code today."))
        cfg = SearchConfig(tasks=tuple(t.name for t in tasks), db_path=tmp_path / "k.db",
                           proposer="openai:scripted-model", budget=8, chains=2, exchange_every=2,
                           proposer_opts={"base_url": server.base_url, "api_key": "k", "backoff_initial_s": 0.01,
                                          "timeout_s": 20.0})
        summary = searched(cfg, tasks=tasks, judge=OneAtATime(evaluate))
        prompts = server.prompts() if callable(server.prompts) else server.prompts
    assert summary.errors == () and [t.candidates for t in summary.tasks] == [8, 8, 8]
    with Database(cfg.db_path) as db:
        cands = db.candidates()
    assert len(cands) == 24 and all(c.state is CandidateState.EVALUATED for c in cands)
    assert sum(c.result.status is Status.NO_CODE for c in cands) == 1  # the malformed answer, kept
    assert all(c.answer for c in cands) and all(c.prompt in prompts for c in cands)
    assert summary.prompt_tokens == sum(c.prompt_tokens for c in cands) > 0
    for t in tasks:
        own = [c for c in cands if c.task == t.name]
        for chain in (0, 1):
            steps = sorted((c for c in own if c.chain == chain), key=lambda c: c.step)
            assert [c.step for c in steps] == [0, 1, 2, 3]  # the budget of 8 is 4 steps per chain
            for c in steps[1:]:
                best = next(p for p in own if p.id == c.parents[0]) if c.parents else None
                if best is None:  # chain had no correct version yet (the malformed answer)
                    continue
                # earlier code is in the prompt, with its measured speedup
                assert best.source.strip().splitlines()[0] in c.prompt
                assert f"speedup {best.speedup:.2f}x" in c.prompt


def test_second_ctrl_c_leaves_at_once_and_resume_finishes(tmp_path: Path) -> None:
    db_path = tmp_path / "k.db"
    (tmp_path / "m").mkdir()
    script = tmp_path / "runner.py"
    script.write_text(_RUNNER)
    args = [sys.executable, str(script), str(Path(__file__)), str(db_path), str(tmp_path / "m")]
    proc = subprocess.Popen(args + ["0", "4", "30"])  # evaluations of 30 s each
    deadline = time.time() + 60
    while time.time() < deadline and not (tmp_path / "m" / "evaluate").exists():
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    start = time.time()
    assert proc.wait(timeout=20) == 0 and time.time() - start < 10
    with Database(db_path) as db:
        assert db.latest_run().status is RunStatus.INTERRUPTED
        pending = db.pending_candidates()
    assert pending  # answers kept, evaluation left for the resume
    subprocess.run(args + ["1", "4", "0"], check=True, timeout=120)
    with Database(db_path) as db:
        assert all(c.state is CandidateState.EVALUATED for c in db.candidates())
        assert {c.id for c in pending} <= {c.id for c in db.candidates()}


def test_failed_baseline_is_reported_and_the_task_goes_on(tmp_path: Path) -> None:
    def baseline(task):
        raise RuntimeError("reference does not run")

    cfg = SearchConfig(tasks=("a",), db_path=tmp_path / "k.db", budget=2, chains=1)
    summary = searched(cfg, tasks=_tasks("a"), proposer=ScriptedProposer(), judge=OneAtATime(ScriptedEvaluator()),
                       build_prompt=fake_prompt, measure_baseline=baseline)
    assert summary.tasks[0].candidates == 2 and "reference does not run" in summary.errors[0]
    with Database(cfg.db_path) as db:
        assert db.baselines() == []


# ---------------------------------------------------------------------------------------------
# The search loop against the scripted server


def test_search_against_scripted_server_stores_every_answer(openai_server, tmp_path):
    """3 tasks x 2 chains x 4 steps through the real prompt builder and the openai proposer."""
    from kernelrl.result import EvalResult, Status
    from kernelrl.search.loop import SearchConfig
    from kernelrl.store import Database
    from kernelrl.tasks.suites import load_task

    tasks = [load_task(n) for n in ("level1/softmax", "level1/rmsnorm", "level1/scaled_residual_add")]
    openai_server.add(Reply.error(429, retry_after_s=0), Reply.error(500))  # first calls retried
    answers: list[str] = []
    respond = openai_server.responder

    def recording_responder(body):
        reply = respond(body)
        answers.append(reply.content)
        return reply

    openai_server.responder = recording_responder

    modules = {t.name: instantiate(t, "small") for t in tasks}

    def evaluate(task, cand):
        # Run the program once against the reference (it must really be correct), then give a
        # fixed, source-dependent speedup so the chains have something to compare.
        tm = modules[task.name]
        mod = load_program(cand.source)
        torch.manual_seed(0)
        ref = tm.Model(*tm.get_init_inputs())
        torch.manual_seed(0)
        new = mod.ModelNew(*tm.get_init_inputs())
        x = tm.get_inputs()
        torch.testing.assert_close(new(*x), ref(*x))
        speed = 0.5 + int(cand.hash[:4], 16) % 300 / 100
        return EvalResult(task=task.name, status=Status.CORRECT, speedup=speed, candidate_hash=cand.hash)

    proposer = openai_proposer(openai_server, concurrency=2)
    cfg = SearchConfig(tasks=tuple(t.name for t in tasks), db_path=tmp_path / "k.db", proposer=proposer.spec,
                       budget=8, chains=2, model_concurrency=2)
    summary = searched(cfg, tasks=tasks, proposer=proposer, judge=OneAtATime(evaluate))
    assert summary.errors == ()
    assert [t.candidates for t in summary.tasks] == [8, 8, 8]
    assert len(openai_server.requests) == 24 + 2
    with Database(cfg.db_path) as db:
        cands = db.candidates()
        tokens = db.token_totals()
    assert len(cands) == 24 and all(c.result is not None and c.result.status is Status.CORRECT for c in cands)
    assert sorted(c.answer for c in cands) == sorted(answers)  # every answer stored, as sent
    assert {c.prompt for c in cands} == set(openai_server.prompts())  # and the prompt it answered
    assert tokens == (proposer.usage.prompt_tokens, proposer.usage.completion_tokens)
    for c in cands:
        if c.step == 0:
            continue
        parent = next(p for p in cands if p.id == c.parents[0])
        # every later prompt holds earlier code with its measured speedup, the chain's best marked
        assert f"speedup {parent.speedup:.2f}x" in c.prompt and "current best of this chain" in c.prompt


@pytest.mark.slow
def test_search_against_scripted_server_with_the_real_evaluator(openai_server, tmp_path):
    """The same 3 x 2 x 4 run, every answer judged by the evaluator (minutes on two cores)."""
    from kernelrl.result import Status
    from kernelrl.search.loop import SearchConfig
    from kernelrl.store import Database

    names = ("level1/softmax", "level1/rmsnorm", "level1/scaled_residual_add")
    proposer = openai_proposer(openai_server, concurrency=2)
    cfg = SearchConfig(tasks=names, db_path=tmp_path / "k.db", proposer=proposer.spec, budget=8, chains=2,
                       baselines=False)
    from kernelrl.tasks.suites import load_tasks

    summary = searched(cfg, tasks=load_tasks(list(names)), proposer=proposer)
    assert summary.errors == () and [t.candidates for t in summary.tasks] == [8, 8, 8]
    with Database(cfg.db_path) as db:
        cands = db.candidates()
    assert len(cands) == 24 and all(c.result is not None for c in cands)
    assert all(c.result.status is Status.CORRECT for c in cands), [c.result.message for c in cands]
    for c in cands:
        if c.step > 0:
            parent = next(p for p in cands if p.id == c.parents[0])
            assert f"speedup {parent.speedup:.2f}x" in c.prompt


def test_the_run_page_shows_the_search_while_it_goes(tmp_path: Path) -> None:
    """`optimize --watch.port`: the run's own page, read from inside the judge, shows this run running."""
    import json
    import urllib.request

    from kernelrl.web.config import WatchConfig

    console = Console(file=io.StringIO(), width=200)
    seen: list[list[tuple[str, int]]] = []

    class PageReading(OneAtATime):
        def evaluate_batch(self, items):
            url = re.search(r"run page: (\S+)", console.file.getvalue()).group(1)
            with urllib.request.urlopen(url + "api/runs", timeout=10) as reply:
                seen.append([(r["status"], r["candidates"]) for r in json.loads(reply.read())["runs"]])
            return super().evaluate_batch(items)

    cfg = SearchConfig(tasks=("a",), db_path=tmp_path / "k.db", budget=2, chains=1, baselines=False,
                       watch=WatchConfig(port=0))
    summary = searched(cfg, tasks=_tasks("a"), proposer=ScriptedProposer(), judge=PageReading(ScriptedEvaluator()),
                       build_prompt=fake_prompt, console=console)
    assert summary.evaluations == 2
    assert seen == [[("running", 1)], [("running", 2)]]  # each candidate stored and shown before its verdict


def test_a_search_refuses_tasks_its_database_does_not_hold(tmp_path: Path) -> None:
    """The run's builder registers the tasks; a database without them (or with another source) is refused."""
    cfg = SearchConfig(tasks=("a",), db_path=tmp_path / "k.db", budget=1, chains=1, baselines=False)

    def search(tasks: list[Task]) -> None:
        with build_run(tasks=tasks, eval_config=cfg.judge_config(), db_path=cfg.db_path, register_tasks=False,
                       judge=OneAtATime(ScriptedEvaluator()), proposers={cfg.proposer: ScriptedProposer()},
                       record={"task_names": [t.name for t in tasks]}) as run:
            run_search(cfg, run)

    with pytest.raises(ValueError, match=r"not registered .*: a; "):
        search(_tasks("a"))
    other = _tasks("a")[0]
    with Database(cfg.db_path) as db:
        db.upsert_task(name="a", source=other.source + "\n# changed\n", identity_hash="another", level=None,
                       size=cfg.eval.size)
    with pytest.raises(ValueError, match="not registered"):
        search([other])
    with Database(cfg.db_path) as db:
        assert db.runs() == []  # refused before a run row is written


def test_resume_continues_the_latest_search_not_a_later_bench_in_the_same_file(tmp_path: Path) -> None:
    cfg = SearchConfig(tasks=("a",), db_path=tmp_path / "k.db", budget=1, chains=1, baselines=False)
    first = searched(cfg, tasks=_tasks("a"), proposer=ScriptedProposer(), judge=OneAtATime(ScriptedEvaluator()),
                     build_prompt=fake_prompt)
    with Database(cfg.db_path) as db:
        bench = db.start_run({"stage": "bench", "proposer": "bench:x"})
        db.finish_run(bench, RunStatus.FINISHED)
    resumed = searched(SearchConfig(tasks=("a",), db_path=cfg.db_path, budget=2, chains=1, baselines=False,
                                    resume=True),
                       tasks=_tasks("a"), proposer=ScriptedProposer(), judge=OneAtATime(ScriptedEvaluator()),
                       build_prompt=fake_prompt)
    assert resumed.run_id == first.run_id != bench
    with Database(cfg.db_path) as db:
        assert [(r.id, r.config.get("stage")) for r in db.runs()] == [(first.run_id, None), (bench, "bench")]
        assert db.get_run(bench).status is RunStatus.FINISHED  # untouched


def test_a_tasks_baseline_is_stored_with_its_first_verdict_not_when_the_batch_returns(tmp_path: Path) -> None:
    """The judge measures a task's eager and torch.compile times in its first group and hands each
    verdict over as it is final: the baseline is in the database while the batch still runs, so
    the run page shows speedups against torch.compile during the run, not only after it."""
    from kernelrl.judge.timing.baseline import Baseline

    stored_mid_batch: list[bool] = []

    class Streaming:
        fingerprint = "f"

        def __init__(self, db_path: Path) -> None:
            self.db_path = db_path
            self.measured: set[str] = set()

        def evaluate_batch(self, items, *, on_result=None):
            out = []
            for i, (task, cand) in enumerate(items):
                self.measured.add(task.name)
                result = scripted_result(task, cand if isinstance(cand, Candidate) else Candidate(source=cand))
                out.append(result)
                if on_result is not None:
                    on_result(i, result)
                    deadline = time.monotonic() + 5
                    while time.monotonic() < deadline:  # the loop stores it on its own thread
                        with Database(self.db_path, readonly=True) as db:
                            if db.get_baseline(task.name, "cpu", "small") is not None:
                                break
                        time.sleep(0.05)
                    with Database(self.db_path, readonly=True) as db:
                        stored_mid_batch.append(db.get_baseline(task.name, "cpu", "small") is not None)
            return out

        def profile(self, task):
            return None

        def cached_baseline(self, task):
            if task.name not in self.measured:
                return None
            return Baseline(task=task.name, device="cpu", size="small", eager_ms=2.0, compile_ms=1.0)

        def peaks(self):
            return None

    cfg = SearchConfig(tasks=("a", "b"), db_path=tmp_path / "k.db", budget=1, chains=1, baselines=False)
    searched(cfg, tasks=_tasks("a", "b"), proposer=ScriptedProposer(), judge=Streaming(cfg.db_path),
             build_prompt=fake_prompt)
    assert stored_mid_batch and all(stored_mid_batch)
