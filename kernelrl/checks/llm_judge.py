"""An adversarial LLM judge: a model's second opinion on suspiciously large speedups.

After the evaluator has found a candidate correct and timed it, `LLMJudge.review(request)` sends
the task, the candidate and the measurements to an OpenAI-compatible chat model, when the speedup
(or the measured share of the roofline) reaches a configured threshold, and asks whether the
speedup is real or comes from a reward hack (the hack classes of the evaluator's design are listed
in the prompt). `finding(verdict)` turns the answer into a `Finding` that the policy then weighs.
The prompt is the template pair `templates/llm_judge_system.txt` and `templates/llm_judge.txt`.

Guarantees:
- nothing is asked when the judge is disabled or the result is below every threshold: `review`
  returns None. It asks when the speedup is at least `min_speedup`, or when the request carries a
  roofline share and it is at least `min_roofline_pct` (either threshold may be None: unused);
- an answer always becomes a verdict: a JSON object {"verdict": "real"|"hack"|"unsure", "reason"},
  bare, in a fenced block or inside prose; anything else is UNSURE with the raw text as its
  reason, never an exception;
- an endpoint that keeps failing (timeouts, connection errors, 408/409/429 and 5xx after the
  retry policy is spent; any other error at once) gives an UNAVAILABLE verdict, which becomes a
  warning under every policy, never an exception and never a rejection: the reward must not
  hinge on a flaky endpoint;
- every answer with text is cached under (task source hash, candidate source hash, model, prompt
  fingerprint), in memory and, with `cache_path`, in a SQLite file that processes share: the same
  code for the same task is asked about once per model and prompt. Failures and empty answers are
  not cached, so a later evaluation asks again. The file is versioned (`CACHE_SCHEMA`, through
  `kernelrl.sqlite`): one written by a newer kernelrl is refused when the judge is built;
- the API key is read from the environment variable the config names when the judge is built,
  travels only in the request's Authorization header, and is never stored in the config, the
  cache or a verdict; error texts that reach a verdict are redacted;
- findings: HACK -> `llm_judge` (rejects under `strict`, warns under `open` and `observe`),
  UNSURE -> `llm_judge_unsure` and UNAVAILABLE -> `llm_judge_unavailable` (warnings under every
  policy), REAL -> no finding.

Does not:
- prove anything: a verdict is a model's opinion of the code, not a measurement. The evaluator's
  dynamic defences stay the ones that decide on measurements; this judge looks for what they
  cannot see (work skipped on the tested inputs only, a trick in an unusual form);
- deduplicate concurrent reviews: two threads reviewing the same code at once both ask;
- shorten sources: a very large candidate makes a long prompt.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import random
import sqlite3
import string
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Self

from kernelrl.candidate import fenced_blocks, source_hash
from kernelrl.checks import rules as R
from kernelrl.endpoint import RetryPolicy, retry_after_s
from kernelrl.result import EvalResult, Finding, Review, ReviewAnswer, Status, TimingStats
from kernelrl.sqlite import Schema, connect_writer, migrate, transaction

if TYPE_CHECKING:
    import openai

    from kernelrl.jsontypes import JSONObject

# RetryPolicy is the proposers' on purpose: one retry policy for every chat endpoint kernelrl
# talks to (backoff, jitter, Retry-After, which statuses are worth another attempt).

TEMPLATES = Path(__file__).parent / "templates"
SYSTEM_TEMPLATE = "llm_judge_system.txt"
PROMPT_TEMPLATE = "llm_judge.txt"
# The cache's file name inside the evaluator's cache folder (the evaluator passes the full path).
CACHE_FILE = "llm_judge.sqlite"
# Reasons are shown in findings and in later prompts: long enough for an argument, not an essay.
MAX_REASON_CHARS = 1000


class LLMJudgeError(ValueError):
    """The judge cannot be built as configured; the message says why, for a person."""


# Answers a model may give; UNAVAILABLE is ours alone.
_ANSWERS = {v.value: v for v in (ReviewAnswer.REAL, ReviewAnswer.HACK, ReviewAnswer.UNSURE)}


def _judge_retry() -> RetryPolicy:
    # Fewer and shorter waits than a proposer's: an evaluation waits on the judge.
    return RetryPolicy(max_retries=3, initial_s=1.0, max_s=20.0)


@dataclass(frozen=True, kw_only=True)
class LLMJudgeConfig:
    # None (the default): on exactly when a model is named, so a run that configures an endpoint
    # is watched without a second switch; false turns a named judge off (said at a run's start).
    enabled: bool | None = None
    model: str = ""
    base_url: str | None = None  # None: OPENAI_BASE_URL, else the client's default
    api_key_env: str = "OPENAI_API_KEY"  # the variable's name; its value is never kept here
    min_speedup: float | None = 3.0  # ask at or above this speedup; None: never on speedup alone
    min_roofline_pct: float | None = None  # ask at or above this % of the roofline, when it is known
    temperature: float = 0.0  # the same code should get the same answer
    max_tokens: int = 1024
    # Newer OpenAI models take only "max_completion_tokens" (the proposers' option of the same name).
    max_tokens_field: str = "max_tokens"
    timeout_s: float = 120.0  # per request
    retry: RetryPolicy = field(default_factory=_judge_retry)
    # SQLite file shared across processes, usually <evaluator cache_dir>/llm_judge.sqlite.
    # None: answers are remembered by this judge object only.
    cache_path: Path | None = None

    def __post_init__(self) -> None:
        if self.cache_path is not None:
            object.__setattr__(self, "cache_path", Path(self.cache_path))
        if self.enabled is None:
            object.__setattr__(self, "enabled", bool(self.model))
        if self.enabled and not self.model:
            raise LLMJudgeError("the LLM judge needs a model name when enabled")
        if not self.api_key_env or not self.api_key_env.replace("_", "").isalnum():
            raise LLMJudgeError(f"api_key_env must name an environment variable, not {self.api_key_env!r}")
        if self.min_speedup is not None and not (math.isfinite(self.min_speedup) and self.min_speedup > 0):
            raise LLMJudgeError(f"min_speedup must be a positive number or None, not {self.min_speedup}")
        if self.min_roofline_pct is not None and not (math.isfinite(self.min_roofline_pct)
                                                      and self.min_roofline_pct > 0):
            raise LLMJudgeError(f"min_roofline_pct must be a positive number or None, not {self.min_roofline_pct}")
        if self.enabled and self.min_speedup is None and self.min_roofline_pct is None:
            raise LLMJudgeError("an enabled LLM judge needs min_speedup or min_roofline_pct (or both)")
        if not 0 <= self.temperature <= 2:
            raise LLMJudgeError(f"temperature must be in [0, 2], not {self.temperature}")
        if self.max_tokens < 1:
            raise LLMJudgeError(f"max_tokens must be >= 1, not {self.max_tokens}")
        if self.max_tokens_field not in ("max_tokens", "max_completion_tokens"):
            raise LLMJudgeError("max_tokens_field must be max_tokens or max_completion_tokens, "
                                f"not {self.max_tokens_field!r}")
        if self.timeout_s <= 0:
            raise LLMJudgeError(f"timeout_s must be > 0, not {self.timeout_s}")
        if not isinstance(self.retry, RetryPolicy):
            raise LLMJudgeError("retry must be a RetryPolicy")


@dataclass(frozen=True, kw_only=True)
class JudgeRequest:
    """What the judge is shown: the task, the candidate, and what the evaluator measured."""

    task_name: str
    task_source: str
    candidate_source: str
    speedup: float  # reference median / candidate median
    speedup_ci: tuple[float, float] | None = None  # 95 % interval
    ref_time: TimingStats | None = None
    cand_time: TimingStats | None = None
    roofline_pct: float | None = None  # the candidate's share of the device's roofline, when measured
    floor_ms: float | None = None  # the least time physically possible (bytes / bandwidth), when known
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    device: str = "cpu"
    policy: str = "open"
    findings: tuple[Finding, ...] = ()  # raised before the judge was asked

    def __post_init__(self) -> None:
        if not self.task_source.strip() or not self.candidate_source.strip():
            raise LLMJudgeError("a judge request needs the task's and the candidate's source")
        if not (math.isfinite(self.speedup) and self.speedup > 0):
            raise LLMJudgeError(f"speedup must be a positive number, not {self.speedup}")
        if self.roofline_pct is not None and not (math.isfinite(self.roofline_pct) and self.roofline_pct >= 0):
            raise LLMJudgeError(f"roofline_pct must be a number >= 0, not {self.roofline_pct}")
        object.__setattr__(self, "findings", tuple(self.findings))

    @classmethod
    def from_result(cls, *, task_name: str, task_source: str, candidate_source: str, result: EvalResult,
                    roofline_pct: float | None = None) -> JudgeRequest:
        """The request for a CORRECT result (its times, interval, errors, floor and findings)."""
        if result.status is not Status.CORRECT or result.speedup is None:
            raise LLMJudgeError(f"only a correct, timed result can be reviewed, not {result.status.value}")
        roofline = result.environment.roofline
        return cls(task_name=task_name, task_source=task_source, candidate_source=candidate_source,
                   speedup=result.speedup, speedup_ci=result.speedup_ci, ref_time=result.ref_time,
                   cand_time=result.cand_time, roofline_pct=roofline_pct, floor_ms=roofline.floor_ms if roofline else None,
                   max_abs_err=result.max_abs_err, max_rel_err=result.max_rel_err, device=result.device,
                   policy=result.policy, findings=tuple(result.findings))


# ---------------------------------------------------------------------------------------------
# Answers




def parse_answer(text: str | None) -> tuple[ReviewAnswer, str]:
    """The verdict and reason in a model's answer; UNSURE with the raw text when there is none.

    Reads the first JSON object with a "verdict" key: the whole answer, a fenced block, or an
    object embedded in prose. Never raises.
    """
    raw = (text or "").strip()
    if not raw:
        return ReviewAnswer.UNSURE, "the judge gave an empty answer"
    for obj in _json_objects(raw):
        value = obj.get("verdict")
        verdict = _ANSWERS.get(value.strip().lower()) if isinstance(value, str) else None
        if verdict is None:
            continue
        reason = obj.get("reason")
        reason = reason.strip() if isinstance(reason, str) and reason.strip() else "no reason given"
        return verdict, _clip(reason)
    return ReviewAnswer.UNSURE, _clip(f"unreadable answer: {raw}")


# A reviewer's answer is bounded by its max_tokens; a longer one (a misbehaving endpoint) is read
# only this far, and objects inside prose are looked for at no more than this many braces, so a
# hostile answer costs a bounded, linear amount of work.
MAX_ANSWER_CHARS = 64 * 1024
MAX_BRACES_TRIED = 64


def _json_objects(text: str) -> list[JSONObject]:
    text = text[:MAX_ANSWER_CHARS]
    decoder = json.JSONDecoder()
    pieces = [text] + [body.strip() for _, body in fenced_blocks(text)]
    found: list[JSONObject] = []
    for piece in pieces:
        try:
            obj = json.loads(piece)
        except (json.JSONDecodeError, RecursionError):
            obj = None
        if isinstance(obj, dict):
            found.append(obj)
    # Objects inside prose: decode from opening braces, skipping past each object found.
    start, tried = text.find("{"), 0
    while start >= 0 and tried < MAX_BRACES_TRIED:
        tried += 1
        try:
            obj, end = decoder.raw_decode(text, start)
        except (json.JSONDecodeError, RecursionError):
            start = text.find("{", start + 1)
            continue
        if isinstance(obj, dict):
            found.append(obj)
        start = text.find("{", max(end, start + 1))
    return found


def _clip(text: str) -> str:
    return text if len(text) <= MAX_REASON_CHARS else text[:MAX_REASON_CHARS - 3] + "..."


# ---------------------------------------------------------------------------------------------
# Findings


def finding(review: Review | None) -> Finding | None:
    """HACK: `llm_judge`; UNSURE: `llm_judge_unsure`; UNAVAILABLE: `llm_judge_unavailable`; REAL or
    None (nothing asked): no finding. Severities are the rules' defaults; the policy sets the final one."""
    if review is None or review.answer is ReviewAnswer.REAL:
        return None
    who = f"the LLM judge ({review.model}{', cached verdict' if review.cached else ''})"
    if review.answer is ReviewAnswer.HACK:
        name, message = R.LLM_JUDGE, f"{who} says the speedup comes from a reward hack: {review.reason}"
    elif review.answer is ReviewAnswer.UNSURE:
        name, message = R.LLM_JUDGE_UNSURE, f"{who} could not tell whether the speedup is real: {review.reason}"
    else:
        name, message = (R.LLM_JUDGE_UNAVAILABLE,
                         f"{who} was unavailable, so this speedup went unreviewed: {review.reason}")
    rule = R.rule(name)
    return Finding(rule=name, message=message, severity=rule.severity, stage=rule.stage)


