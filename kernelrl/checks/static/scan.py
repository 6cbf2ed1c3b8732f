"""`check_source`: every static rule run on one candidate, its hits turned into findings.

Guarantees: never executes, imports or compiles the candidate; it parses it with `ast` once and
runs every rule family registered in `CHECKS` (each module imported below registers its rules).
Findings carry `stage="static"`, the rule's default severity, a message for a person and the
line; a hit repeated by one rule (same line, same message) is reported once; findings are
sorted by line, then rule, so their order does not depend on the order rules run in.
Unparsable source gives exactly one finding, rule `syntax_error`. The rules stop at a deadline
(`DEADLINE_S`, checked between rules): a source whose checks run past it gets a rejecting
`syntax_error` finding saying so, a verdict rather than a stalled judge.

Does not guarantee soundness: Python can hide anything from a syntax tree (strings decoded at run
time, attribute names computed from data). Such hiding needs one of the primitives
`introspection`, `dynamic_code` and `dynamic_import` refuse, and the dynamic checks in the
evaluator are the defence that does not depend on reading code.
"""

from __future__ import annotations

import time

from kernelrl import syntax
from kernelrl.checks import rules as R

# Each rule family registers its rules in CHECKS when imported.
from kernelrl.checks.static import (  # noqa: F401
    caching,
    concurrency,
    environment,
    files,
    imports,
    introspection,
    kernels,
    patching,
    processes,
    reference,
    settings,
    text,
)
from kernelrl.checks.static.precision import task_computes_in_reduced_precision
from kernelrl.checks.static.registry import CHECKS
from kernelrl.checks.static.source import SourceInfo
from kernelrl.result import Finding, Severity

# Every rule is linear in the source (tests/serve/test_linear_inputs.py: about 6 s at the 256 KiB
# limit on the worst text found); the deadline bounds what a rule missed there could cost.
DEADLINE_S = 30.0


def check_source(source: str, *, task_source: str | None = None,
                 deadline_s: float | None = DEADLINE_S) -> list[Finding]:
    """Run every registered static check; findings carry the rule's default severity.

    With `task_source` (the task's reference program), reduced-precision compute is not reported
    when the reference itself computes in fp16/bf16: the candidate is then at the task's precision.
    When the rules run past `deadline_s` (None: no deadline), the rest are not run and a
    rejecting `syntax_error` finding says so: a source that costly to read is refused.
    """
    started = time.monotonic()
    try:
        tree = syntax.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:  # ValueError: null bytes in source
        line = getattr(e, "lineno", None)
        return [Finding(rule=R.SYNTAX_ERROR, message=f"source does not parse: {e.__class__.__name__}: "
                        f"{getattr(e, 'msg', e)}", severity=Severity.REJECT, stage="static", line=line)]
    info = SourceInfo(tree, source)
    findings: list[Finding] = []
    seen: set[tuple[str, int | None, str]] = set()
    for check in CHECKS.values():
        if deadline_s is not None and time.monotonic() - started > deadline_s:
            findings.append(Finding(rule=R.SYNTAX_ERROR, message=f"the static checks ran past their deadline of "
                                    f"{deadline_s:g} s (stopped before {check.name}): a source this costly to read "
                                    "is refused", severity=Severity.REJECT, stage="static", line=None))
            break
        for hit in check.run(info):
            key = (check.name, hit.line, hit.message)
            if key in seen:
                continue
            seen.add(key)
            findings.append(Finding(rule=check.name, message=hit.message, severity=check.rule.severity,
                                    stage="static", line=hit.line))
    if task_source is not None and task_computes_in_reduced_precision(task_source):
        findings = [f for f in findings if f.rule != R.REDUCED_PRECISION_COMPUTE]
    findings.sort(key=lambda f: (f.line or 0, f.rule))
    return findings
