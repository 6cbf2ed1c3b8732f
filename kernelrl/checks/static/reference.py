"""The reference program, and PyTorch fallbacks that stand in for a kernel.

Rules:
- `reference_call`: any use of `Model` (a call, an instance, a load of the name, `getattr(m,
  "Model")` or `x["Model"]`), and `super().forward(...)` (or `__call__`, `_call_impl`) in a class
  that inherits from `Model`. Defining a class named `Model` without using it is no finding.
- `reference_subclass`: a class inheriting from `Model`.
- `reference_import`: `from x import Model`, star imports of modules other than torch, triton,
  numpy and a few standard ones, and modules named like a task (`model`, `reference`, `levelN`,
  `problem`, `baseline`, ...), torch's own excepted.
- `try_fallback` (warns under `open`, rejects under `strict`): a `try` whose `except` branch
  computes with PyTorch (calls into `torch.*` other than device queries and synchronisation, a
  tensor math method, `@`, a `self.X` the class bound to a `torch.nn` module, the reference, or
  `super().forward`), or whose body returns while an `except` branch swallows the error and the
  statements after the `try` compute with PyTorch. A branch that only imports, sets flags, logs
  or re-raises is no fallback, so `try: import triton / except ImportError: triton = None` passes.

Does not catch: the reference reached under another name (`M = globals()["Mod" + "el"]`: that
needs a primitive `introspection` or `dynamic_code` refuses), a task module imported under a
name that does not look like one, fallbacks through helpers defined elsewhere that hide their
torch calls. The judge runs the reference in its own process, out of the candidate's reach.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from kernelrl.checks import rules as R
from kernelrl.checks.static.registry import Hit, register
from kernelrl.checks.static.source import SourceInfo
from kernelrl.checks.static.syntax import line_of, under


def _is_reference_name(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "Model") \
        or (isinstance(node, ast.Attribute) and node.attr == "Model")


@register(R.REFERENCE_SUBCLASS)
def _reference_subclass(src: SourceInfo) -> Iterator[Hit]:
    for node in ast.walk(src.tree):
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                if _is_reference_name(base):
                    yield Hit(line_of(node), f"class {node.name} inherits from the reference Model")


@register(R.REFERENCE_CALL)
def _reference_call(src: SourceInfo) -> Iterator[Hit]:
    bases = {id(b) for n in ast.walk(src.tree) if isinstance(n, ast.ClassDef) for b in n.bases}
    subclasses = {n.name for n in ast.walk(src.tree) if isinstance(n, ast.ClassDef)
                  and any(_is_reference_name(b) for b in n.bases)}
    for node in ast.walk(src.tree):
        if _is_reference_name(node) and id(node) not in bases:
            ctx = getattr(node, "ctx", None)
            if isinstance(ctx, ast.Load):
                yield Hit(line_of(node), "refers to the reference `Model`; the candidate must not run the reference")
        elif isinstance(node, ast.Constant) and node.value == "Model":
            parent = src.parents.get(node)
            if isinstance(parent, (ast.Call, ast.Subscript)):
                yield Hit(line_of(node), "looks up the reference `Model` by name")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                "forward", "__call__", "_call_impl"):
            inner = node.func.value
            if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name) and inner.func.id == "super":
                cls = src.enclosing(node, (ast.ClassDef,))
                if isinstance(cls, ast.ClassDef) and cls.name in subclasses:
                    yield Hit(line_of(node), "calls the reference's forward through super()")


_TASK_MODULE = re.compile(r"(^|\.)(model|models|task|tasks|ref|reference|problem|problems|kernelbench|"
                          r"level\d+|original|baseline)$", re.IGNORECASE)
_KNOWN_STAR_SOURCES = ("torch", "triton", "numpy", "math", "typing", "functools", "itertools")


@register(R.REFERENCE_IMPORT)
def _reference_import(src: SourceInfo) -> Iterator[Hit]:
    for node in ast.walk(src.tree):
        if isinstance(node, ast.ImportFrom):
            mod = ("." * node.level) + (node.module or "")
            for a in node.names:
                if a.name == "Model":
                    yield Hit(line_of(node), f"imports Model from {mod}")
                elif a.name == "*" and not under(node.module or "", _KNOWN_STAR_SOURCES):
                    yield Hit(line_of(node), f"star-imports {mod}, which could bring in the reference Model")
            if node.module and _TASK_MODULE.search(node.module) and not node.module.startswith("torch"):
                yield Hit(line_of(node), f"imports from {mod}, which looks like the task's reference module")
        elif isinstance(node, ast.Import):
            for a in node.names:
                if _TASK_MODULE.search(a.name) and not a.name.startswith("torch"):
                    yield Hit(line_of(node), f"imports {a.name}, which looks like the task's reference module")


# Calls into torch that do not compute on tensors (device queries, synchronisation, dtypes, RNG state)
_TORCH_NON_COMPUTE = re.compile(
    r"^torch\.(cuda\.(synchronize|is_available|current_device|device_count|get_device_\w+|"
    r"current_stream|empty_cache|set_device)|device|dtype|is_tensor|get_default_dtype|__version__|"
    r"utils\.cpp_extension(\..*)?|_assert|is_grad_enabled|version(\..*)?)$")
_TENSOR_MATH_METHODS = frozenset({
    "matmul", "mm", "bmm", "addmm", "baddbmm", "einsum", "sum", "mean", "relu", "relu_", "sigmoid", "tanh",
    "softmax", "log_softmax", "exp", "log", "mul", "add", "sub", "div", "pow", "sqrt", "rsqrt", "conv1d", "conv2d",
    "conv3d", "clamp", "clamp_", "max", "min", "amax", "amin", "norm", "var", "std", "gelu", "silu", "linear",
    "layer_norm", "cumsum", "prod", "abs", "neg", "reciprocal", "square", "exp2", "erf", "dot", "mv", "outer",
    "tril", "triu", "where", "masked_fill", "softplus", "logsumexp", "argmax", "argmin", "topk", "sort"})


def _nn_module_attrs(src: SourceInfo) -> set[str]:
    """`self.X` attributes bound to torch.nn modules (a fallback can call them)."""
    out = set()
    for node in ast.walk(src.tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            q = src.qualname(node.value.func) or ""
            if q.startswith("torch.nn.") and q[len("torch.nn."):][:1].isupper():
                for t in node.targets:
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                        out.add(t.attr)
    return out


def _computes(src: SourceInfo, stmts: list[ast.stmt], nn_attrs: set[str]) -> str | None:
    """What PyTorch-level computation these statements do, or None."""
    for stmt in stmts:
        for node in ast.walk(stmt):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
                return "a matrix product (@)"
            if isinstance(node, (ast.Name, ast.Attribute)) and _is_reference_name(node) \
                    and isinstance(getattr(node, "ctx", None), ast.Load):
                return "the reference Model"
            if not isinstance(node, ast.Call):
                continue
            q = src.qualname(node.func)
            if q and q.startswith("torch.") and "()" not in q and not _TORCH_NON_COMPUTE.match(q):
                return f"{q}()"
            f = node.func
            if isinstance(f, ast.Attribute):
                if isinstance(f.value, ast.Call) and isinstance(f.value.func, ast.Name) and f.value.func.id == "super":
                    return f"super().{f.attr}()"
                if f.attr in _TENSOR_MATH_METHODS and not (q and not q.startswith("torch.")):
                    return f".{f.attr}()"
                if isinstance(f.value, ast.Name) and f.value.id == "self" and f.attr in nn_attrs:
                    return f"self.{f.attr} (a torch.nn module)"
    return None


def _terminates(stmts: list[ast.stmt]) -> bool:
    return bool(stmts) and isinstance(stmts[-1], (ast.Raise, ast.Return, ast.Continue, ast.Break))


def _statement_lists(node: ast.AST) -> Iterator[list[ast.stmt]]:
    for field in ("body", "orelse", "finalbody"):
        value = getattr(node, field, None)
        if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
            yield value
    for h in getattr(node, "handlers", []) or []:
        yield h.body
    for c in getattr(node, "cases", []) or []:
        yield c.body


@register(R.TRY_FALLBACK)
def _try_fallback(src: SourceInfo) -> Iterator[Hit]:
    nn_attrs = _nn_module_attrs(src)
    try_types = (ast.Try, ast.TryStar) if hasattr(ast, "TryStar") else (ast.Try,)
    for parent in ast.walk(src.tree):
        for block in _statement_lists(parent):
            for i, stmt in enumerate(block):
                if not isinstance(stmt, try_types):
                    continue
                for h in stmt.handlers:
                    what = _computes(src, h.body, nn_attrs)
                    if what:
                        yield Hit(line_of(h), f"except branch computes with {what}: a fallback that hides a "
                                              "failing kernel")
                body_returns = any(isinstance(n, ast.Return) for s in stmt.body for n in ast.walk(s))
                swallows = any(not _terminates(h.body) for h in stmt.handlers)
                if body_returns and swallows:
                    what = _computes(src, block[i + 1:], nn_attrs)
                    if what:
                        yield Hit(line_of(stmt), f"exception swallowed, then the code after the try computes with "
                                                 f"{what}: a fallback that hides a failing kernel")
