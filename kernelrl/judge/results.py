"""A group member's result: what impure inputs its verdict needs (the task's floors at this machine's
peaks, the noise band, the LLM review), then the pure decision (`kernelrl.judge.timing.verdict`).

Guarantees: the machine's peaks are measured again once before any candidate is refused for
beating a floor, so a disturbed measurement of the peaks refuses no one; a speedup inside the band
identical code measured in the same group (the A/A copy's, widened by the task's calibration) is
no speedup; only a correct result is shown to the reviewer.
"""

from __future__ import annotations

import statistics

from kernelrl.checks.llm_judge import JudgeRequest, LLMJudgeError
from kernelrl.judge.context import JudgeContext
from kernelrl.judge.grouprecord import GroupRecord
from kernelrl.judge.reference import TaskInfo
from kernelrl.judge.timing import verdict as V
from kernelrl.judge.timing.baseline import baseline_from_timing
from kernelrl.judge.timing.timer import CandidateTiming, GroupTiming, aa_band
from kernelrl.judge.trial import Trial
from kernelrl.result import EvalResult, Review, Status
from kernelrl.tasks.task import Task


def member_result(ctx: JudgeContext, task: Task, record: GroupRecord, timing: GroupTiming | None,
                  info: TaskInfo | None, trial: Trial) -> EvalResult:
    """The candidate's result: what impure inputs the verdict needs (floors, a review), then
    the pure decision."""
    env = record.environment()
    if trial.verdict is not None:
        return V.early(record.setting, trial.checked(), trial.verdict, env)
    assert timing is not None and info is not None
    measured = timing.candidates[trial.candidate.hash]
    checked = trial.checked()
    if measured.failure is not None:
        return V.failed_in_timing(record.setting, checked, measured, timing, env)
    roofline = _roofline(ctx, timing, info, measured)
    slack = ctx.config.floor_slack
    band = ctx.tasks.band(task, ctx.fingerprint)
    if (measured_band := aa_band(timing)) is not None:
        # identical code measured this far from 1.00 in this very group (noisy or not): a
        # speedup inside it cannot be told from the copy's, so it is no speedup
        band = measured_band if band is None else (min(band[0], measured_band[0]), max(band[1], measured_band[1]))
    result = V.timed(record.setting, checked, measured, timing, roofline=roofline, roofline_error=ctx.peaks.error,
                     floor_slack=slack, noise_band=band, environment=env)
    review = _review(ctx, task, trial, result)
    if review is not None:
        result = V.timed(record.setting, checked, measured, timing, roofline=roofline,
                         roofline_error=ctx.peaks.error, review=review, floor_slack=slack, noise_band=band,
                         environment=env)
    return result


def _roofline(ctx: JudgeContext, timing: GroupTiming, info: TaskInfo, measured: CandidateTiming) -> V.Roofline | None:
    """The task's floors at this machine's peaks; measured again once before a candidate is
    refused for beating them, so a disturbed measurement of the peaks refuses no one."""
    profile = info.profile
    if profile is None or not timing.reference_ms:
        return None
    ref_ms = statistics.median(timing.reference_ms)
    got = ctx.peaks.floors_for(profile, ref_ms)
    if got is None:
        return None
    roofline = V.Roofline(peaks=got[0], floors=got[1], profile=profile)
    if V.beyond_floor(measured, roofline, floor_slack=ctx.config.floor_slack) and ctx.peaks.remeasure_once():
        again = ctx.peaks.floors_for(profile, ref_ms)
        if again is not None:
            roofline = V.Roofline(peaks=again[0], floors=again[1], profile=profile)
    return roofline


def _review(ctx: JudgeContext, task: Task, trial: Trial, result: EvalResult) -> Review | None:
    """The LLM reviewer's opinion of a correct result it wants to see (None: not asked)."""
    reviewer = ctx.reviewer
    if reviewer is None or result.status is not Status.CORRECT:
        return None
    try:
        request = JudgeRequest.from_result(task_name=task.name, task_source=task.source,
                                           candidate_source=trial.candidate.source, result=result,
                                           roofline_pct=result.roofline_pct)
    except LLMJudgeError:
        return None
    return reviewer.review(request)


def record_baseline(ctx: JudgeContext, task: Task, record: GroupRecord, timing: GroupTiming, compiled: Trial | None,
                    compiled_key: str) -> None:
    """The task's baseline (eager against torch.compile, `compiled_key` the compiled reference's
    member), kept where this measurement gave one."""
    key = ctx.tasks.key(task)
    made = baseline_from_timing(
        task=task.name, device=record.setting.device, size=record.setting.size, timing=timing,
        compiled=timing.candidates.get(compiled_key) if compiled is not None and compiled.verdict is None else None,
        compiled_error=compiled.verdict.message if compiled is not None and compiled.verdict is not None else None,
        known=ctx.baselines.get(key))
    if made is not None:
        ctx.baselines.put(key, made)
