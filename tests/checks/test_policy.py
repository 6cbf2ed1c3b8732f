"""Policies: which rules reject, warn or are ignored under strict, open and observe."""

from __future__ import annotations

import pytest

from kernelrl.checks import rules as R
from kernelrl.checks.policy import POLICY_NAMES, Policy, get_policy
from kernelrl.checks.static import check_source
from kernelrl.result import Finding, Severity


def finding(rule: str, severity: Severity = Severity.REJECT, stage: str = "static") -> Finding:
    return Finding(rule=rule, message="m", severity=severity, stage=stage, line=1)


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_every_rule_has_a_decision_under_every_policy(name):
    p = get_policy(name)
    for rule in R.RULES:
        assert rule in p.reject | p.warn | p.ignore, f"{name} says nothing about {rule}"


def test_unknown_policy_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown policy 'lenient'.*strict, strict-pytorch, open, observe"):
        get_policy("lenient")


def test_strict_needs_a_custom_kernel_and_open_does_not_care():
    src = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n"
    findings = check_source(src)
    assert [f.rule for f in get_policy("strict").rejects(findings)] == [R.NO_CUSTOM_KERNEL]
    assert get_policy("strict").requires_custom_kernel
    assert not get_policy("open").requires_custom_kernel
    assert all(f.rule != R.NO_CUSTOM_KERNEL for f in get_policy("open").apply(findings))
    assert all(f.rule != R.NO_CUSTOM_KERNEL for f in get_policy("observe").apply(findings))


def test_strict_pytorch_takes_a_pytorch_rewrite_and_refuses_everything_else_strict_refuses():
    src = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n"
    assert get_policy("strict-pytorch").rejects(check_source(src)) == []
    assert not get_policy("strict-pytorch").requires_custom_kernel
    strict, pytorch = get_policy("strict"), get_policy("strict-pytorch")
    assert pytorch.reject == strict.reject - {R.NO_CUSTOM_KERNEL}
    assert pytorch.warn == strict.warn
    # where it differs from open: each of these is paid under open and refused here
    for rule in (R.TRY_FALLBACK, R.PRECISION_CHANGE, R.REDUCED_PRECISION_COMPUTE, R.PRECISION_STATE_CHANGED,
                 R.BACKEND_SETTING_CHANGE, R.BACKEND_STATE_CHANGED, R.LLM_JUDGE):
        assert pytorch.severity(rule) is Severity.REJECT and get_policy("open").severity(rule) is Severity.WARN


def test_try_fallback_rejects_under_strict_and_warns_under_open():
    f = [finding(R.TRY_FALLBACK, Severity.WARN)]
    assert get_policy("strict").apply(f)[0].severity is Severity.REJECT
    assert get_policy("open").apply(f)[0].severity is Severity.WARN


@pytest.mark.parametrize("rule", [R.MODULE_PATCHING, R.ENVIRONMENT_ACCESS, R.STREAM_CREATION, R.THREAD_CREATION,
                                  R.PROCESS_CREATION, R.REFERENCE_CALL, R.REFERENCE_SUBCLASS, R.FORWARD_REBINDING,
                                  R.THREAD_SETTING_CHANGE, R.FILE_ACCESS, R.INTROSPECTION, R.TENSOR_SUBCLASS])
def test_open_still_rejects_hacks(rule):
    assert get_policy("open").severity(rule) is Severity.REJECT


@pytest.mark.parametrize("rule", [R.OUTPUT_CACHING, R.BACKEND_SETTING_CHANGE, R.REDUCED_PRECISION_COMPUTE,
                                  R.PRECISION_CHANGE, R.ENVIRONMENT_WRITE, R.FAST_MATH])
def test_open_only_warns_on_pytorch_level_choices(rule):
    assert get_policy("open").severity(rule) is Severity.WARN


def test_one_precision_policy_tf32_flags_and_reduced_precision_compute_agree():
    for name in POLICY_NAMES:
        p = get_policy(name)
        assert p.severity(R.PRECISION_CHANGE) is p.severity(R.REDUCED_PRECISION_COMPUTE), name
    assert get_policy("strict").severity(R.PRECISION_CHANGE) is Severity.REJECT
    assert get_policy("open").severity(R.PRECISION_CHANGE) is Severity.WARN


