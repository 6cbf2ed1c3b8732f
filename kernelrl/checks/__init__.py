"""Checks on candidates: static rules on the source, and the names of the evaluator's dynamic rules.

`kernelrl.checks.static.check_source(source)` runs the static rules; `kernelrl.checks.rules`
lists every rule name (static and dynamic) with a description and a default severity.
Policies (`kernelrl.checks.policy`) decide which rules reject and which only warn.
"""

from kernelrl.checks.rules import DYNAMIC_RULES, RULES, STATIC_RULES, Rule
from kernelrl.checks.static import CHECKS, check_source, has_custom_kernel

__all__ = ["CHECKS", "DYNAMIC_RULES", "RULES", "STATIC_RULES", "Rule", "check_source", "has_custom_kernel"]
