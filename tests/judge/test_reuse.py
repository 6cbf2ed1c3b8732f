"""The one answer to "judged before?": its key, its rule and the evaluator's in-memory store."""

from __future__ import annotations

from kernelrl.judge.reuse import JudgedKey, Known, ResultCache, judged_before, reusable
from kernelrl.result import EvalResult, Status
from kernelrl.tasks.task import Task

TASK = Task(name="t", source="# the reference\n")


def _key(task: Task = TASK, source_hash: str = "h", fingerprint: str = "fp") -> JudgedKey:
    return JudgedKey.of(task, source_hash, fingerprint)


def test_the_key_is_task_name_and_source_program_and_fingerprint() -> None:
    key = _key()
    assert key == JudgedKey(task="t", task_hash=TASK.source_hash, source_hash="h", fingerprint="fp")
    cache = ResultCache(8)
    cache.remember(key, EvalResult(task="t", status=Status.INCORRECT))
    assert judged_before(cache, _key()) is not None
    for other in (_key(task=Task(name="u", source=TASK.source)), _key(task=Task(name="t", source="# changed\n")),
                  _key(source_hash="h2"), _key(fingerprint="fp2")):
        assert judged_before(cache, other) is None, other


def test_changed_size_presets_make_another_task_and_no_presets_keep_the_source_hash() -> None:
    # the shapes a preset runs at are part of what was judged: a verdict at one preset's shapes
    # must not answer for another's (a client may send presets; a release may change them)
    assert _key().task_hash == TASK.source_hash
    small = Task(name="t", source=TASK.source, presets={"small": {"batch_size": 4}})
    other = Task(name="t", source=TASK.source, presets={"small": {"batch_size": 8}})
    cache = ResultCache(8)
    cache.remember(_key(task=small), EvalResult(task="t", status=Status.CORRECT, speedup=3.0))
    assert judged_before(cache, _key(task=small)) is not None
    assert judged_before(cache, _key(task=other)) is None
    assert judged_before(cache, _key()) is None
    # the order the presets are written in does not make another task
    one = Task(name="t", source=TASK.source, presets={"small": {"batch_size": 4, "dim": 8}})
    two = Task(name="t", source=TASK.source, presets={"small": {"dim": 8, "batch_size": 4}})
    assert _key(task=one) == _key(task=two) != _key(task=small)


class _Stored:
    """A store that holds a verdict whatever it is (a run database with an older row)."""

    def __init__(self, result: EvalResult) -> None:
        self.result = result

    def find_verdict(self, key: JudgedKey) -> Known | None:
        return Known(result=self.result, candidate_id=1)


def test_a_judge_or_task_failure_is_never_reused_nor_kept() -> None:
    for status in (Status.JUDGE_ERROR, Status.TASK_ERROR):
        assert not reusable(EvalResult(task="t", status=status))
        cache = ResultCache(8)
        cache.remember(_key(), EvalResult(task="t", status=status))
        assert len(cache) == 0

        assert judged_before(_Stored(EvalResult(task="t", status=status)), _key()) is None
    assert reusable(EvalResult(task="t", status=Status.COMPILE_ERROR))


def test_no_store_or_no_fingerprint_is_never_judged_before() -> None:
    cache = ResultCache(8)
    cache.remember(_key(fingerprint=""), EvalResult(task="t", status=Status.CORRECT, speedup=2.0))
    assert len(cache) == 0 and judged_before(cache, _key(fingerprint="")) is None
    assert judged_before(None, _key()) is None


def test_the_cache_keeps_the_most_recent() -> None:
    cache = ResultCache(2)
    for h in ("a", "b", "c"):
        cache.remember(_key(source_hash=h), EvalResult(task="t", status=Status.INCORRECT, message=h))
    assert judged_before(cache, _key(source_hash="a")) is None
    hit = judged_before(cache, _key(source_hash="c"))
    assert hit is not None and hit.result.message == "c" and hit.candidate_id is None
