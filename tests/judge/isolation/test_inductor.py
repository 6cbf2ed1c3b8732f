"""torch.compile's per-worker repeats done once: the ISA check's answer and the worker's inductor env."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernelrl.judge.isolation import inductor
from kernelrl.judge.isolation.sandbox import SandboxConfig, worker_env

FOUND = {"checked": [["avx512", True], ["avx2", True]], "forced": [["avx512", True], ["avx2", True]]}


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    # what this process verified is process-wide: each test starts with nothing verified
    monkeypatch.setattr(inductor, "_verified", set())


def test_passes_only_when_skipping_the_check_changes_nothing() -> None:
    assert inductor.passes(FOUND)
    # the compiler could not build AVX512: trusting the CPU's flags would pick it anyway
    assert not inductor.passes({"checked": [["avx2", True]], "forced": FOUND["forced"]})
    # an ISA listed without its check (aarch64's NEON) that does not vectorise when checked
    assert not inductor.passes({"checked": [["asimd", False]], "forced": [["asimd", True]]})
    assert not inductor.passes({"checked": [], "forced": []})
    assert not inductor.passes({})


def test_worker_env_turns_off_the_precompiled_header_and_trusts_isas_only_once_verified(tmp_path: Path) -> None:
    env = worker_env(SandboxConfig(), tmp_path)
    assert env["TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS"] == "0"
    assert env["TORCHINDUCTOR_COMPILE_THREADS"] == "1"
    assert inductor.VEC_ISA_OK_ENV not in env
    inductor._verified.add("k")
    assert worker_env(SandboxConfig(), tmp_path)[inductor.VEC_ISA_OK_ENV] == "1"


def test_a_stored_answer_is_used_without_probing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inductor, "toolchain_key", lambda env: "key-1")
    monkeypatch.setattr(inductor, "_probe", lambda env: pytest.fail("probed although the answer was stored"))
    (tmp_path / inductor.RECORD).write_text(json.dumps({"key": "key-1", "ok": True, **FOUND}))
    assert inductor.check_vec_isa(tmp_path, {})
    assert inductor.inductor_env()[inductor.VEC_ISA_OK_ENV] == "1"


@pytest.mark.parametrize("stored", [{"key": "other", "ok": True}, {"key": "key-1", "ok": False}, "not json"])
def test_an_answer_for_another_toolchain_or_a_failed_one_is_not_trusted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                          stored: object) -> None:
    monkeypatch.setattr(inductor, "toolchain_key", lambda env: "key-1")
    probed: list[int] = []

    def probe(env: dict[str, str]) -> dict[str, list[list[object]]]:
        probed.append(1)
        return {"checked": [["avx2", True]], "forced": FOUND["forced"]}  # the check would pick less

    monkeypatch.setattr(inductor, "_probe", probe)
    (tmp_path / inductor.RECORD).write_text(stored if isinstance(stored, str) else json.dumps(stored))
    assert not inductor.check_vec_isa(tmp_path, {})
    assert probed == [1]
    assert inductor.VEC_ISA_OK_ENV not in inductor.inductor_env()
    assert json.loads((tmp_path / inductor.RECORD).read_text())["ok"] is False


def test_a_probe_that_fails_sets_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inductor, "toolchain_key", lambda env: "key-1")
    monkeypatch.setattr(inductor, "_probe", lambda env: None)
    assert not inductor.check_vec_isa(tmp_path, {})
    assert not (tmp_path / inductor.RECORD).exists()
    assert inductor.VEC_ISA_OK_ENV not in inductor.inductor_env()


@pytest.mark.slow
def test_the_real_check_agrees_with_trusting_the_flags_on_this_machine(tmp_path: Path) -> None:
    """A child interpreter runs inductor's own check (compiles); on an x86 machine with a working
    g++ every ISA the CPU reports builds, so workers may skip it."""
    env = worker_env(SandboxConfig(), tmp_path)
    if inductor.toolchain_key(env) is None:
        pytest.skip("no C++ compiler")
    ok = inductor.check_vec_isa(tmp_path, env)
    record = json.loads((tmp_path / inductor.RECORD).read_text())
    assert record["ok"] is ok and ok == inductor.passes(record)


def test_an_evaluator_starts_the_check_only_when_something_may_compile(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # A fresh process (a CLI command, a test) that never compiles must not pay a child interpreter
    # and its compiles under the device's lock at start; the first program naming the compiler
    # starts it, once.
    from kernelrl.candidate import Candidate
    from kernelrl.judge import evaluator as E
    from kernelrl.judge.isolation import ahead
    from kernelrl.result import EvalResult, Status
    from kernelrl.tasks.task import Task

    started: list[Path] = []
    monkeypatch.setattr(ahead, "start_vec_isa_check", lambda cache_dir, env, hold: started.append(cache_dir))
    task = Task(name="t", source="# the reference\n")
    plain = Candidate(source="# a plain rewrite\n")
    compiled = Candidate(source="import torch\nforward = torch.compile(lambda x: x)\n")
    with E.Evaluator(E.EvalConfig(cache_dir=tmp_path, roofline=False), warm_workers=0) as ev:
        for cand in (plain, compiled):  # judged before: answered from the cache, no worker starts
            ev._results.remember(ev._key(task, cand), EvalResult(task="t", status=Status.CORRECT, speedup=1.0))
        assert started == []
        ev.evaluate(task, plain)
        assert started == []
        ev.evaluate(task, compiled)
        ev.evaluate(task, compiled)
        assert started == [tmp_path]
