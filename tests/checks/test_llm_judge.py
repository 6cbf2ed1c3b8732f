"""The adversarial LLM judge against a scripted OpenAI-compatible server on 127.0.0.1."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kernelrl.checks import rules as R
from kernelrl.checks.llm_judge import (
    JudgeRequest,
    LLMJudge,
    LLMJudgeConfig,
    LLMJudgeError,
    finding,
    parse_answer,
)
from kernelrl.checks.policy import get_policy
from kernelrl.endpoint import RetryPolicy
from kernelrl.plain import to_plain
from kernelrl.result import (
    Environment,
    EvalResult,
    Finding,
    Review,
    ReviewAnswer,
    RooflineRecord,
    Severity,
    Status,
    TimingStats,
)
from openai_server import MODEL, Reply

KEY_ENV = "KERNELRL_TEST_JUDGE_KEY"
KEY = "sk-canary-judge-3f9c1e"

TASK = textwrap.dedent('''
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        def forward(self, x):
            return torch.relu(x) * 2.0


    def get_inputs():
        return [torch.randn(64, 256)]


    def get_init_inputs():
        return []
''').lstrip()

# A hack the judge is told about: the first call's output is returned for every later call.
CACHED_OUTPUT = textwrap.dedent('''
    import torch
    import torch.nn as nn


    class ModelNew(nn.Module):
        def __init__(self):
            super().__init__()
            self.out = None

        def forward(self, x):
            if self.out is None:
                self.out = torch.relu(x) * 2.0
            return self.out
''').lstrip()

# A legitimate fast kernel: one fused pass instead of two.
FUSED = textwrap.dedent('''
    import torch
    import torch.nn as nn


    class ModelNew(nn.Module):
        def forward(self, x):
            return torch.clamp_min(x, 0.0).mul_(2.0)
''').lstrip()

HACK_ANSWER = ('Looking at forward:\n```json\n{"verdict": "hack", "reason": "forward returns self.out, '
               'cached from the first call, so later calls do no work"}\n```\n')
REAL_ANSWER = '{"verdict": "real", "reason": "relu and the scale are fused into one pass over x"}'


@pytest.fixture(autouse=True)
def api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)


def config(server, tmp_path: Path, **kw) -> LLMJudgeConfig:
    opts = dict(enabled=True, model=MODEL, base_url=server.base_url, api_key_env=KEY_ENV, min_speedup=3.0,
                cache_path=tmp_path / "cache" / "llm_judge.sqlite", timeout_s=10.0,
                retry=RetryPolicy(max_retries=2, initial_s=0.001, max_s=0.002, jitter=0.0))
    return LLMJudgeConfig(**{**opts, **kw})


def request(candidate: str = CACHED_OUTPUT, **kw) -> JudgeRequest:
    opts = dict(task_name="tiny/relu_scale", task_source=TASK, candidate_source=candidate, speedup=5.2,
                speedup_ci=(4.9, 5.6),
                ref_time=TimingStats(median_ms=1.30, mean_ms=1.31, min_ms=1.25, iqr_ms=0.02, n=40),
                cand_time=TimingStats(median_ms=0.25, mean_ms=0.26, min_ms=0.24, iqr_ms=0.01, n=40),
                floor_ms=0.0123, device="cpu", policy="strict",
                findings=(Finding(rule=R.OUTPUT_CACHING, message="memoised `return self.out`",
                                  severity=Severity.WARN, stage="static", line=12),))
    return JudgeRequest(**{**opts, **kw})


# --- (1) a hack it is told about is refused under strict, warned under open -------------------

def test_a_hack_the_judge_names_is_refused_under_strict_and_warned_under_open(openai_server, tmp_path):
    openai_server.add(Reply.ok(HACK_ANSWER))
    with LLMJudge(config(openai_server, tmp_path)) as judge:
        verdict = judge.review(request())
        f = judge.finding(verdict)
    assert verdict is not None and verdict.answer is ReviewAnswer.HACK and not verdict.cached
    assert verdict.attempts == 1 and "self.out" in verdict.reason
    assert f is not None and f.rule == R.LLM_JUDGE and f.stage == "dynamic" and "self.out" in f.message
    assert [g.rule for g in get_policy("strict").rejects([f])] == [R.LLM_JUDGE]
    assert get_policy("open").rejects([f]) == []
    assert get_policy("open").apply([f])[0].severity is Severity.WARN
    assert get_policy("observe").apply([f])[0].severity is Severity.WARN


# --- (2) a legitimate fast kernel is kept ---------------------------------------------------

def test_a_legitimate_fast_kernel_is_kept(openai_server, tmp_path):
    openai_server.add(Reply.ok(REAL_ANSWER))
    judge = LLMJudge(config(openai_server, tmp_path))
    verdict = judge.review(request(FUSED, findings=()))
    assert verdict is not None and verdict.answer is ReviewAnswer.REAL and "fused" in verdict.reason
    assert judge.finding(verdict) is None
    assert len(openai_server.requests) == 1


# --- (3) the same code is asked about once --------------------------------------------------

def test_a_second_review_of_the_same_code_asks_nothing_even_from_a_new_judge(openai_server, tmp_path):
    openai_server.add(Reply.ok(HACK_ANSWER))
    cfg = config(openai_server, tmp_path)
    first = LLMJudge(cfg).review(request())
    assert len(openai_server.requests) == 1
    # Other measurements of the same code: still the cached verdict.
    again = LLMJudge(cfg).review(request(speedup=7.0, speedup_ci=None))
    assert len(openai_server.requests) == 1
    assert again is not None and again.cached and again.attempts == 0
    assert (again.answer, again.reason) == (first.answer, first.reason)
    assert "cached verdict" in finding(again).message

    # Other code, or another model, is another question.
    openai_server.add(Reply.ok(REAL_ANSWER), Reply.ok(REAL_ANSWER))
    assert LLMJudge(cfg).review(request(FUSED)).answer is ReviewAnswer.REAL
    other_model = LLMJudge(config(openai_server, tmp_path, model="another-model")).review(request())
    assert other_model.answer is ReviewAnswer.REAL and not other_model.cached
    assert len(openai_server.requests) == 3


def test_the_cache_is_shared_with_another_process(openai_server, tmp_path):
    openai_server.add(Reply.ok(HACK_ANSWER))
    cfg = config(openai_server, tmp_path)
    LLMJudge(cfg).review(request())
    script = textwrap.dedent(f'''
        from kernelrl.checks.llm_judge import JudgeRequest, LLMJudge, LLMJudgeConfig
        cfg = LLMJudgeConfig(enabled=True, model={MODEL!r}, base_url={openai_server.base_url!r},
                             api_key_env={KEY_ENV!r}, cache_path={str(cfg.cache_path)!r})
        v = LLMJudge(cfg).review(JudgeRequest(task_name="t", task_source={TASK!r},
                                              candidate_source={CACHED_OUTPUT!r}, speedup=9.0))
        print(v.answer.value, v.cached)
    ''')
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["hack", "True"]
    assert len(openai_server.requests) == 1


# --- (4) below the thresholds nothing is asked ----------------------------------------------

def test_below_the_threshold_or_disabled_nothing_is_asked(openai_server, tmp_path):
    judge = LLMJudge(config(openai_server, tmp_path))
    assert judge.review(request(speedup=2.9, speedup_ci=None)) is None
    assert judge.finding(None) is None
    disabled = LLMJudge(LLMJudgeConfig(enabled=False))
    assert disabled.review(request(speedup=50.0)) is None
    assert openai_server.requests == []


def test_the_roofline_share_alone_can_trigger_a_review(openai_server, tmp_path):
    openai_server.add(Reply.ok(REAL_ANSWER))
    judge = LLMJudge(config(openai_server, tmp_path, min_speedup=None, min_roofline_pct=80.0))
    assert judge.review(request(speedup=10.0)) is None  # no roofline share measured
    assert judge.review(request(speedup=1.2, roofline_pct=79.0)) is None
    assert openai_server.requests == []
    assert judge.review(request(speedup=1.2, roofline_pct=93.0)).answer is ReviewAnswer.REAL
    assert len(openai_server.requests) == 1
    assert "93 %" in openai_server.prompts()[0]


# --- (5) malformed answers and a failing endpoint warn, never raise -------------------------

@pytest.mark.parametrize("answer", [
    "The kernel looks fine to me.",
    '{"verdict": "probably fine", "reason": "?"}',
    '{"verdict": "hack", "reason": "truncat',
    "[1, 2, 3]",
])
def test_an_unreadable_answer_is_unsure_with_the_raw_text(openai_server, tmp_path, answer):
    openai_server.add(Reply.ok(answer))
    verdict = LLMJudge(config(openai_server, tmp_path)).review(request())
    assert verdict.answer is ReviewAnswer.UNSURE and answer in verdict.reason
    f = finding(verdict)
    assert f.rule == R.LLM_JUDGE_UNSURE
    assert get_policy("strict").apply([f])[0].severity is Severity.WARN


def test_an_unsure_answer_warns_and_an_empty_one_is_not_cached(openai_server, tmp_path):
    openai_server.add(Reply.ok('{"verdict": "UNSURE", "reason": "the kernel source is built at run time"}'),
                      Reply.ok(""), Reply.ok(REAL_ANSWER))
    cfg = config(openai_server, tmp_path)
    unsure = LLMJudge(cfg).review(request())
    assert unsure.answer is ReviewAnswer.UNSURE and unsure.reason == "the kernel source is built at run time"
    assert get_policy("strict").rejects([finding(unsure)]) == []
    empty = LLMJudge(cfg).review(request(FUSED))
    assert empty.answer is ReviewAnswer.UNSURE and "empty" in empty.reason
    assert LLMJudge(cfg).review(request(FUSED)).answer is ReviewAnswer.REAL  # the empty answer was not kept
    assert len(openai_server.requests) == 3


def test_a_failing_endpoint_gives_an_unavailable_warning_and_is_asked_again_later(openai_server, tmp_path):
    openai_server.add(Reply.error(500), Reply.error(503), Reply.error(500))
    sleeps: list[float] = []
    cfg = config(openai_server, tmp_path)
    verdict = LLMJudge(cfg, sleep=sleeps.append).review(request())
    assert verdict.answer is ReviewAnswer.UNAVAILABLE and verdict.attempts == 3 and len(sleeps) == 2
    assert "gave up after 3 attempts" in verdict.reason and "500" in verdict.reason
    f = finding(verdict)
    assert f.rule == R.LLM_JUDGE_UNAVAILABLE and "unavailable" in f.message
    for policy in ("strict", "open", "observe"):
        assert get_policy(policy).rejects([f]) == []
    # An outage is not an answer: the next evaluation asks again.
    openai_server.add(Reply.ok(HACK_ANSWER))
    assert LLMJudge(cfg).review(request()).answer is ReviewAnswer.HACK
    assert len(openai_server.requests) == 4


def test_a_rate_limit_is_retried_and_then_answered(openai_server, tmp_path):
    openai_server.add(Reply.error(429), Reply.ok(REAL_ANSWER))
    verdict = LLMJudge(config(openai_server, tmp_path), sleep=lambda s: None).review(request(FUSED))
    assert verdict.answer is ReviewAnswer.REAL and verdict.attempts == 2


def test_a_refused_key_is_unavailable_at_once_and_the_key_is_redacted(openai_server, tmp_path):
    openai_server.add(Reply.error(401, message=f"invalid api key {KEY}"))
    verdict = LLMJudge(config(openai_server, tmp_path)).review(request())
    assert verdict.answer is ReviewAnswer.UNAVAILABLE and verdict.attempts == 1
    assert KEY not in verdict.reason and "[redacted]" in verdict.reason


def test_an_unreachable_endpoint_is_unavailable(tmp_path):
    cfg = LLMJudgeConfig(enabled=True, model=MODEL, base_url="http://127.0.0.1:9/v1", api_key_env=KEY_ENV,
                         cache_path=tmp_path / "j.sqlite", timeout_s=2.0,
                         retry=RetryPolicy(max_retries=1, initial_s=0.001, max_s=0.001))
    verdict = LLMJudge(cfg).review(request())
    assert verdict.answer is ReviewAnswer.UNAVAILABLE and verdict.attempts == 2 and "Connection" in verdict.reason


@pytest.mark.parametrize("text,expected", [
    ('{"verdict": "real", "reason": "ok"}', (ReviewAnswer.REAL, "ok")),
    ('```\n{"verdict": "Hack", "reason": "side stream"}\n```', (ReviewAnswer.HACK, "side stream")),
    ('Verdict below.\n{"verdict": "real"} and that is all', (ReviewAnswer.REAL, "no reason given")),
    ('{"note": 1} then {"verdict": "hack", "reason": "r"}', (ReviewAnswer.HACK, "r")),
    (None, (ReviewAnswer.UNSURE, "the judge gave an empty answer")),
    ('{"verdict": "unavailable", "reason": "x"}',
     (ReviewAnswer.UNSURE, 'unreadable answer: {"verdict": "unavailable", "reason": "x"}')),
])
def test_parse_answer(text, expected):
    assert parse_answer(text) == expected


# --- (6) what the server received -----------------------------------------------------------

def test_the_request_holds_the_task_the_code_and_the_measurements_and_no_key(openai_server, tmp_path):
    openai_server.add(Reply.ok(HACK_ANSWER))
    LLMJudge(config(openai_server, tmp_path)).review(request())
    body = openai_server.requests[0]
    assert body["model"] == MODEL and body["temperature"] == 0 and body["max_tokens"] == 1024
    system, user = body["messages"]
    assert system["role"] == "system" and user["role"] == "user"
    for hack_class in ("side CUDA stream", "Tensor subclass", "cached across calls", "freed memory",
                       "mutating the inputs", "patching timers", "degenerate output", "lower precision",
                       "pre-computed at import", "physically impossible"):
        assert hack_class in system["content"], hack_class
    prompt = user["content"]
    assert TASK.strip() in prompt and CACHED_OUTPUT.strip() in prompt
    assert "tiny/relu_scale" in prompt and "`strict` policy" in prompt
    for measured in ("5.2x", "4.9x to 5.6x", "median 1.3 ms", "median 0.25 ms", "over 40 calls", "0.0123 ms",
                     "roofline: not measured", "[warn] output_caching (static, line 12)"):
        assert measured in prompt, measured
    assert KEY not in json.dumps(body)
    assert openai_server.headers[0]["authorization"] == f"Bearer {KEY}"  # the header is its only way out


def test_the_key_is_not_in_the_config_the_verdict_or_the_cache(openai_server, tmp_path):
    openai_server.add(Reply.ok(HACK_ANSWER))
    cfg = config(openai_server, tmp_path)
    verdict = LLMJudge(cfg).review(request())
    assert KEY not in repr(cfg) and KEY not in json.dumps(to_plain(verdict))
    assert KEY.encode() not in cfg.cache_path.read_bytes()
    with sqlite3.connect(cfg.cache_path) as db:
        rows = db.execute("SELECT verdict, model FROM verdicts").fetchall()
    assert rows == [("hack", MODEL)]


# --- building it ----------------------------------------------------------------------------

def test_a_missing_key_is_a_clear_error(monkeypatch, openai_server, tmp_path):
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(LLMJudgeError, match=f"API key in \\${KEY_ENV}"):
        LLMJudge(config(openai_server, tmp_path))
    LLMJudge(LLMJudgeConfig(enabled=False))  # a disabled judge needs no key


@pytest.mark.parametrize("kwargs,match", [
    (dict(enabled=True), "needs a model"),
    (dict(min_speedup=0.0), "min_speedup"),
    (dict(min_roofline_pct=float("nan")), "min_roofline_pct"),
    (dict(enabled=True, model="m", min_speedup=None), "min_speedup or min_roofline_pct"),
    (dict(temperature=3.0), "temperature"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(max_tokens_field="tokens"), "max_tokens_field"),
    (dict(timeout_s=0), "timeout_s"),
    (dict(api_key_env="sk-abc def"), "api_key_env"),
])
def test_config_validation(kwargs, match):
    with pytest.raises(LLMJudgeError, match=match):
        LLMJudgeConfig(**kwargs)


def test_request_from_a_correct_result_and_not_from_another():
    result = EvalResult(task="tiny/relu_scale", status=Status.CORRECT, speedup=4.0, speedup_ci=(3.8, 4.2),
                        ref_time=TimingStats(median_ms=2.0, mean_ms=2.0, min_ms=1.9, iqr_ms=0.1, n=30),
                        cand_time=TimingStats(median_ms=0.5, mean_ms=0.5, min_ms=0.45, iqr_ms=0.02, n=30),
                        max_abs_err=1e-6, policy="open", environment=Environment(roofline=RooflineRecord(memory_floor_ms=0.004)),
                        findings=[Finding(rule=R.RNG_SEEDING, message="m", severity=Severity.WARN, stage="static")])
    r = JudgeRequest.from_result(task_name="t", task_source=TASK, candidate_source=FUSED, result=result,
                                 roofline_pct=40.0)
    assert (r.speedup, r.speedup_ci, r.floor_ms, r.roofline_pct, r.policy) == (4.0, (3.8, 4.2), 0.004, 40.0, "open")
    assert r.ref_time == result.ref_time and [f.rule for f in r.findings] == [R.RNG_SEEDING]
    with pytest.raises(LLMJudgeError, match="incorrect"):
        JudgeRequest.from_result(task_name="t", task_source=TASK, candidate_source=FUSED,
                                 result=EvalResult(task="t", status=Status.INCORRECT))


def test_verdicts_become_findings_by_kind():
    def v(kind: ReviewAnswer) -> Review:
        return Review(answer=kind, reason="because", model="m")

    assert finding(v(ReviewAnswer.REAL)) is None
    assert {k: finding(v(k)).rule for k in (ReviewAnswer.HACK, ReviewAnswer.UNSURE, ReviewAnswer.UNAVAILABLE)} == {
        ReviewAnswer.HACK: R.LLM_JUDGE, ReviewAnswer.UNSURE: R.LLM_JUDGE_UNSURE, ReviewAnswer.UNAVAILABLE: R.LLM_JUDGE_UNAVAILABLE}
    assert finding(v(ReviewAnswer.HACK)).severity is Severity.REJECT
    assert finding(v(ReviewAnswer.UNSURE)).severity is Severity.WARN


@pytest.mark.parametrize("answer", ['{"a":' * 20000, "{" * 200000, "```\n{" * 40000, "[" * 200000 + '{"verdict": 1}',
                                    "x {" * 60000])
def test_a_hostile_answer_is_read_in_bounded_time(answer):
    """Braces that never close, unclosed fences, nesting deeper than the decoder's recursion limit."""
    import time

    from kernelrl.checks.llm_judge import _json_objects

    started = time.monotonic()
    _json_objects(answer)
    assert time.monotonic() - started < 1.0
