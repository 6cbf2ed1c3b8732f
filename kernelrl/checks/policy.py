"""Policies: which checks reject a candidate and which only warn.

Guarantees:
- A `Policy` names every rule it rejects, warns on or ignores; the three sets are disjoint and
  only hold names from `kernelrl.checks.rules`; any rule a policy does not mention keeps the
  severity it was emitted with.
- `Policy.apply(findings)` returns new findings with the policy's severities (ignored rules
  dropped); it never adds or invents findings.
- Named policies (`get_policy`):
  - `strict`: KernelBench-style. The candidate must contain a real custom kernel (load_inline with
    C++/CUDA code that does more than call ATen, a Triton/numba/cupy kernel), may not fall back
    to PyTorch in an except branch, and computes at the task's precision (TF32 flags, autocast
    and half compute all reject). Everything that touches shared state or the outside world
    rejects.
  - `strict-pytorch`: `strict` without the custom-kernel requirement: a PyTorch-level rewrite is
    an answer, and every other rule rejects exactly as under `strict` (a fallback in an except
    branch, computing below the task's precision, backend settings, the LLM judge's hack
    verdict). For training a policy that writes PyTorch (the CPU smoke configs) with every hack
    defence refusing: under `strict` such a policy's answers would all be refused alike and give
    no gradient; under `open` a fallback, a precision change or a judged hack would be paid.
  - `open`: any PyTorch-level rewrite is allowed (torch.compile, channels_last, library calls,
    plain torch ops, a torch fallback in an except branch, cudnn.benchmark); computing below the
    task's precision (TF32 flags, autocast, half compute) warns and the tolerance decides.
    Rebinding torch or timer attributes or a module's forward, reading the environment, unjoined
    side streams, threads, processes, files outside the candidate's own folders, changing thread
    counts, calling or subclassing the reference still reject.
  - `observe`: every static rule only warns; dynamic rules keep their verdicts. For measuring the
    dynamic defences on their own (the red-team suite does) and for audits that count without
    refusing.
- Dynamic rules (emitted by the evaluator) reject under every named policy, except the LLM
  judge's: `llm_judge` (a model says the speedup is a hack) rejects under `strict` and
  `strict-pytorch` and warns under `open` and `observe`; `llm_judge_unsure` and
  `llm_judge_unavailable` warn under every policy.

Does not decide correctness or timing: a policy only sets severities; the evaluator turns a
rejecting finding into the FLAGGED status.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable
from dataclasses import dataclass

from kernelrl.checks import rules as R
from kernelrl.result import Finding, Severity


class PolicyName(enum.StrEnum):
    STRICT = "strict"
    STRICT_PYTORCH = "strict-pytorch"
    OPEN = "open"
    OBSERVE = "observe"


POLICY_NAMES = tuple(PolicyName)


@dataclass(frozen=True, kw_only=True)
class Policy:
    name: str
    description: str
    reject: frozenset[str]
    warn: frozenset[str]
    ignore: frozenset[str] = frozenset()
    requires_custom_kernel: bool = False

    def __post_init__(self) -> None:
        for label in ("reject", "warn", "ignore"):
            names = getattr(self, label)
            if not isinstance(names, frozenset):
                object.__setattr__(self, label, frozenset(names))
        unknown = (self.reject | self.warn | self.ignore) - set(R.RULES)
        if unknown:
            raise ValueError(f"policy {self.name}: unknown rule(s) {sorted(unknown)}")
        overlap = (self.reject & self.warn) | (self.reject & self.ignore) | (self.warn & self.ignore)
        if overlap:
            raise ValueError(f"policy {self.name}: rule(s) {sorted(overlap)} given more than one severity")
        if self.requires_custom_kernel != (R.NO_CUSTOM_KERNEL in self.reject):
            raise ValueError(f"policy {self.name}: requires_custom_kernel must match whether "
                             f"{R.NO_CUSTOM_KERNEL} rejects")

    def severity(self, rule: str) -> Severity | None:
        """The policy's severity for a rule; None when the policy ignores it or does not mention it."""
        if rule in self.reject:
            return Severity.REJECT
        if rule in self.warn:
            return Severity.WARN
        return None

    def apply(self, findings: Iterable[Finding]) -> list[Finding]:
        out = []
        for f in findings:
            if f.rule in self.ignore:
                continue
            sev = self.severity(f.rule)
            out.append(f if sev is None or sev is f.severity else dataclasses.replace(f, severity=sev))
        return out

    def rejects(self, findings: Iterable[Finding]) -> list[Finding]:
        """The findings that make the verdict FLAGGED under this policy."""
        return [f for f in self.apply(findings) if f.severity is Severity.REJECT]


