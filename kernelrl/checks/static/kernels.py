"""Native code a candidate carries: its custom kernels, and the C++/CUDA sources other rules read.

Rule: `no_custom_kernel` (ignored under `open`, rejects under `strict`) fires when the program
builds or defines no real kernel. Counted as real: `load_inline` whose CUDA source has a
`__global__` function or whose C++ source has a loop, `parallel_for`, raw `data_ptr`/accessor
access, SIMD intrinsics or OpenMP; `cpp_extension.load` (sources from files); `@triton.jit`/
`autotune`/`heuristics`, numba `jit`/`njit`/`cuda.jit`, tilelang and helion kernels, cupy
Raw/Elementwise/Reduction kernels and `torch.cuda.jiterator`. Sources held in variables,
f-strings, concatenations and lists are followed. `has_custom_kernel` answers the same question
for callers outside the rules. `cpp_sources` gives every string constant that holds C/C++/CUDA
code (comments removed, in linear time: `strip_c_comments`), for the stream and dynamic-code rules.

Does not catch: a C++ source that only calls ATen (`torch::matmul`) is a wrapper, not a kernel;
a source the tree cannot read (built by a function, read from disk) gets the benefit of the doubt
and counts as real, since the strict policy is about fallbacks, not about proving a kernel.
Whether a kernel is used, or fast, is the judge's business.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass

from kernelrl import syntax
from kernelrl.checks import rules as R
from kernelrl.checks.static.registry import Hit, register
from kernelrl.checks.static.source import SourceInfo
from kernelrl.checks.static.syntax import call_arg, line_of, string_value, under

_LOADERS = ("torch.utils.cpp_extension.load_inline", "torch.utils.cpp_extension.load")
_KERNEL_DECORATORS = ("triton.jit", "triton.autotune", "triton.heuristics", "numba.cuda.jit", "numba.njit",
                      "numba.jit", "cuda.jit", "tilelang.jit", "helion.kernel")
_KERNEL_CALLS = ("cupy.RawKernel", "cupy.RawModule", "cupy.ElementwiseKernel", "cupy.ReductionKernel",
                 "torch.cuda.jiterator._create_jit_fn", "torch.cuda.jiterator._create_multi_output_jit_fn")
_COMMENT_START = re.compile(r"/[/*]")
_REAL_CPP = re.compile(r"\bfor\s*\(|\bwhile\s*\(|parallel_for|data_ptr|\.accessor<|packed_accessor|__m\d+|"
                       r"_mm\d*_|#pragma\s+omp|\bvec_\w+|at::vec::", re.IGNORECASE)
# What makes a string constant C/C++/CUDA code.
_CPP_MARKER = re.compile(r"#include|__global__|\btorch::|PYBIND11_MODULE|\bat::Tensor\b")


@dataclass(frozen=True)
class KernelInfo:
    kind: str  # "cpp", "cuda", "triton", ...
    line: int | None
    real: bool  # False: the extension only calls ATen ops
    note: str = ""


def strip_c_comments(text: str) -> str:
    """`text` without its `// ...` and `/* ... */` comments, in time linear in its length.

    The same text as `re.sub(r"//[^\\n]*|/\\*.*?\\*/", "", text, flags=re.DOTALL)`, whose lazy
    pattern is quadratic on comments that open and never close (each `/*` read to the end): an
    unclosed `/*` stays as text, as there, and once one `/*` has found no `*/` after it, none of
    the later ones is looked for again.
    """
    out: list[str] = []
    pos = 0
    unclosed_after = len(text) + 1  # no "*/" starts at or after this index
    while (m := _COMMENT_START.search(text, pos)) is not None:
        start = m.start()
        if text[start + 1] == "/":
            end = text.find("\n", start + 2)
            out.append(text[pos:start])
            pos = len(text) if end < 0 else end
            continue
        close = text.find("*/", start + 2) if start + 2 < unclosed_after else -1
        if close < 0:
            unclosed_after = min(unclosed_after, start + 2)
            out.append(text[pos:start + 1])  # the "/" stays; the scan goes on after it
            pos = start + 1
            continue
        out.append(text[pos:start])
        pos = close + 2
    out.append(text[pos:])
    return "".join(out)


def cpp_sources(src: SourceInfo) -> Iterator[tuple[ast.AST, str]]:
    """String constants that hold C/C++/CUDA code, with their comments removed."""
    for node in ast.walk(src.tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _CPP_MARKER.search(node.value):
            yield node, strip_c_comments(node.value)


def custom_kernels(src: SourceInfo) -> list[KernelInfo]:
    out: list[KernelInfo] = []
    for node, q in src.calls():
        if q in _LOADERS or q.endswith("cpp_extension.load_inline") or q.endswith("cpp_extension.load"):
            if q.endswith(".load"):
                out.append(KernelInfo(kind="cpp", line=line_of(node), real=True, note="sources from files"))
                continue
            cpp = call_arg(node, "cpp_sources", 1)
            cuda = call_arg(node, "cuda_sources", 2)
            cpp_text = string_value(cpp, src.strings) if cpp is not None else None
            cuda_text = string_value(cuda, src.strings) if cuda is not None else None
            if cpp_text is None and cuda_text is None:
                # Built from something the tree cannot read (a file, a function): give the benefit
                # of the doubt; the strict policy is about fallbacks, not about proving a kernel.
                out.append(KernelInfo(kind="cpp", line=line_of(node), real=True, note="source not resolvable"))
                continue
            cuda_code = strip_c_comments(cuda_text or "")
            cpp_code = strip_c_comments(cpp_text or "")
            if "__global__" in cuda_code:
                out.append(KernelInfo(kind="cuda", line=line_of(node), real=True))
            elif _REAL_CPP.search(cpp_code) or _REAL_CPP.search(cuda_code):
                out.append(KernelInfo(kind="cpp", line=line_of(node), real=True))
            else:
                out.append(KernelInfo(kind="cpp", line=line_of(node), real=False,
                                      note="the extension only calls ATen/torch ops"))
        elif under(q, _KERNEL_CALLS):
            out.append(KernelInfo(kind=q.split(".")[0], line=line_of(node), real=True))
    for fn in ast.walk(src.tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in fn.decorator_list:
                q = src.qualname(d.func if isinstance(d, ast.Call) else d) or ""
                if under(q, _KERNEL_DECORATORS):
                    out.append(KernelInfo(kind=q.split(".")[0], line=line_of(fn), real=True))
    return out


def has_custom_kernel(source: str) -> bool:
    """True when the source builds or defines at least one real custom kernel (see `no_custom_kernel`)."""
    try:
        tree = syntax.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return any(k.real for k in custom_kernels(SourceInfo(tree, source)))


@register(R.NO_CUSTOM_KERNEL)
def _no_custom_kernel(src: SourceInfo) -> Iterator[Hit]:
    kernels = custom_kernels(src)
    if any(k.real for k in kernels):
        return
    if kernels:
        yield Hit(kernels[0].line, f"no custom kernel: {kernels[0].note}")
    else:
        yield Hit(None, "no custom kernel (load_inline with C++/CUDA code, a Triton kernel, numba/cupy kernel)")