LLM_JUDGE_RULES = {R.LLM_JUDGE, R.LLM_JUDGE_UNSURE, R.LLM_JUDGE_UNAVAILABLE}
# Measured, but not proof of a hack: a cheaper algorithm beats the compute floor, and a precision
# flag in the candidate's own process is the same choice as autocast (the one precision policy), and a
# backend flag there the same choice as one seen in its source.
JUDGED_BY_POLICY = {R.COMPUTE_FLOOR_BEATEN, R.PRECISION_STATE_CHANGED, R.BACKEND_STATE_CHANGED,
                    R.INIT_OR_SHAPE_TAMPERED}


def test_observe_warns_on_every_static_rule_and_rejects_every_measured_dynamic_rule():
    p = get_policy("observe")
    for rule in set(R.STATIC_RULES) - {R.NO_CUSTOM_KERNEL}:
        assert p.severity(rule) is Severity.WARN
    for name in POLICY_NAMES:
        for rule in set(R.DYNAMIC_RULES) - LLM_JUDGE_RULES - JUDGED_BY_POLICY:
            assert get_policy(name).severity(rule) is Severity.REJECT


def test_the_compute_floor_warns_and_precision_state_follows_the_precision_policy():
    for name in POLICY_NAMES:
        assert get_policy(name).severity(R.COMPUTE_FLOOR_BEATEN) is Severity.WARN
    assert get_policy("strict").severity(R.PRECISION_STATE_CHANGED) is Severity.REJECT
    assert get_policy("open").severity(R.PRECISION_STATE_CHANGED) is Severity.WARN


def test_a_backend_flag_left_on_is_judged_like_the_same_flag_seen_in_the_source():
    for name in POLICY_NAMES:
        p = get_policy(name)
        if name != "observe":  # observe lets only measured defences decide; static rules all warn there
            assert p.severity(R.BACKEND_STATE_CHANGED) is p.severity(R.BACKEND_SETTING_CHANGE), name
    assert get_policy("observe").severity(R.BACKEND_STATE_CHANGED) is Severity.WARN
    assert get_policy("strict").severity(R.BACKEND_STATE_CHANGED) is Severity.REJECT
    # thread counts and the default dtype are not backend choices: refused under every policy
    for name in POLICY_NAMES:
        assert get_policy(name).severity(R.GLOBAL_STATE_CHANGED) is Severity.REJECT


def test_llm_judge_rejects_only_under_strict_and_its_doubts_and_outages_only_warn():
    assert set(R.DYNAMIC_RULES) >= LLM_JUDGE_RULES
    assert get_policy("strict").severity(R.LLM_JUDGE) is Severity.REJECT
    assert get_policy("open").severity(R.LLM_JUDGE) is Severity.WARN
    assert get_policy("observe").severity(R.LLM_JUDGE) is Severity.WARN
    for name in POLICY_NAMES:
        for rule in (R.LLM_JUDGE_UNSURE, R.LLM_JUDGE_UNAVAILABLE):
            assert get_policy(name).severity(rule) is Severity.WARN


def test_apply_returns_new_findings_and_keeps_unknown_rules():
    original = [finding(R.OUTPUT_CACHING, Severity.WARN), finding("some_future_rule", Severity.WARN, "dynamic")]
    applied = get_policy("strict").apply(original)
    assert applied[0].severity is Severity.WARN and applied[1].severity is Severity.WARN
    escalated = get_policy("strict").apply([finding(R.BACKEND_SETTING_CHANGE, Severity.WARN)])
    assert escalated[0].severity is Severity.REJECT
    assert original[0].severity is Severity.WARN  # inputs untouched (frozen findings)


@pytest.mark.parametrize("kwargs,match", [
    (dict(reject={"no_such_rule"}, warn=set()), "unknown rule"),
    (dict(reject={R.FILE_ACCESS}, warn={R.FILE_ACCESS}), "more than one severity"),
    (dict(reject=set(), warn=set(), requires_custom_kernel=True), "requires_custom_kernel"),
])
def test_policy_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Policy(name="bad", description="", **kwargs)


def test_get_policy_passes_a_policy_through():
    p = get_policy("open")
    assert get_policy(p) is p
