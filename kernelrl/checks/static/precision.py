"""Computing below the task's precision, and compiling with relaxed float semantics.

Rules:
- `reduced_precision_compute` (warns under `open`, rejects under `strict`, like
  `precision_change` in `settings.py`: one precision policy): `torch.float16`/`half`/
  `bfloat16`/`float8_e4m3fn`/`float8_e5m2` named anywhere, autocast (`torch.autocast`,
  `torch.*.amp.autocast`), `.half()` and `.bfloat16()`, and Triton's `tl.float16`/`tl.bfloat16`/
  fp8 types inside kernels. On a task whose reference itself names a reduced-precision dtype
  (`task_computes_in_reduced_precision`, applied by `check_source` when given `task_source`) the
  candidate is at the task's precision and the rule is dropped.
- `fast_math` (warns under every policy): `--use_fast_math`, `-use_fast_math`, `-ffast-math` or
  `-Ofast` as a string the program uses (build flags); they relax IEEE corner cases, not the
  storage precision.

Does not catch: reduced precision reached through a dtype computed at run time
(`getattr(torch, name)`), inside native code (`__half` in a CUDA source), or flags spelt inside a
longer string. The dtype-aware tolerance decides whether the answer is still right under
`open`, and the dynamic `precision_state_changed` sees precision flags left on in the process.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from kernelrl.checks import rules as R
from kernelrl.checks.static.registry import Hit, register
from kernelrl.checks.static.source import SourceInfo
from kernelrl.checks.static.syntax import line_of, under

# A task whose reference names a reduced-precision dtype computes in it itself.
_REDUCED_DTYPES = re.compile(r"\b(float16|half|bfloat16|float8_\w+)\b")
_FAST_MATH_FLAGS = ("--use_fast_math", "-use_fast_math", "-ffast-math", "-Ofast")


def task_computes_in_reduced_precision(task_source: str) -> bool:
    """Whether the task's reference program names fp16, bf16 or fp8 (read as text, not parsed)."""
    return _REDUCED_DTYPES.search(task_source) is not None


@register(R.REDUCED_PRECISION_COMPUTE)
def _reduced_precision(src: SourceInfo) -> Iterator[Hit]:
    low = ("torch.float16", "torch.half", "torch.bfloat16", "torch.float8_e4m3fn", "torch.float8_e5m2",
           # inside Triton kernels: `tl.float16` and friends (a cast in the kernel lowers the compute)
           "triton.language.float16", "triton.language.bfloat16", "triton.language.float8e4nv",
           "triton.language.float8e5", "triton.language.float8e4b15", "triton.language.float8e4b8",
           "triton.language.float8e5b16")
    autocast = ("torch.autocast", "torch.cuda.amp.autocast", "torch.cpu.amp.autocast", "torch.amp.autocast")
    for ref, q in src.refs():
        if q in low:
            yield Hit(line_of(ref), f"uses {q}")
    for call, q in src.calls():
        if under(q, autocast):
            yield Hit(line_of(call), f"{q}() runs ops in reduced precision")
    for node in ast.walk(src.tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("half", "bfloat16") \
                and not node.args:
            yield Hit(line_of(node), f".{node.func.attr}() converts to reduced precision")


@register(R.FAST_MATH)
def _fast_math(src: SourceInfo) -> Iterator[Hit]:
    for node in ast.walk(src.tree):
        text = src.code_string(node)
        if text is not None and text.strip() in _FAST_MATH_FLAGS:
            yield Hit(line_of(node), f"compiles with {text.strip()}, which relaxes IEEE float semantics")