_ALWAYS_WARN = frozenset({R.OUTPUT_CACHING, R.ENVIRONMENT_WRITE, R.RNG_SEEDING, R.FAST_MATH})
# One precision policy for every way of computing below the task's precision (TF32 and matmul
# precision flags, autocast, .half()/.bfloat16()): under `open` they warn and the dtype-aware
# tolerance decides, since fp32's 1e-4 is what separates a harmless choice from a wrong answer;
# under `strict` they reject, since a KernelBench-style kernel must compute at the task's
# precision. A precision flag the candidate leaves on in its own process is the same choice, seen at
# run time (`precision_state_changed`); thread counts and the default dtype left changed are
# `global_state_changed` and refused everywhere (backend flags: `_BACKEND` below).
_PRECISION = frozenset({R.PRECISION_CHANGE, R.REDUCED_PRECISION_COMPUTE, R.PRECISION_STATE_CHANGED})
# Beating the compute floor but not the memory floor is what a cheaper algorithm does (an exact
# simplification that skips FLOPs the reference spends) as well as what a hack does: a warning
# everywhere, and a reason for the LLM judge to look; the memory floor is the hard one.
# A candidate that copied the task's size constants with other values is run at the task's sizes
# anyway: reported, never a reason to refuse.
_DYNAMIC_WARN = frozenset({R.COMPUTE_FLOOR_BEATEN, R.INIT_OR_SHAPE_TAMPERED})
# Allowed under `open` because they are PyTorch-level choices, not hacks: a torch fallback in an
# except branch still computes the right answer in the candidate's own time, and backend flags
# (cuDNN autotuning, determinism, oneDNN) change only the candidate's own worker, whether seen in
# its source or left changed at run time (backend_state_changed). `strict` refuses both.
_BACKEND = frozenset({R.BACKEND_SETTING_CHANGE, R.BACKEND_STATE_CHANGED})
_OPEN_WARN = _ALWAYS_WARN | _PRECISION | _BACKEND | {R.TRY_FALLBACK}
# The LLM judge gives an opinion, not a measurement. `strict` refuses what it calls a hack (CUDA-L1
# used such a judge as a gate on suspicious scores); `open` allows rewrites a reviewer can mistake
# for skipped work, and `observe` measures the mechanical defences alone, so both only warn. Its
# doubts and its outages warn everywhere: the reward must not hinge on a flaky endpoint.
_LLM_JUDGE_NOTES = frozenset({R.LLM_JUDGE_UNSURE, R.LLM_JUDGE_UNAVAILABLE})
_LLM_JUDGE = frozenset({R.LLM_JUDGE}) | _LLM_JUDGE_NOTES
_DYNAMIC = frozenset(R.DYNAMIC_RULES) - _LLM_JUDGE - _DYNAMIC_WARN - {R.PRECISION_STATE_CHANGED, R.BACKEND_STATE_CHANGED}
_STATIC = frozenset(R.STATIC_RULES)

STRICT = Policy(
    name="strict",
    description="KernelBench-style: needs a real custom kernel, no PyTorch fallback",
    reject=(_STATIC - _ALWAYS_WARN) | _DYNAMIC | {R.LLM_JUDGE, R.PRECISION_STATE_CHANGED, R.BACKEND_STATE_CHANGED},
    warn=_ALWAYS_WARN | _LLM_JUDGE_NOTES | _DYNAMIC_WARN,
    requires_custom_kernel=True,
)
STRICT_PYTORCH = Policy(
    name="strict-pytorch",
    description="strict's defences, but a PyTorch-level rewrite is an answer (no custom kernel needed)",
    reject=STRICT.reject - {R.NO_CUSTOM_KERNEL},
    warn=STRICT.warn,
    ignore=frozenset({R.NO_CUSTOM_KERNEL}),
)
OPEN = Policy(
    name="open",
    description="any PyTorch-level rewrite allowed; shared state, the outside world and the reference are not",
    reject=(_STATIC - _OPEN_WARN - {R.NO_CUSTOM_KERNEL}) | _DYNAMIC,
    warn=_OPEN_WARN | _LLM_JUDGE | _DYNAMIC_WARN,
    ignore=frozenset({R.NO_CUSTOM_KERNEL}),
)
OBSERVE = Policy(
    name="observe",
    description="static rules only warn; dynamic defences decide (for testing defences and auditing)",
    reject=_DYNAMIC,
    warn=(_STATIC - {R.NO_CUSTOM_KERNEL}) | _LLM_JUDGE | _DYNAMIC_WARN | {R.PRECISION_STATE_CHANGED,
                                                                          R.BACKEND_STATE_CHANGED},
    ignore=frozenset({R.NO_CUSTOM_KERNEL}),
)

_POLICIES = {p.name: p for p in (STRICT, STRICT_PYTORCH, OPEN, OBSERVE)}


def get_policy(name: str | Policy) -> Policy:
    if isinstance(name, Policy):
        return name
    try:
        return _POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; expected one of {', '.join(POLICY_NAMES)}") from None