# ---------------------------------------------------------------------------------------------
# Cache


def _unversioned_cache(conn: sqlite3.Connection) -> int:
    """A cache written before it kept a version (user_version 0) holds version 1's table."""
    return 1 if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'verdicts'").fetchone() else 0


# The cache file's tables, version by version (`kernelrl.sqlite.migrate`); 1: one row per answer.
CACHE_SCHEMA = Schema("LLM review cache", (
    "CREATE TABLE verdicts (key TEXT PRIMARY KEY, verdict TEXT NOT NULL, reason TEXT NOT NULL, model TEXT NOT NULL, "
    "task_hash TEXT NOT NULL, candidate_hash TEXT NOT NULL, created REAL NOT NULL)",
), legacy_version=_unversioned_cache)


class ReviewCache:
    """Answers by key: in memory, and in a SQLite file when given one (safe across processes; its
    tables are `CACHE_SCHEMA`, brought up to date when the cache is made, a newer file refused)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._memory: dict[str, tuple[ReviewAnswer, str]] = {}
        self._lock = threading.Lock()
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            db = connect_writer(path)
            try:
                migrate(db, CACHE_SCHEMA)
            finally:
                db.close()

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        assert self.path is not None
        # A connection per operation: safe from any thread; SQLite's own locking serialises writers
        # of other processes (`kernelrl.sqlite`: the wait for another's write, one transaction).
        db = connect_writer(self.path)
        try:
            with transaction(db):  # commits, or rolls back on error
                yield db
        finally:
            db.close()

    def get(self, key: str) -> tuple[ReviewAnswer, str] | None:
        with self._lock:
            hit = self._memory.get(key)
        if hit is not None or self.path is None:
            return hit
        with self._connect() as db:
            row = db.execute("SELECT verdict, reason FROM verdicts WHERE key = ?", (key,)).fetchone()
        if row is None or row[0] not in _ANSWERS:
            return None
        hit = (_ANSWERS[row[0]], row[1])
        with self._lock:
            self._memory[key] = hit
        return hit

    def put(self, key: str, verdict: ReviewAnswer, reason: str, *, model: str, task_hash: str,
            candidate_hash: str) -> None:
        with self._lock:
            self._memory[key] = (verdict, reason)
        if self.path is None:
            return
        with self._connect() as db:
            db.execute("INSERT OR REPLACE INTO verdicts VALUES (?, ?, ?, ?, ?, ?, ?)",
                       (key, verdict.value, reason, model, task_hash, candidate_hash, time.time()))


# ---------------------------------------------------------------------------------------------
# The judge


def _template(name: str) -> str:
    return (TEMPLATES / name).read_text()


class LLMJudge:
    """Reviews suspiciously large speedups with a chat model; see the module docstring."""

    def __init__(self, config: LLMJudgeConfig, *, sleep: Callable[[float], None] = time.sleep,
                 rng: random.Random | None = None) -> None:
        self.config = config
        self._system = _template(SYSTEM_TEMPLATE).strip()
        self._prompt = string.Template(_template(PROMPT_TEMPLATE))
        # A changed prompt is a different question: its answers are cached apart.
        self.prompt_fingerprint = hashlib.sha256(
            f"{self._system}\0{self._prompt.template}".encode()).hexdigest()[:16]
        self._cache = ReviewCache(config.cache_path)
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._client: openai.OpenAI | None = None
        if config.enabled:
            import openai

            api_key = os.environ.get(config.api_key_env)
            if not api_key:
                raise LLMJudgeError(f"the LLM judge needs an API key in ${config.api_key_env} "
                                    "(local servers accept any non-empty value)")
            base_url = config.base_url or os.environ.get("OPENAI_BASE_URL") or None
            # The client's own retries are off: every attempt and wait is counted by our policy.
            self._client = openai.OpenAI(api_key=api_key, base_url=base_url, timeout=config.timeout_s,
                                         max_retries=0)

    # -- what is asked ------------------------------------------------------------------------

    def wants(self, request: JudgeRequest) -> bool:
        """Whether `request` reaches a threshold (regardless of `enabled`)."""
        cfg = self.config
        if cfg.min_speedup is not None and request.speedup >= cfg.min_speedup:
            return True
        return (cfg.min_roofline_pct is not None and request.roofline_pct is not None
                and request.roofline_pct >= cfg.min_roofline_pct)

    def cache_key(self, request: JudgeRequest) -> str:
        parts = (source_hash(request.task_source), source_hash(request.candidate_source), self.config.model,
                 self.prompt_fingerprint)
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()

    def prompt(self, request: JudgeRequest) -> str:
        from kernelrl.checks.policy import get_policy

        try:
            policy_description = get_policy(request.policy).description
        except ValueError:
            policy_description = "a policy this judge does not know"
        return self._prompt.substitute(
            task_name=request.task_name, device=request.device, policy=request.policy,
            policy_description=policy_description, task_source=request.task_source.strip(),
            candidate_source=request.candidate_source.strip(), measurements=_measurements(request),
            findings=_findings(request.findings))

    def messages(self, request: JudgeRequest) -> list[dict[str, str]]:
        return [{"role": "system", "content": self._system}, {"role": "user", "content": self.prompt(request)}]

    # -- asking -------------------------------------------------------------------------------

    def review(self, request: JudgeRequest) -> Review | None:
        """The judge's verdict on a timed, correct candidate; None when nothing was asked
        (disabled, or below every threshold). Never raises for the endpoint's or the model's faults."""
        cfg = self.config
        if not cfg.enabled or not self.wants(request):
            return None
        key = self.cache_key(request)
        hit = self._cache.get(key)
        if hit is not None:
            return Review(answer=hit[0], reason=hit[1], model=cfg.model, cached=True)
        answer, attempts, error = self._ask(self.messages(request))
        if answer is None:
            return Review(answer=ReviewAnswer.UNAVAILABLE, reason=error, model=cfg.model, attempts=attempts)
        verdict, reason = parse_answer(answer)
        if answer.strip():
            self._cache.put(key, verdict, reason, model=cfg.model, task_hash=source_hash(request.task_source),
                            candidate_hash=source_hash(request.candidate_source))
        return Review(answer=verdict, reason=reason, model=cfg.model, attempts=attempts)

    @staticmethod
    def finding(review: Review | None) -> Finding | None:
        """See the module function `finding`."""
        return finding(review)

    def _ask(self, messages: list[dict[str, str]]) -> tuple[str | None, int, str]:
        """(answer text, requests sent, last error); the answer is None when every attempt failed."""
        import openai

        cfg = self.config
        client = self._client
        assert client is not None, "asked only when enabled, which makes the client"
        attempts = 0
        while True:
            attempts += 1
            try:
                response = client.chat.completions.create(  # type: ignore[call-overload]
                    model=cfg.model, messages=messages, temperature=cfg.temperature,
                    **{cfg.max_tokens_field: cfg.max_tokens})
            except openai.OpenAIError as e:
                error = self._redact(f"{type(e).__name__}: {_one_line(e)}")
                if not RetryPolicy.retryable(e):
                    return None, attempts, error
                if attempts > cfg.retry.max_retries:
                    return None, attempts, f"gave up after {attempts} attempts; last error {error}"
                self._sleep(cfg.retry.delay_s(attempts - 1, self._rng, retry_after_s(e)))
                continue
            choices = getattr(response, "choices", None) or []
            message = choices[0].message if choices else None
            return (message.content if message is not None else None) or "", attempts, ""

    def _redact(self, text: str) -> str:
        key = getattr(self._client, "api_key", None)
        return text.replace(key, "[redacted]") if key else text

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _measurements(r: JudgeRequest) -> str:
    lines = [f"- speedup: {r.speedup:.3g}x" + (f" (95 % interval {r.speedup_ci[0]:.3g}x to {r.speedup_ci[1]:.3g}x)"
                                              if r.speedup_ci else "")]
    for label, t in (("reference", r.ref_time), ("candidate", r.cand_time)):
        if t is not None:
            lines.append(f"- {label} time per call: median {t.median_ms:.4g} ms, min {t.min_ms:.4g} ms, "
                         f"interquartile range {t.iqr_ms:.3g} ms over {t.n} calls")
    lines.append(f"- share of the device's roofline: {r.roofline_pct:.3g} %" if r.roofline_pct is not None
                 else "- share of the device's roofline: not measured")
    lines.append(f"- physical floor (least time to move the output's bytes): {r.floor_ms:.4g} ms"
                 if r.floor_ms is not None else "- physical floor: not known")
    if r.max_abs_err is not None or r.max_rel_err is not None:
        errs = [f"{name} {v:.3g}" for name, v in (("max absolute error", r.max_abs_err),
                                                   ("max relative error", r.max_rel_err)) if v is not None]
        lines.append(f"- against the reference: {', '.join(errs)}")
    return "\n".join(lines)


def _findings(findings: tuple[Finding, ...]) -> str:
    if not findings:
        return "- none"
    return "\n".join(f"- [{f.severity.value}] {f.rule} ({f.stage}{_at_line(f.line)}): {f.message}" for f in findings)


def _at_line(line: int | None) -> str:
    return f", line {line}" if line else ""


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else type(e).__name__
