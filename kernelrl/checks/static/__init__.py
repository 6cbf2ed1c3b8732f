"""Static checks: named rules run on a candidate's syntax tree before anything executes.

`check_source(source, task_source=None)` gives the findings (`scan.py`); `CHECKS` maps each
static rule name to its `Check` (the `Rule` from `kernelrl.checks.rules` and its function);
`has_custom_kernel(source)` says whether the program builds or defines a real kernel. One module
per rule family, each saying what its rules catch and what they leave to the dynamic defences;
`syntax.py` and `source.py` hold what every family asks of a syntax tree. The module table is in
`kernelrl/checks/README.md`, the layering in this folder's README.
"""

from kernelrl.checks.static.kernels import has_custom_kernel
from kernelrl.checks.static.registry import CHECKS
from kernelrl.checks.static.scan import check_source

__all__ = ["CHECKS", "check_source", "has_custom_kernel"]
