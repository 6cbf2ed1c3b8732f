"""Static checks: named rules run on a candidate's syntax tree before anything executes.

Guarantees:
- `check_source(source)` never executes, imports or compiles the candidate; it parses it with
  `ast` and returns `Finding`s with `stage="static"`, the rule name, a message for a person and
  the line. Unparsable source gives exactly one finding, rule `syntax_error`.
- Every rule is registered in `CHECKS` (name -> `Check`), so policies refer to rules by name
  (`kernelrl.checks.rules` holds names, descriptions and default severities).
- Names are resolved through the candidate's own imports and simple aliases
  (`import torch.nn.functional as F`, `T = threading.Thread`, `getattr(torch, "allclose")`,
  `sys.modules["time"]`, `__import__("os")`), so renaming a module does not hide a call.
- Legitimate building blocks are not flagged: importing or calling `torch.utils.cpp_extension`
  (load_inline writes its own build files), `torch.compile`, channels_last, plain torch ops,
  `try: import triton / except ImportError: ...` at module level, `torch.cuda.synchronize`,
  reads and writes of build sources in the candidate's own temp and build folders
  (`PathOwnership`), streams that carry no work or whose work is joined before returning, and
  global flags set to the value they already have.

Does not guarantee soundness: Python can hide anything from a syntax tree (strings decoded at
run time, attribute names computed from data). Such hiding needs one of the primitives flagged
here (getattr on a module with a computed name, eval/exec, importlib, sys.modules, frames), and
the dynamic checks in the evaluator are the defence that does not depend on reading code.
`output_caching` is a heuristic: it warns, it does not prove. Path ownership trusts path
components computed at run time (only the root and literal components are checked), and stream
joins are looked for in the function that puts the work on the stream only.

The try/except rule (`try_fallback`) flags a try statement when an except branch computes with
PyTorch (calls into torch, torch.nn modules the class created, tensor math methods, `@`, the
reference `Model`, or `super().forward`), or when the try body returns, an except branch
swallows the error and the statements after the try compute with PyTorch. An except branch
that only imports, assigns flags, logs or re-raises is not a fallback, so
`try: import triton except ImportError: triton = None` is accepted.
"""

from __future__ import annotations

import ast
import builtins
import enum
import functools
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from kernelrl.checks import rules as R
from kernelrl.result import Finding, Severity

_BUILTIN_NAMES = frozenset(dir(builtins))


@dataclass(frozen=True)
class Hit:
    line: int | None
    message: str


@dataclass(frozen=True)
class Check:
    rule: R.Rule
    run: Callable[[SourceInfo], Iterable[Hit]]

    @property
    def name(self) -> str:
        return self.rule.name


CHECKS: dict[str, Check] = {}


def register(name: str) -> Callable[[Callable[[SourceInfo], Iterable[Hit]]], Callable[[SourceInfo], Iterable[Hit]]]:
    """Register a check function under a static rule name from `kernelrl.checks.rules`."""
    rule = R.STATIC_RULES[name]

    def deco(fn: Callable[[SourceInfo], Iterable[Hit]]) -> Callable[[SourceInfo], Iterable[Hit]]:
        if name in CHECKS:
            raise ValueError(f"static rule {name} registered twice")
        CHECKS[name] = Check(rule=rule, run=fn)
        return fn

    return deco


def check_source(source: str, *, task_source: str | None = None) -> list[Finding]:
    """Run every registered static check; findings carry the rule's default severity.

    With `task_source` (the task's reference program), reduced-precision compute is not reported
    when the reference itself computes in fp16/bf16: the candidate is then at the task's precision.
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:  # ValueError: null bytes in source
        line = getattr(e, "lineno", None)
        return [Finding(rule=R.SYNTAX_ERROR, message=f"source does not parse: {e.__class__.__name__}: "
                        f"{getattr(e, 'msg', e)}", severity=Severity.REJECT, stage="static", line=line)]
    info = SourceInfo(tree, source)
    findings: list[Finding] = []
    seen: set[tuple[str, int | None, str]] = set()
    for check in CHECKS.values():
        for hit in check.run(info):
            key = (check.name, hit.line, hit.message)
            if key in seen:
                continue
            seen.add(key)
            findings.append(Finding(rule=check.name, message=hit.message, severity=check.rule.severity,
                                    stage="static", line=hit.line))
    if task_source is not None and _REDUCED_DTYPES.search(task_source):
        findings = [f for f in findings if f.rule != R.REDUCED_PRECISION_COMPUTE]
    findings.sort(key=lambda f: (f.line or 0, f.rule))
    return findings


# A task whose reference names a reduced-precision dtype computes in it itself.
_REDUCED_DTYPES = re.compile(r"\b(float16|half|bfloat16|float8_\w+)\b")


def has_custom_kernel(source: str) -> bool:
    """True when the source builds or defines at least one real custom kernel (see `no_custom_kernel`)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    return any(k.real for k in custom_kernels(SourceInfo(tree, source)))


# ---------------------------------------------------------------------------------------------
# Name resolution


class SourceInfo:
    """A parsed candidate with parent links and import-aware qualified names."""

    def __init__(self, tree: ast.Module, source: str) -> None:
        self.tree = tree
        self.source = source
        self.parents: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
        self.defined = _defined_names(tree)
        self.aliases: dict[str, str] = {}
        self.imported_roots: set[str] = set()
        self._collect_imports()
        self._collect_assignment_aliases()
        self.strings = _module_strings(tree)

    @functools.cached_property
    def assigned(self) -> dict[str, list[ast.AST]]:
        """name -> every value assigned to it (flow-insensitive)."""
        return _assigned_values(self.tree)

    # -- aliases ------------------------------------------------------------------------------

    def _collect_imports(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        self.aliases[a.asname] = a.name
                    else:
                        root = a.name.split(".")[0]
                        self.aliases[root] = root
                    self.imported_roots.add(a.name.split(".")[0])
            elif isinstance(node, ast.ImportFrom):
                mod = ("." * node.level) + (node.module or "")
                for a in node.names:
                    if a.name == "*":
                        continue
                    self.aliases[a.asname or a.name] = f"{mod}.{a.name}" if mod else a.name
                if node.module and not node.level:
                    self.imported_roots.add(node.module.split(".")[0])

    def _collect_assignment_aliases(self) -> None:
        # Flow-insensitive: `T = threading.Thread` anywhere makes T mean threading.Thread.
        # Only pure name chains (and module lookups by constant name) alias; a call result does not.
        for _ in range(3):
            changed = False
            for node in ast.walk(self.tree):
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    target = node.targets[0].id
                    q = self.qualname(node.value)
                    if q and "()" not in q and self.aliases.get(target) != q and target != q:
                        self.aliases[target] = q
                        changed = True
            if not changed:
                break

    def qualname(self, node: ast.AST | None) -> str | None:
        """Dotted name an expression refers to, through imports; `()` marks a call result."""
        if node is None:
            return None
        if isinstance(node, ast.Name):
            if node.id in self.aliases:
                return self.aliases[node.id]
            if node.id in _BUILTIN_NAMES and node.id not in self.defined:
                return f"builtins.{node.id}"
            return None
        if isinstance(node, ast.Attribute):
            base = self.qualname(node.value)
            return f"{base}.{node.attr}" if base else None
        if isinstance(node, ast.Subscript):
            # sys.modules["time"] is the module `time`
            base = self.qualname(node.value)
            key = _const_str(node.slice)
            if base == "sys.modules" and key:
                return key
            return None
        if isinstance(node, ast.Call):
            fn = self.qualname(node.func)
            if fn in ("builtins.__import__", "importlib.import_module", "sys.modules.get") and node.args:
                name = _const_str(node.args[0])
                if name:
                    return name
            if fn == "builtins.getattr" and len(node.args) >= 2:
                base = self.qualname(node.args[0])
                attr = _const_str(node.args[1])
                if base and attr:
                    return f"{base}.{attr}"
                return None
            return f"{fn}()" if fn else None
        return None

    # -- traversal ----------------------------------------------------------------------------

    def calls(self) -> Iterator[tuple[ast.Call, str]]:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Call):
                q = self.qualname(node.func)
                if q:
                    yield node, q

    def refs(self) -> Iterator[tuple[ast.AST, str]]:
        """Maximal resolved name chains (a.b.c, not also a.b), loads and stores."""
        for node in ast.walk(self.tree):
            if not isinstance(node, (ast.Name, ast.Attribute)):
                continue
            parent = self.parents.get(node)
            if isinstance(parent, ast.Attribute) and parent.value is node:
                continue
            q = self.qualname(node)
            if q:
                yield node, q

    def enclosing(self, node: ast.AST, kinds: tuple[type, ...]) -> ast.AST | None:
        cur = self.parents.get(node)
        while cur is not None and not isinstance(cur, kinds):
            cur = self.parents.get(cur)
        return cur


def _defined_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
    return names


def _const_str(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _module_strings(tree: ast.Module) -> dict[str, str]:
    """Names bound to string constants anywhere (for load_inline sources kept in variables)."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            text = _string_value(node.value, out)
            if text is not None:
                out[node.targets[0].id] = text
    return out


def _string_value(node: ast.AST, known: dict[str, str]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_string_value(v, known) or "" for v in node.values)
    if isinstance(node, ast.FormattedValue):
        return _string_value(node.value, known)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _string_value(node.left, known), _string_value(node.right, known)
        if left is None and right is None:
            return None
        return (left or "") + (right or "")
    if isinstance(node, ast.Name):
        return known.get(node.id)
    if isinstance(node, (ast.List, ast.Tuple)):
        parts = [_string_value(e, known) for e in node.elts]
        if all(p is None for p in parts):
            return None
        return "\n".join(p or "" for p in parts)
    return None


def _under(q: str, prefixes: Iterable[str]) -> str | None:
    """The first prefix that `q` equals or extends by attribute access, else None."""
    for p in prefixes:
        # `open().write` is the result of open(), already reported at the open() call
        if q == p or (q.startswith(p + ".") and "()" not in q[len(p):]):
            return p
    return None


def _line(node: ast.AST) -> int | None:
    return getattr(node, "lineno", None)


def _pretty(q: str) -> str:
    return q.removeprefix("builtins.")


# ---------------------------------------------------------------------------------------------
# Concurrency


# Streams are judged by use: a stream that carries no work hides none, and work on a side stream
# that is joined (the current stream waits for it, it or the device is synchronised, an event
# recorded on it is waited on) before forward returns is ordinary concurrency. Work left running
# is refused here where the syntax tree shows it, and otherwise by the judge, which synchronises
# the whole device before its clock stops.

_STREAM_MAKERS = ("torch.cuda.Stream", "torch.cuda.streams.Stream", "torch.cuda.ExternalStream",
                  "torch.cuda.streams.ExternalStream", "torch.Stream", "torch.cuda.get_stream_from_external",
                  "cupy.cuda.Stream", "numba.cuda.stream")
_STREAM_SWITCHES = ("torch.cuda.stream", "torch.cuda.StreamContext", "torch.cuda.use_stream", "torch.cuda.set_stream",
                    "torch.cuda.streams.StreamContext", "torch.cuda.utils.stream")
_JOIN_METHODS = frozenset({"synchronize", "wait_stream", "wait_event", "wait"})
# C++/CUDA sources: side streams, and what joins them.
_CPP_SIDE_STREAM = re.compile(r"\bgetStreamFromPool\b|\bget_stream_from_pool\b|\bcudaStreamCreate\w*|\bcuStreamCreate\w*")
_CPP_JOIN = re.compile(r"\bcudaStreamSynchronize\b|\bcudaDeviceSynchronize\b|\bcudaStreamWaitEvent\b|"
                       r"\bcudaEventSynchronize\b|\bcuStreamSynchronize\b|\bcuCtxSynchronize\b|"
                       r"\bdevice_synchronize\b|\.synchronize\s*\(|\bcuStreamWaitEvent\b")


def _stream_handles(src: SourceInfo) -> set[str]:
    """Names and `self.x` attributes bound to streams the program made."""
    out: set[str] = set()
    for node in ast.walk(src.tree):
        if isinstance(node, ast.Assign):
            made = any(isinstance(n, ast.Call) and _under(src.qualname(n.func) or "", _STREAM_MAKERS)
                       for n in ast.walk(node.value))
            if made:
                for t in node.targets:
                    for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]):
                        k = _container_key(e)
                        if k:
                            out.add(k)
    return out


def _mentions(node: ast.AST, handles: set[str]) -> bool:
    return any(_container_key(n) in handles for n in ast.walk(node))


def _current_stream(src: SourceInfo, call: ast.Call) -> bool:
    """torch.cuda.stream(torch.cuda.current_stream()) and the like switch to the stream already in use."""
    arg = _kw(call, "stream", 0)
    if arg is None or (isinstance(arg, ast.Constant) and arg.value is None):
        return True
    q = src.qualname(arg.func) if isinstance(arg, ast.Call) else None
    return q in ("torch.cuda.current_stream", "torch.cuda.default_stream", "torch.cuda.streams.current_stream")


def _stream_uses(src: SourceInfo, handles: set[str]) -> Iterator[tuple[ast.AST, str]]:
    """Places where work is put on a stream other than the current one, with a description."""
    for node in ast.walk(src.tree):
        if isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                ctx = item.context_expr
                if isinstance(ctx, ast.Call) and _under(src.qualname(ctx.func) or "", _STREAM_SWITCHES) \
                        and not _current_stream(src, ctx):
                    yield node, f"work under {ast.unparse(ctx)[:50]}"
                elif _container_key(ctx) in handles:
                    yield node, f"work under stream {_container_key(ctx)}"
        elif isinstance(node, ast.Call):
            q = src.qualname(node.func) or ""
            parent = src.parents.get(node)
            in_with = isinstance(parent, ast.withitem)
            if _under(q, _STREAM_SWITCHES) and not in_with and not _current_stream(src, node):
                yield node, f"{q}() switches the current stream"
            elif not in_with:
                for kw in node.keywords:
                    if kw.arg == "stream" and _mentions(kw.value, handles):
                        yield node, f"launch with stream={ast.unparse(kw.value)[:40]}"
                        break
                else:
                    if any(isinstance(a, ast.Attribute) and a.attr in ("cuda_stream", "ptr", "handle")
                           and _container_key(a.value) in handles for a in node.args):
                        yield node, "launch on a stream handle the program made"


def _joined_after(src: SourceInfo, use: ast.AST) -> bool:
    """A join (synchronize, wait_stream, wait_event, event.wait) after the use and before any return
    that follows it in the same function."""
    scope = src.enclosing(use, (ast.FunctionDef, ast.AsyncFunctionDef)) or src.tree
    end = getattr(use, "end_lineno", None) or _line(use) or 0
    start = _line(use) or 0
    returns = sorted(_line(n) or 0 for n in ast.walk(scope) if isinstance(n, ast.Return) and (_line(n) or 0) >= start)
    limit = returns[0] if returns else float("inf")
    if limit <= end:
        return False  # returns from inside the block that put work on the side stream
    for n in ast.walk(scope):
        if not isinstance(n, ast.Call) or not (end < (_line(n) or 0) <= limit):
            continue
        q = src.qualname(n.func) or ""
        if q in ("torch.cuda.synchronize", "torch.cuda.current_stream().synchronize"):
            return True
        if isinstance(n.func, ast.Attribute) and n.func.attr in _JOIN_METHODS:
            return True
    return False


def _cpp_sources(src: SourceInfo) -> Iterator[tuple[ast.AST, str]]:
    """String constants (and resolved load_inline sources) that hold C/C++/CUDA code."""
    marker = re.compile(r"#include|__global__|\btorch::|PYBIND11_MODULE|\bat::Tensor\b")
    for node in ast.walk(src.tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and marker.search(node.value):
            yield node, _C_COMMENT.sub("", node.value)


@register(R.STREAM_CREATION)
def _stream_creation(src: SourceInfo) -> Iterator[Hit]:
    handles = _stream_handles(src)
    for use, what in _stream_uses(src, handles):
        if not _joined_after(src, use):
            yield Hit(_line(use), f"{what}, not joined before returning: work on a side stream can escape the "
                                  "timed stream (join it with wait_stream, synchronize or an event)")
    for node, code in _cpp_sources(src):
        m = _CPP_SIDE_STREAM.search(code)
        if m and not _CPP_JOIN.search(code):
            yield Hit(_line(node), f"C++/CUDA source uses {m.group(0)} and never synchronises or waits on it: "
                                   "work on a side stream can escape the timed stream")


_THREAD_CALLS = ("threading.Thread", "threading.Timer", "_thread.start_new_thread", "_thread.start_new",
                 "concurrent.futures.ThreadPoolExecutor", "concurrent.futures.thread",
                 "asyncio.new_event_loop", "asyncio.run", "asyncio.get_event_loop", "asyncio.create_task",
                 "asyncio.ensure_future", "asyncio.to_thread", "asyncio.run_coroutine_threadsafe",
                 "multiprocessing.pool.ThreadPool", "multiprocessing.dummy", "torch.jit.fork", "torch.jit._fork",
                 "torch.futures")


@register(R.THREAD_CREATION)
def _thread_creation(src: SourceInfo) -> Iterator[Hit]:
    for node, q in src.calls():
        if _under(q, _THREAD_CALLS):
            yield Hit(_line(node), f"{q}() starts concurrent work that can run after forward returns")
        elif isinstance(node.func, ast.Attribute) and node.func.attr in ("run_in_executor", "call_soon_threadsafe"):
            yield Hit(_line(node), f".{node.func.attr}() schedules work on another thread")
    for node in ast.walk(src.tree):
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                q = src.qualname(base)
                if q and _under(q, ("threading.Thread", "threading.Timer")):
                    yield Hit(_line(node), f"class {node.name} subclasses {q}")


_PROCESS_MODULES = ("subprocess", "multiprocessing", "torch.multiprocessing", "pty", "concurrent.futures.process")


@register(R.PROCESS_CREATION)
def _process_creation(src: SourceInfo) -> Iterator[Hit]:
    fns = ("os.fork", "os.forkpty", "os.system", "os.popen", "os.register_at_fork", "os.posix_spawn",
           "os.posix_spawnp", "concurrent.futures.ProcessPoolExecutor", "platform.popen")
    for node, q in src.calls():
        if _under(q, fns) or q.startswith(("os.spawn", "os.exec")) or _under(q, _PROCESS_MODULES):
            if _under(q, ("multiprocessing.dummy", "multiprocessing.pool.ThreadPool")):
                continue  # threads, reported by thread_creation
            yield Hit(_line(node), f"{q}() creates a process")
    for node in ast.walk(src.tree):
        for name in _imported_modules(node):
            if _under(name, _PROCESS_MODULES):
                yield Hit(_line(node), f"imports {name}, which runs other processes")


def _imported_modules(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and not node.level:
        return [node.module] + [f"{node.module}.{a.name}" for a in node.names if a.name != "*"]
    return []


@register(R.PROCESS_CONTROL)
def _process_control(src: SourceInfo) -> Iterator[Hit]:
    fns = ("os._exit", "os.abort", "os.kill", "os.killpg", "sys.exit", "builtins.exit", "builtins.quit",
           "signal", "atexit", "faulthandler")
    for node, q in src.calls():
        if _under(q, fns):
            yield Hit(_line(node), f"{_pretty(q)}() exits, signals or hooks the process's exit")
    for node in ast.walk(src.tree):
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            q = src.qualname(exc)
            if q in ("builtins.SystemExit", "builtins.KeyboardInterrupt"):
                yield Hit(_line(node), f"raises {_pretty(q)} to end the process")


# ---------------------------------------------------------------------------------------------
# The reference


def _is_reference_name(src: SourceInfo, node: ast.AST) -> bool:
    if isinstance(node, ast.Name) and node.id == "Model":
        return True
    if isinstance(node, ast.Attribute) and node.attr == "Model":
        return True
    return False


@register(R.REFERENCE_SUBCLASS)
def _reference_subclass(src: SourceInfo) -> Iterator[Hit]:
    for node in ast.walk(src.tree):
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                if _is_reference_name(src, base):
                    yield Hit(_line(node), f"class {node.name} inherits from the reference Model")


@register(R.REFERENCE_CALL)
def _reference_call(src: SourceInfo) -> Iterator[Hit]:
    bases = {id(b) for n in ast.walk(src.tree) if isinstance(n, ast.ClassDef) for b in n.bases}
    subclasses = {n.name for n in ast.walk(src.tree) if isinstance(n, ast.ClassDef)
                  and any(_is_reference_name(src, b) for b in n.bases)}
    for node in ast.walk(src.tree):
        if _is_reference_name(src, node) and id(node) not in bases:
            ctx = getattr(node, "ctx", None)
            if isinstance(ctx, ast.Load):
                yield Hit(_line(node), "refers to the reference `Model`; the candidate must not run the reference")
        elif isinstance(node, ast.Constant) and node.value == "Model":
            parent = src.parents.get(node)
            if isinstance(parent, (ast.Call, ast.Subscript)):
                yield Hit(_line(node), "looks up the reference `Model` by name")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                "forward", "__call__", "_call_impl"):
            inner = node.func.value
            if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name) and inner.func.id == "super":
                cls = src.enclosing(node, (ast.ClassDef,))
                if isinstance(cls, ast.ClassDef) and cls.name in subclasses:
                    yield Hit(_line(node), "calls the reference's forward through super()")


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
                    yield Hit(_line(node), f"imports Model from {mod}")
                elif a.name == "*" and not _under(node.module or "", _KNOWN_STAR_SOURCES):
                    yield Hit(_line(node), f"star-imports {mod}, which could bring in the reference Model")
            if node.module and _TASK_MODULE.search(node.module) and not node.module.startswith("torch"):
                yield Hit(_line(node), f"imports from {mod}, which looks like the task's reference module")
        elif isinstance(node, ast.Import):
            for a in node.names:
                if _TASK_MODULE.search(a.name) and not a.name.startswith("torch"):
                    yield Hit(_line(node), f"imports {a.name}, which looks like the task's reference module")


# ---------------------------------------------------------------------------------------------
# try/except fallbacks

# Calls into torch that do not compute on tensors (device queries, synchronisation, dtypes, RNG state)
_TORCH_NON_COMPUTE = re.compile(
    r"^torch\.(cuda\.(synchronize|is_available|current_device|device_count|get_device_\w+|"
    r"current_stream|empty_cache|set_device)|device|dtype|is_tensor|get_default_dtype|__version__|"
    r"utils\.cpp_extension(\..*)?|_assert|is_grad_enabled|version(\..*)?)$")
_TENSOR_MATH_METHODS = frozenset(
    ["matmul", "mm", "bmm", "addmm", "baddbmm", "einsum", "sum", "mean", "relu", "relu_", "sigmoid", "tanh", "softmax", "log_softmax", "exp", "log", "mul", "add", "sub", "div", "pow", "sqrt", "rsqrt", "conv1d", "conv2d", "conv3d", "clamp", "clamp_", "max", "min", "amax", "amin", "norm", "var", "std", "gelu", "silu", "linear", "layer_norm", "cumsum", "prod", "abs", "neg", "reciprocal", "square", "exp2", "erf", "dot", "mv", "outer", "tril", "triu", "where", "masked_fill", "softplus", "logsumexp", "argmax", "argmin", "topk", "sort"])


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
            if isinstance(node, (ast.Name, ast.Attribute)) and _is_reference_name(src, node) \
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
                        yield Hit(_line(h), f"except branch computes with {what}: a fallback that hides a "
                                            "failing kernel")
                body_returns = any(isinstance(n, ast.Return) for s in stmt.body for n in ast.walk(s))
                swallows = any(not _terminates(h.body) for h in stmt.handlers)
                if body_returns and swallows:
                    what = _computes(src, block[i + 1:], nn_attrs)
                    if what:
                        yield Hit(_line(stmt), f"exception swallowed, then the code after the try computes with "
                                               f"{what}: a fallback that hides a failing kernel")


# ---------------------------------------------------------------------------------------------
# Global state: patching and settings

_PATCH_ROOTS = frozenset({"torch", "time", "builtins", "kernelrl", "sys", "os", "numpy", "math", "random",
                          "timeit", "gc", "threading", "functools", "operator", "inspect", "importlib",
                          "multiprocessing", "subprocess", "signal", "pickle", "json", "triton", "pytest",
                          "unittest", "ctypes", "io", "copy", "contextlib", "types", "collections",
                          "itertools", "warnings", "logging", "socket", "tempfile", "shutil", "pathlib",
                          "resource", "psutil", "cupy", "numba", "__main__"})
# Settings handled by the settings rules instead of module_patching
_SETTINGS_PREFIXES = ("torch.backends", "torch._dynamo.config", "torch._inductor.config",
                      "torch._functorch.config", "torch.fx.experimental._config", "torch.jit._state")
_PRECISION_ATTR = re.compile(r"tf32|reduced_precision|fp32_precision|allow_fp16|allow_bf16", re.IGNORECASE)


def _store_targets(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.Assign):
        out: list[ast.AST] = []
        for t in node.targets:
            out.extend(t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])
        return out
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return [node.target]
    if isinstance(node, ast.Delete):
        return list(node.targets)
    return []


def _setting_stores(src: SourceInfo) -> Iterator[tuple[ast.AST, str]]:
    """(node, dotted path) for assignments to torch settings attributes (x.y = v and setattr)."""
    for node in ast.walk(src.tree):
        for t in _store_targets(node):
            if isinstance(t, ast.Attribute):
                q = src.qualname(t)
                if q and _under(q, _SETTINGS_PREFIXES):
                    yield node, q
        if isinstance(node, ast.Call) and src.qualname(node.func) == "builtins.setattr" and len(node.args) >= 2:
            base, attr = src.qualname(node.args[0]), _const_str(node.args[1])
            if base and _under(base, _SETTINGS_PREFIXES):
                yield node, f"{base}.{attr or '<computed>'}"


def _patched_root(src: SourceInfo, target: ast.AST) -> str | None:
    """The module path a store target patches, if it patches a protected module or class."""
    if isinstance(target, ast.Attribute):
        base = src.qualname(target.value)
        if base and "()" not in base and base.split(".")[0] in _PATCH_ROOTS:
            q = f"{base}.{target.attr}"
            return None if _under(q, _SETTINGS_PREFIXES) else q
        if isinstance(target.value, ast.Name) and target.value.id == "__builtins__":
            return f"builtins.{target.attr}"
    if isinstance(target, ast.Subscript):
        base = target.value
        q = src.qualname(base)
        if q == "sys.modules":
            return f"sys.modules[{_const_str(target.slice) or '...'}]"
        if isinstance(base, ast.Name) and base.id == "__builtins__":
            return f"builtins[{_const_str(target.slice) or '...'}]"
        if isinstance(base, ast.Attribute) and base.attr == "__dict__":
            owner = src.qualname(base.value)
            if owner and owner.split(".")[0] in _PATCH_ROOTS:
                return f"{owner}.__dict__[{_const_str(target.slice) or '...'}]"
        if isinstance(base, ast.Call) and src.qualname(base.func) == "builtins.vars" and base.args:
            owner = src.qualname(base.args[0])
            if owner and owner.split(".")[0] in _PATCH_ROOTS:
                return f"vars({owner})[...]"
    return None


@register(R.MODULE_PATCHING)
def _module_patching(src: SourceInfo) -> Iterator[Hit]:
    for node in ast.walk(src.tree):
        for t in _store_targets(node):
            q = _patched_root(src, t)
            if q:
                verb = "deletes" if isinstance(node, ast.Delete) else "rebinds"
                yield Hit(_line(node), f"{verb} {q}: patching a shared module changes what the judge or the "
                                       "reference would run")
        if isinstance(node, ast.Call):
            fq = src.qualname(node.func)
            if fq in ("builtins.setattr", "builtins.delattr") and node.args:
                base = src.qualname(node.args[0])
                attr = _const_str(node.args[1]) if len(node.args) > 1 else None
                if isinstance(node.args[0], ast.Name) and node.args[0].id == "__builtins__":
                    base = "builtins"
                if base and "()" not in base and base.split(".")[0] in _PATCH_ROOTS \
                        and not _under(base, _SETTINGS_PREFIXES):
                    yield Hit(_line(node), f"{_pretty(fq)}({base}, {attr or '<computed>'!s}) patches a shared module")
            elif isinstance(node.func, ast.Attribute) and node.func.attr in ("update", "__setitem__", "setdefault"):
                owner = node.func.value
                if isinstance(owner, ast.Attribute) and owner.attr == "__dict__":
                    oq = src.qualname(owner.value)
                    if oq and oq.split(".")[0] in _PATCH_ROOTS:
                        yield Hit(_line(node), f"{oq}.__dict__.{node.func.attr}() patches a shared module")
                elif src.qualname(owner) == "sys.modules":
                    yield Hit(_line(node), f"sys.modules.{node.func.attr}() replaces modules")


_PRECISION_CALLS = ("torch.set_default_dtype", "torch.set_default_tensor_type", "torch.set_flush_denormal",
                    "torch._C._set_cublas_allow_tf32", "torch._C._set_cudnn_allow_tf32",
                    "torch._C._set_cublas_allow_fp16_reduced_precision_reduction",
                    "torch._C._set_cublas_allow_bf16_reduced_precision_reduction",
                    "torch._C._set_float32_matmul_precision")
_PRECISION_ENV = ("NVIDIA_TF32_OVERRIDE", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE")
_THREAD_ENV = re.compile(r"^(OMP|MKL|OPENBLAS|NUMEXPR|VECLIB|BLIS|GOTO|KMP|GOMP|TORCH)_?\w*(THREADS|AFFINITY|"
                         r"PROC_BIND|PLACES|DYNAMIC)\w*$")
_BUILD_ENV = ("TORCH_CUDA_ARCH_LIST", "TORCH_EXTENSIONS_DIR", "CXX", "CC", "MAX_JOBS", "CUDA_HOME",
              "CUDA_PATH", "CXXFLAGS", "CFLAGS", "LDFLAGS", "NVCC_FLAGS", "TRITON_CACHE_DIR")


# Global settings set to the value they already have change nothing. PyTorch's defaults, as of
# the torch this package supports; a flag set to anything else, or to a value the syntax tree
# cannot read, is a change.
_SETTING_DEFAULTS: dict[str, tuple[object, ...]] = {
    "torch.backends.cudnn.allow_tf32": (True,),
    "torch.backends.cuda.matmul.allow_tf32": (False,),
    "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction": (True,),
    "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction": (True,),
    "torch.backends.cuda.matmul.allow_fp16_accumulation": (False,),
    "torch.backends.fp32_precision": ("ieee", "none"),
    "torch.backends.cuda.matmul.fp32_precision": ("ieee", "none"),
    "torch.backends.cudnn.fp32_precision": ("ieee", "none"),
    "torch.backends.cudnn.conv.fp32_precision": ("tf32",),
    "torch.backends.cudnn.rnn.fp32_precision": ("tf32",),
    "torch.backends.mkldnn.fp32_precision": ("ieee", "none"),
    "torch.backends.mkldnn.matmul.fp32_precision": ("ieee", "none"),
    "torch.backends.mkldnn.conv.fp32_precision": ("ieee", "none"),
    "torch.backends.mkldnn.rnn.fp32_precision": ("ieee", "none"),
    "torch.backends.cudnn.benchmark": (False,),
    "torch.backends.cudnn.deterministic": (False,),
    "torch.backends.cudnn.enabled": (True,),
    "torch.backends.mkldnn.enabled": (True,),
}
_CALL_DEFAULTS: dict[str, tuple[object, ...]] = {
    "torch.set_float32_matmul_precision": ("highest",),
    "torch.set_default_dtype": ("torch.float32", "torch.float"),
    "torch.set_flush_denormal": (False,),
    "torch.use_deterministic_algorithms": (False,),
}


def _setting_value(node: ast.AST) -> ast.AST | None:
    """The value a settings store assigns (x.y = v, setattr(x, "y", v))."""
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        return node.value
    if isinstance(node, ast.Call) and len(node.args) >= 3:
        return node.args[2]
    return None


def _is_default(src: SourceInfo, setting: str, value: ast.AST | None) -> bool:
    defaults = _SETTING_DEFAULTS.get(setting) if setting in _SETTING_DEFAULTS else _CALL_DEFAULTS.get(setting)
    if defaults is None or value is None:
        return False
    if isinstance(value, ast.Constant):
        return any(type(value.value) is type(d) and value.value == d for d in defaults)
    q = src.qualname(value)
    return q is not None and q in defaults


@register(R.PRECISION_CHANGE)
def _precision_change(src: SourceInfo) -> Iterator[Hit]:
    for node, q in _setting_stores(src):
        if (_PRECISION_ATTR.search(q.rsplit(".", 1)[-1]) or _PRECISION_ATTR.search(q)) \
                and not _is_default(src, q, _setting_value(node)):
            yield Hit(_line(node), f"sets {q}, a global precision setting, away from its default")
    for node, q in src.calls():
        if q == "torch.set_float32_matmul_precision":
            arg = _const_str(node.args[0]) if node.args else None
            if arg != "highest":
                yield Hit(_line(node), f"torch.set_float32_matmul_precision({arg or '...'!r}) lowers float32 "
                                       "matmul precision globally")
        elif _under(q, _PRECISION_CALLS) and not _is_default(src, q, node.args[0] if node.args else None):
            yield Hit(_line(node), f"{q}() changes global precision")
    for node, key, _ in _env_writes(src):
        if key in _PRECISION_ENV:
            yield Hit(_line(node), f"sets environment variable {key}, which changes float precision")


@register(R.THREAD_SETTING_CHANGE)
def _thread_setting_change(src: SourceInfo) -> Iterator[Hit]:
    calls = ("torch.set_num_threads", "torch.set_num_interop_threads", "os.sched_setaffinity",
             "threadpoolctl", "mkl.set_num_threads", "numexpr.set_num_threads", "torch._C._set_num_threads",
             "os.nice", "os.setpriority")
    for node, q in src.calls():
        if _under(q, calls):
            yield Hit(_line(node), f"{q}() changes global threading or scheduling")
    for node, key, _ in _env_writes(src):
        if key and _THREAD_ENV.match(key):
            yield Hit(_line(node), f"sets environment variable {key}, which changes thread counts")


@register(R.BACKEND_SETTING_CHANGE)
def _backend_setting_change(src: SourceInfo) -> Iterator[Hit]:
    for node, q in _setting_stores(src):
        if not (_PRECISION_ATTR.search(q.rsplit(".", 1)[-1]) or _PRECISION_ATTR.search(q)) \
                and not _is_default(src, q, _setting_value(node)):
            yield Hit(_line(node), f"sets {q}, a global backend setting")
    calls = ("torch.use_deterministic_algorithms", "torch.set_deterministic_debug_mode",
             "torch.backends.cuda.enable_flash_sdp", "torch.backends.cuda.enable_mem_efficient_sdp",
             "torch.backends.cuda.enable_math_sdp", "torch.backends.cuda.enable_cudnn_sdp",
             "torch.backends.cuda.preferred_linalg_library", "torch.backends.cuda.preferred_blas_library",
             "torch.autograd.set_detect_anomaly", "torch._C._set_")
    statement_calls = ("torch.set_grad_enabled", "torch.autograd.set_grad_enabled",
                       "torch.autograd.grad_mode.set_grad_enabled", "torch._C._set_grad_enabled",
                       "torch.inference_mode", "gc.disable", "gc.freeze", "gc.set_threshold")
    for node, q in src.calls():
        if (_under(q, calls) or (q.startswith("torch._C._set_") and not _under(q, _PRECISION_CALLS)
                                 and q != "torch._C._set_num_threads")) \
                and not _is_default(src, q, node.args[0] if node.args else None):
            yield Hit(_line(node), f"{q}() changes a global backend setting")
        elif _under(q, statement_calls) and isinstance(src.parents.get(node), ast.Expr):
            yield Hit(_line(node), f"{q}() as a statement changes global state for everything that runs later")
    for node, key, _ in _env_writes(src):
        if key and (key.startswith(("PYTORCH_", "TORCHINDUCTOR_", "TORCH_", "CUDA_LAUNCH", "CUBLAS_", "CUDNN_"))
                    and key not in _BUILD_ENV and key not in _PRECISION_ENV and not _THREAD_ENV.match(key)):
            yield Hit(_line(node), f"sets environment variable {key}, a backend setting")


@register(R.REDUCED_PRECISION_COMPUTE)
def _reduced_precision(src: SourceInfo) -> Iterator[Hit]:
    low = ("torch.float16", "torch.half", "torch.bfloat16", "torch.float8_e4m3fn", "torch.float8_e5m2")
    autocast = ("torch.autocast", "torch.cuda.amp.autocast", "torch.cpu.amp.autocast", "torch.amp.autocast")
    for node, q in src.refs():
        if q in low:
            yield Hit(_line(node), f"uses {q}")
    for node, q in src.calls():
        if _under(q, autocast):
            yield Hit(_line(node), f"{q}() runs ops in reduced precision")
    for node in ast.walk(src.tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("half", "bfloat16") \
                and not node.args:
            yield Hit(_line(node), f".{node.func.attr}() converts to reduced precision")


@register(R.FAST_MATH)
def _fast_math(src: SourceInfo) -> Iterator[Hit]:
    for node in ast.walk(src.tree):
        if _is_code_string(src, node) and node.value.strip() in ("--use_fast_math", "-use_fast_math",
                                                                 "-ffast-math", "-Ofast"):
            yield Hit(_line(node), f"compiles with {node.value.strip()}, which relaxes IEEE float semantics")


# ---------------------------------------------------------------------------------------------
# The outside world: files, environment, network, native code, dynamic code, introspection

# Files. A candidate runs with its own temporary folder as cwd, HOME and TMPDIR, and builds in the
# folder TORCH_EXTENSIONS_DIR names; what it reads and writes there is its own business (sources
# written for torch's file-based loader, say). Everything else is refused: other paths, raw file
# descriptors (the judge's channel is one), and Python files anywhere (they shadow imports).

# Calls that take paths, and which arguments are paths: positions, keyword names.
_PATH_ARGS: dict[str, tuple[tuple[int, ...], tuple[str, ...]]] = {
    "builtins.open": ((0,), ("file",)), "io.open": ((0,), ("file",)), "io.FileIO": ((0,), ("file", "name")),
    "os.open": ((0,), ("path",)), "os.remove": ((0,), ("path",)), "os.unlink": ((0,), ("path",)),
    "os.mkdir": ((0,), ("path",)), "os.makedirs": ((0,), ("name",)), "os.rmdir": ((0,), ("path",)),
    "os.removedirs": ((0,), ("name",)), "os.listdir": ((0,), ("path",)), "os.scandir": ((0,), ("path",)),
    "os.walk": ((0,), ("top",)), "os.chdir": ((0,), ("path",)), "os.chmod": ((0,), ("path",)),
    "os.chown": ((0,), ("path",)), "os.truncate": ((0,), ("path",)), "os.mkfifo": ((0,), ("path",)),
    "os.rename": ((0, 1), ("src", "dst")), "os.replace": ((0, 1), ("src", "dst")),
    "os.renames": ((0, 1), ("old", "new")), "os.link": ((0, 1), ("src", "dst")),
    "os.symlink": ((0, 1), ("src", "dst")),
    "shutil.copy": ((0, 1), ("src", "dst")), "shutil.copy2": ((0, 1), ("src", "dst")),
    "shutil.copyfile": ((0, 1), ("src", "dst")), "shutil.copytree": ((0, 1), ("src", "dst")),
    "shutil.move": ((0, 1), ("src", "dst")), "shutil.rmtree": ((0,), ("path",)),
    "glob.glob": ((0,), ("pathname",)), "glob.iglob": ((0,), ("pathname",)),
    "torch.save": ((1,), ("f",)), "torch.load": ((0,), ("f",)), "torch.from_file": ((0,), ("filename",)),
    "torch.UntypedStorage.from_file": ((0,), ("filename",)), "torch.TypedStorage.from_file": ((0,), ("filename",)),
    "numpy.save": ((0,), ("file",)), "numpy.savez": ((0,), ("file",)), "numpy.savez_compressed": ((0,), ("file",)),
    "numpy.savetxt": ((0,), ("fname",)), "numpy.load": ((0,), ("file",)), "numpy.fromfile": ((0,), ("file",)),
    "numpy.loadtxt": ((0,), ("fname",)), "numpy.genfromtxt": ((0,), ("fname",)),
    "numpy.memmap": ((0,), ("filename",)),
}
# Calls whose file argument is an open file object (or a path).
_FILE_OBJECT_ARGS: dict[str, tuple[int, str]] = {
    "pickle.dump": (1, "file"), "pickle.load": (0, "file"), "json.dump": (1, "fp"), "json.load": (0, "fp"),
}
# tempfile calls create inside TMPDIR (the candidate's own folder) unless `dir` points elsewhere.
_TEMPFILE_DIR_ARG: dict[str, int] = {"tempfile.mkdtemp": 2, "tempfile.mkstemp": 2, "tempfile.mktemp": 2,
                                     "tempfile.TemporaryDirectory": 2, "tempfile.NamedTemporaryFile": 6,
                                     "tempfile.TemporaryFile": 6, "tempfile.SpooledTemporaryFile": 7}
_WRITING = frozenset({"os.mkdir", "os.makedirs", "os.mkfifo", "os.truncate", "os.rename", "os.replace", "os.renames",
                      "os.link", "os.symlink", "shutil.copy", "shutil.copy2", "shutil.copyfile", "shutil.copytree",
                      "shutil.move", "torch.save", "numpy.save", "numpy.savez", "numpy.savez_compressed",
                      "numpy.savetxt"})
# Raw descriptors (the judge's result channel is one) and readers of other programs' files:
# refused wherever they point.
_FD_CALLS = ("os.fdopen", "os.write", "os.read", "os.pwrite", "os.pread", "os.writev", "os.readv", "os.dup",
             "os.dup2", "os.pipe", "os.pipe2", "os.fstat", "os.lseek", "os.close", "os.closerange", "os.sendfile",
             "os.memfd_create", "os.fsync", "os.ftruncate", "os.set_inheritable", "os.set_blocking", "os.openpty",
             "os.get_inheritable", "sys.stdout.fileno", "sys.stderr.fileno", "sys.stdin.fileno", "fcntl",
             "fileinput", "linecache", "os.fwalk")
_PATH_IO_METHODS = frozenset({"read_text", "write_text", "read_bytes", "write_bytes"})
_PATHLIB_METHODS = frozenset({"open", "unlink", "mkdir", "rmdir", "touch", "rename", "replace", "iterdir", "glob",
                              "rglob", "exists", "is_file", "is_dir", "stat", "symlink_to", "hardlink_to",
                              "chmod", "read_text", "write_text", "read_bytes", "write_bytes", "walk"})
_PATHLIB_WRITING = frozenset({"write_text", "write_bytes", "touch", "mkdir", "rename", "replace", "symlink_to",
                              "hardlink_to"})
_PYTHON_FILE = re.compile(r"(\.(py|pyc|pyo|pyw|pth)|(^|/)(sitecustomize|usercustomize))$")


class Own(enum.Enum):
    """Where a path expression provably points, relative to the candidate's own folders."""

    NO = "no"  # elsewhere, or not provable from the syntax tree
    FILE = "file"  # a file directly in the candidate's own folder (its own source, `__file__`)
    DIR = "dir"  # the candidate's own temp or build folder, or a path below it


def _join_own(kinds: Iterable[Own]) -> Own:
    """The kind every one of several possible values has (DIR when FILE and DIR mix)."""
    kinds = list(kinds)
    if not kinds or Own.NO in kinds:
        return Own.NO
    return Own.FILE if all(k is Own.FILE for k in kinds) else Own.DIR


_OWN_DIR_CALLS = frozenset({"tempfile.mkdtemp", "tempfile.gettempdir", "tempfile.gettempdirb", "os.getcwd",
                            "os.getcwdb", "pathlib.Path.cwd", "pathlib.Path.home",
                            "torch.utils.cpp_extension._get_build_directory",
                            "torch.utils.cpp_extension.get_default_build_root"})
# The build folder the judge names through the environment; its parent is shared by every program.
_OWN_DIR_ENV = frozenset({"TORCH_EXTENSIONS_DIR"})
_SAME_PATH_CALLS = frozenset({"os.path.abspath", "os.path.realpath", "os.path.normpath", "os.path.expanduser",
                              "builtins.str", "os.fspath", "pathlib.Path", "pathlib.PurePath", "pathlib.PosixPath"})
_DIRNAME_CALLS = frozenset({"os.path.dirname"})


class PathOwnership:
    """Decides, from the syntax tree alone, whether a path expression stays in the candidate's folders.

    Roots: `tempfile.mkdtemp()`/`gettempdir()`, `TemporaryDirectory()` (its name), `os.getcwd()`,
    `Path.cwd()`, `Path.home()`, `~`, torch's build-folder functions, `os.environ["TORCH_EXTENSIONS_DIR"]`
    (and `.get`/`getenv` of it), relative literal paths, and the folder of `__file__`. Joins
    (`os.path.join`, `/`, f-strings and `+` that continue with a separator) keep a root's kind;
    one parent step from `__file__` is the own folder, any other parent step leaves it. Names and
    `self.x` attributes are followed through every assignment to them: all must be own.

    A literal `..` or absolute component refuses the path; a component computed at run time is
    trusted, as every static rule trusts strings it cannot read (documented in the README).
    """

    def __init__(self, src: SourceInfo) -> None:
        self.src = src
        self.names: dict[str, list[ast.AST]] = {}
        self.attrs: dict[str, list[ast.AST]] = {}
        self.temp_objects: set[str] = set()  # names bound to tempfile objects with a `.name`
        self.open_files: dict[str, ast.Call] = {}  # names bound to open(...) file objects
        for node in ast.walk(src.tree):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    self._bind(t, node.value)
            elif isinstance(node, ast.NamedExpr):
                self._bind(node.target, node.value)
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                for item in node.items:
                    if item.optional_vars is not None:
                        self._bind_with(item.optional_vars, item.context_expr)
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
                self._bind_loop(node.target, node.iter)

    def _bind(self, target: ast.AST, value: ast.AST) -> None:
        if isinstance(target, ast.Name):
            self.names.setdefault(target.id, []).append(value)
            q = self.src.qualname(value.func) if isinstance(value, ast.Call) else None
            if q in ("tempfile.NamedTemporaryFile", "tempfile.TemporaryDirectory", "tempfile.SpooledTemporaryFile"):
                self.temp_objects.add(target.id)
            if q in ("builtins.open", "io.open") and isinstance(value, ast.Call):
                self.open_files[target.id] = value
        elif isinstance(target, ast.Attribute):
            key = _container_key(target)
            if key:
                self.attrs.setdefault(key, []).append(value)
        elif isinstance(target, (ast.Tuple, ast.List)):
            q = self.src.qualname(value.func) if isinstance(value, ast.Call) else None
            if q == "tempfile.mkstemp" and len(target.elts) == 2:
                # fd, path = tempfile.mkstemp(): the path is own when the call is
                self._bind(target.elts[1], ast.Subscript(value=value, slice=ast.Constant(1), ctx=ast.Load()))
            else:
                for t in target.elts:
                    self._bind(t, ast.Constant(value=None))  # unpacked from something unknown

    def _bind_with(self, target: ast.AST, ctx: ast.AST) -> None:
        q = self.src.qualname(ctx.func) if isinstance(ctx, ast.Call) else None
        if q == "tempfile.TemporaryDirectory" and isinstance(target, ast.Name):
            # `with TemporaryDirectory() as d`: d is the folder's name
            self.names.setdefault(target.id, []).append(ast.Attribute(value=ctx, attr="name", ctx=ast.Load()))
        else:
            self._bind(target, ctx)

    def _bind_loop(self, target: ast.AST, iterable: ast.AST) -> None:
        if isinstance(target, ast.Name):
            elts = _literal_elements(self.src, iterable)
            values = elts if elts is not None else [ast.Constant(value=None)]
            self.names.setdefault(target.id, []).extend(values)

    # -- kinds --------------------------------------------------------------------------------

    def kind(self, node: ast.AST | None, seen: frozenset[str] = frozenset()) -> Own:
        if node is None:
            return Own.NO
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return Own.DIR if _relative_and_safe(node.value) else Own.NO
        if isinstance(node, ast.Name):
            if node.id == "__file__":
                return Own.FILE
            if node.id in seen or node.id not in self.names:
                return Own.NO
            return _join_own(self.kind(v, seen | {node.id}) for v in self.names[node.id])
        if isinstance(node, ast.Attribute):
            key = _container_key(node)
            if key and key.startswith("self.") and key in self.attrs and key not in seen:
                return _join_own(self.kind(v, seen | {key}) for v in self.attrs[key])
            if node.attr == "name" and self._is_temp_object(node.value):
                return Own.DIR
            if node.attr == "parent":
                return _parent(self.kind(node.value, seen))
            return Own.NO
        if isinstance(node, ast.Subscript):
            q = self.src.qualname(node.value)
            if q in ("os.environ", "os.environb") and _const_str(node.slice) in _OWN_DIR_ENV:
                return Own.DIR
            if isinstance(node.value, ast.Call) and self.src.qualname(node.value.func) == "tempfile.mkstemp" \
                    and isinstance(node.slice, ast.Constant) and node.slice.value == 1:
                return self.tempfile_kind(node.value, "tempfile.mkstemp")
            return Own.NO
        if isinstance(node, ast.BoolOp):
            return _join_own(self.kind(v, seen) for v in node.values)
        if isinstance(node, ast.IfExp):
            return _join_own([self.kind(node.body, seen), self.kind(node.orelse, seen)])
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            return Own.DIR if self.kind(node.left, seen) is Own.DIR and _safe_component(self.src, node.right) \
                else Own.NO
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return self._concat(_added_parts(node), seen)
        if isinstance(node, ast.JoinedStr):
            return self._concat([v.value if isinstance(v, ast.FormattedValue) else v for v in node.values], seen)
        if isinstance(node, ast.Call):
            return self._call_kind(node, seen)
        return Own.NO

    def _call_kind(self, node: ast.Call, seen: frozenset[str]) -> Own:
        q = self.src.qualname(node.func) or ""
        if q in _OWN_DIR_CALLS:
            return self.tempfile_kind(node, q) if q.startswith("tempfile.") else Own.DIR
        if q in ("os.environ.get", "os.getenv") and node.args and _const_str(node.args[0]) in _OWN_DIR_ENV:
            default = node.args[1] if len(node.args) > 1 else None
            if default is None or (isinstance(default, ast.Constant) and default.value is None):
                return Own.DIR
            return _join_own([Own.DIR, self.kind(default, seen)])
        if q == "os.path.expanduser" and node.args:
            text = _const_str(node.args[0])
            if text is not None and (text == "~" or text.startswith("~/")):
                return Own.DIR if _relative_and_safe(text[2:]) else Own.NO
        if q in _SAME_PATH_CALLS and node.args:
            return self.kind(node.args[0], seen)
        if q in _DIRNAME_CALLS and node.args:
            return _parent(self.kind(node.args[0], seen))
        if q == "os.path.join" and node.args:
            first = self.kind(node.args[0], seen)
            if first is Own.DIR and all(_safe_component(self.src, a) for a in node.args[1:]):
                return Own.DIR
            return Own.NO
        if isinstance(node.func, ast.Attribute) and node.func.attr in ("resolve", "absolute", "expanduser") \
                and not node.args:
            return self.kind(node.func.value, seen)
        if isinstance(node.func, ast.Attribute) and node.func.attr == "joinpath":
            base = self.kind(node.func.value, seen)
            return Own.DIR if base is Own.DIR and all(_safe_component(self.src, a) for a in node.args) else Own.NO
        return Own.NO

    def tempfile_kind(self, node: ast.Call, q: str) -> Own:
        """A tempfile call creates inside the candidate's TMPDIR unless `dir` points elsewhere."""
        pos = _TEMPFILE_DIR_ARG.get(q)
        where = _kw(node, "dir", pos)
        if where is None or (isinstance(where, ast.Constant) and where.value is None):
            return Own.DIR
        return Own.DIR if self.kind(where) is Own.DIR else Own.NO

    def _concat(self, parts: list[ast.AST], seen: frozenset[str]) -> Own:
        """String building: an own root first, then a separator before anything else is added."""
        if not parts:
            return Own.NO
        literals = [_const_str(p) for p in parts]
        if any(t is not None and ".." in t.split("/") for t in literals):
            return Own.NO
        head = parts[0]
        if literals[0] is not None:
            return Own.DIR if _relative_and_safe(literals[0]) else Own.NO
        root = self.kind(head, seen)
        if root is not Own.DIR:
            return Own.NO
        if len(parts) == 1:
            return Own.DIR
        nxt = parts[1]
        text = _const_str(nxt)
        if text is not None:
            # f"{root}/x" stays inside; f"{root}_x" names a sibling of the folder
            return Own.DIR if text.startswith("/") or text == "" else Own.NO
        return Own.DIR if self.src.qualname(nxt) in ("os.sep", "os.path.sep") else Own.NO

    def _is_temp_object(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Call):
            return self.src.qualname(node.func) in ("tempfile.NamedTemporaryFile", "tempfile.TemporaryDirectory",
                                                     "tempfile.SpooledTemporaryFile") \
                and self.tempfile_kind(node, self.src.qualname(node.func) or "") is Own.DIR
        if isinstance(node, ast.Name) and node.id in self.temp_objects:
            return all(self._is_temp_object(v) for v in self.names.get(node.id, []) if isinstance(v, ast.Call))
        return False

    def own_file_object(self, node: ast.AST) -> bool:
        """A file object opened on an own path (for json/pickle dump and load)."""
        if isinstance(node, ast.Name):
            if node.id in self.temp_objects:
                return self._is_temp_object(node)
            call = self.open_files.get(node.id)
            return call is not None and self.kind(_kw(call, "file", 0)) is not Own.NO
        return self.kind(node) is not Own.NO

    def strings(self, node: ast.AST, seen: frozenset[str] = frozenset()) -> set[str]:
        """Literal strings a path expression can be built from (names followed), for suffix checks."""
        out: set[str] = set()
        for n in ast.walk(node):
            if isinstance(n, ast.Constant) and isinstance(n.value, str):
                out.add(n.value)
            elif isinstance(n, ast.Name) and n.id in self.names and n.id not in seen:
                for v in self.names[n.id]:
                    out |= self.strings(v, seen | {n.id})
        return out


def _added_parts(node: ast.AST) -> list[ast.AST]:
    """`a + b + c` as [a, b, c]."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _added_parts(node.left) + _added_parts(node.right)
    return [node]


def _parent(kind: Own) -> Own:
    # The folder of an own file is the own folder; the parent of the own folder is shared.
    return Own.DIR if kind is Own.FILE else Own.NO


def _relative_and_safe(text: str) -> bool:
    return not text.startswith(("/", "~", "\\")) and ".." not in re.split(r"[/\\]", text)


def _safe_component(src: SourceInfo, node: ast.AST) -> bool:
    """A component joined onto an own folder: no literal `..` or absolute part (computed ones trusted)."""
    text = _const_str(node)
    if text is not None:
        return _relative_and_safe(text)
    if isinstance(node, ast.JoinedStr) and node.values:
        first = _const_str(node.values[0])
        if first is not None and first.startswith(("/", "\\")):
            return False
        return not any(".." in re.split(r"[/\\]", _const_str(v) or "") for v in node.values)
    elements = _literal_elements(src, node) if isinstance(node, ast.Name) else None
    if elements is not None:
        return all(_safe_component(src, e) for e in elements)
    return True


def _literal_elements(src: SourceInfo, node: ast.AST, depth: int = 0) -> list[ast.AST] | None:
    """The elements of a literal tuple/list/set (directly, or through a name bound only to one)."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return list(node.elts)
    if isinstance(node, ast.Name) and depth < 3:
        values = src.assigned.get(node.id, [])
        if len(values) == 1:
            return _literal_elements(src, values[0], depth + 1)
    return None


def _open_writes(node: ast.Call) -> bool:
    mode = _kw(node, "mode", 1)
    if mode is None:
        return False
    text = _const_str(mode)
    return text is None or any(c in text for c in "wax+")


def _os_open_writes(src: SourceInfo, node: ast.Call) -> bool:
    flags = _kw(node, "flags", 1)
    if flags is None:
        return False
    names = {src.qualname(n) for n in ast.walk(flags)}
    # only read-only flags named: a read; anything else (a number, a computed value) may write
    return not (names <= {"os.O_RDONLY", "os.O_CLOEXEC", "os.O_NONBLOCK", None}
                and not isinstance(flags, ast.Constant))


@register(R.FILE_ACCESS)
def _file_access(src: SourceInfo) -> Iterator[Hit]:
    paths = PathOwnership(src)

    def judge(node: ast.Call, what: str, path: ast.AST | None, writes: bool) -> Iterator[Hit]:
        if path is None:
            return
        kind = paths.kind(path)
        shown = ast.unparse(path)[:60]
        if kind is Own.NO:
            yield Hit(_line(node), f"{what} reaches {shown}, outside the candidate's own temp and build folders")
        elif writes:
            python = sorted(s for s in paths.strings(path) if _PYTHON_FILE.search(s))
            if python:
                yield Hit(_line(node), f"{what} writes a Python file ({python[0]}): files that can shadow imports "
                                       "are refused even in the candidate's own folder")

    for node, q in src.calls():
        if _under(q, ("torch.utils.cpp_extension",)):
            continue
        if _under(q, _FD_CALLS):
            yield Hit(_line(node), f"{_pretty(q)}() uses raw file descriptors or reads other programs' files")
        elif q in _PATH_ARGS:
            positions, names = _PATH_ARGS[q]
            writes = q in _WRITING or (q in ("builtins.open", "io.open", "io.FileIO") and _open_writes(node)) \
                or (q == "os.open" and _os_open_writes(src, node))
            given = False
            for i, (pos, kw) in enumerate(zip(positions, names)):
                arg = _kw(node, kw, pos)
                if arg is not None:
                    given = True
                    # a copy's or rename's destination is what is written
                    yield from judge(node, f"{_pretty(q)}()", arg, writes and (i == len(positions) - 1))
            if not given and q not in ("os.listdir", "os.scandir", "os.walk") and not node.args:
                yield Hit(_line(node), f"{_pretty(q)}() with a path the syntax tree cannot read")
        elif q in _FILE_OBJECT_ARGS:
            pos, kw = _FILE_OBJECT_ARGS[q]
            arg = _kw(node, kw, pos)
            if arg is None or not paths.own_file_object(arg):
                yield Hit(_line(node), f"{_pretty(q)}() on a file outside the candidate's own folders")
        elif q in _TEMPFILE_DIR_ARG or q in ("tempfile.gettempdir", "tempfile.gettempdirb"):
            if q in _TEMPFILE_DIR_ARG and paths.tempfile_kind(node, q) is Own.NO:
                yield Hit(_line(node), f"{q}() creates in a folder outside the candidate's own")
        elif _under(q, ("shutil", "glob", "tempfile")) and q not in ("shutil.which", "shutil.get_terminal_size"):
            yield Hit(_line(node), f"{q}() touches files the syntax tree cannot place")
    for node in ast.walk(src.tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            attr, receiver = node.func.attr, node.func.value
            rq = src.qualname(receiver) or ""
            if rq and "()" not in rq and not rq.startswith("pathlib"):
                continue  # a module function (os.mkdir, ...), judged above by its qualified name
            if attr == "tofile":
                yield from judge(node, ".tofile()", _kw(node, "fid", 0), True)
            elif attr in _PATH_IO_METHODS or (attr in _PATHLIB_METHODS and _pathlike(src, paths, receiver)):
                yield from judge(node, f".{attr}()", receiver, attr in _PATHLIB_WRITING)
                if attr in ("rename", "replace", "symlink_to", "hardlink_to") and node.args:
                    yield from judge(node, f".{attr}()", node.args[0], True)
        elif _is_code_string(src, node) \
                and re.search(r"/proc/|/dev/(shm|fd|mem)|/sys/", node.value) and "environ" not in node.value:
            yield Hit(_line(node), f"names the system path {node.value[:40]!r}")


def _pathlike(src: SourceInfo, paths: PathOwnership, node: ast.AST) -> bool:
    """Whether a method's receiver is a pathlib path (so .exists(), .mkdir() are file access)."""
    if paths.kind(node) is not Own.NO:
        return True
    q = src.qualname(node.func) if isinstance(node, ast.Call) else src.qualname(node)
    if q and q.startswith("pathlib."):
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        return _pathlike(src, paths, node.left)
    if isinstance(node, ast.Name):
        return any(_pathlike(src, paths, v) for v in paths.names.get(node.id, [])
                   if not (isinstance(v, ast.Name) and v.id == node.id))
    return False


def _is_code_string(src: SourceInfo, node: ast.AST) -> bool:
    """A string constant the program uses (not a docstring or a bare string statement)."""
    return isinstance(node, ast.Constant) and isinstance(node.value, str) \
        and not isinstance(src.parents.get(node), ast.Expr)


def _env_writes(src: SourceInfo) -> Iterator[tuple[ast.AST, str | None, ast.AST]]:
    """(statement or call, variable name or None, the os.environ node) for environment writes."""
    for node in ast.walk(src.tree):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)) \
                and src.qualname(node.value) in ("os.environ", "os.environb", "posix.environ"):
            yield node, _const_str(node.slice), node.value
        elif isinstance(node, ast.Call):
            q = src.qualname(node.func) or ""
            if (q in ("os.putenv", "os.unsetenv") and node.args) or (q in ("os.environ.setdefault", "os.environ.pop", "os.environ.__setitem__") and node.args):
                yield node, _const_str(node.args[0]), node.func
            elif q in ("os.environ.update",):
                keys = []
                if node.args and isinstance(node.args[0], ast.Dict):
                    keys = [_const_str(k) for k in node.args[0].keys if k is not None]
                keys += [k.arg for k in node.keywords if k.arg]
                for k in keys or [None]:
                    yield node, k, node.func
            elif q in ("os.environ.clear", "os.environ.popitem"):
                yield node, None, node.func


def _env_write_nodes(src: SourceInfo) -> set[int]:
    ids = set()
    for _, _, env_node in _env_writes(src):
        for n in ast.walk(env_node):
            ids.add(id(n))
    return ids


# Build settings a program may read by name: what the judge sets for builds, never a secret.
_READABLE_ENV = frozenset(_BUILD_ENV) | {"TORCH_EXTENSIONS_VERBOSE", "CUDA_VISIBLE_DEVICES", "TRITON_INTERPRET"}


def _reads_build_setting(src: SourceInfo, node: ast.AST) -> bool:
    """os.environ["K"], os.environ.get("K"), os.getenv("K") or "K" in os.environ with K a build setting."""
    parent = src.parents.get(node)
    if isinstance(parent, ast.Subscript) and parent.value is node:
        return _const_str(parent.slice) in _READABLE_ENV
    if isinstance(parent, ast.Call) and parent.func is node and parent.args:
        return _const_str(parent.args[0]) in _READABLE_ENV
    if isinstance(parent, ast.Compare) and node in parent.comparators and len(parent.ops) == 1 \
            and isinstance(parent.ops[0], (ast.In, ast.NotIn)):
        return _const_str(parent.left) in _READABLE_ENV
    return False


@register(R.ENVIRONMENT_ACCESS)
def _environment_access(src: SourceInfo) -> Iterator[Hit]:
    writes = _env_write_nodes(src)
    for node, q in src.refs():
        if id(node) in writes or _reads_build_setting(src, node):
            continue
        if _under(q, ("os.environ", "os.environb", "posix.environ", "os.getenv", "os.getenvb")):
            if q.rsplit(".", 1)[-1] in ("setdefault", "update", "pop", "clear", "popitem"):
                continue  # writes: environment_write or a settings rule
            yield Hit(_line(node), f"reads the environment ({q})")
    for node in ast.walk(src.tree):
        if _is_code_string(src, node) and (node.value in ("environ", "environb") or "/environ" in node.value):
            yield Hit(_line(node), f"names {node.value[:40]!r}, a process environment")


@register(R.ENVIRONMENT_WRITE)
def _environment_write(src: SourceInfo) -> Iterator[Hit]:
    for node, key, _ in _env_writes(src):
        if key in _PRECISION_ENV or (key and _THREAD_ENV.match(key)):
            continue  # reported by the precision / thread rules
        if key and key.startswith(("PYTORCH_", "TORCHINDUCTOR_", "CUDA_LAUNCH", "CUBLAS_", "CUDNN_")) \
                and key not in _BUILD_ENV:
            continue  # backend settings
        if key and key.startswith("TORCH_") and key not in _BUILD_ENV:
            continue
        yield Hit(_line(node), f"sets environment variable {key or '<computed>'}")


_NETWORK_MODULES = ("socket", "ssl", "http", "urllib", "urllib3", "requests", "httpx", "aiohttp", "ftplib",
                    "smtplib", "telnetlib", "xmlrpc", "websocket", "websockets", "paramiko", "grpc", "zmq",
                    "torch.hub", "torch.distributed", "asyncio.open_connection", "asyncio.start_server")


@register(R.NETWORK_ACCESS)
def _network_access(src: SourceInfo) -> Iterator[Hit]:
    for node in ast.walk(src.tree):
        for name in _imported_modules(node):
            if _under(name, _NETWORK_MODULES):
                yield Hit(_line(node), f"imports {name}, a network module")
    for node, q in src.calls():
        if _under(q, _NETWORK_MODULES):
            yield Hit(_line(node), f"{q}() uses the network")


_NATIVE = ("ctypes", "_ctypes", "cffi", "mmap", "torch.ops.load_library", "torch.classes.load_library",
           "numpy.ctypeslib")


@register(R.NATIVE_ACCESS)
def _native_access(src: SourceInfo) -> Iterator[Hit]:
    for node in ast.walk(src.tree):
        for name in _imported_modules(node):
            if _under(name, _NATIVE):
                yield Hit(_line(node), f"imports {name}: raw native memory or library access")
    for node, q in src.calls():
        if _under(q, ("torch.ops.load_library", "torch.classes.load_library")):
            yield Hit(_line(node), f"{q}() loads an arbitrary shared library")


_DYN_IMPORT = ("builtins.__import__", "importlib", "imp", "runpy", "pkgutil", "zipimport")


@register(R.DYNAMIC_IMPORT)
def _dynamic_import(src: SourceInfo) -> Iterator[Hit]:
    for node in ast.walk(src.tree):
        for name in _imported_modules(node):
            if _under(name, ("importlib", "imp", "runpy", "pkgutil", "zipimport")):
                yield Hit(_line(node), f"imports {name}: imports by computed name")
        if isinstance(node, ast.Call):
            q = src.qualname(node.func) or ""
            if _under(q, _DYN_IMPORT):
                yield Hit(_line(node), f"{_pretty(q)}() imports a module by name at run time")
            elif _under(q, ("sys.path", "sys.meta_path", "sys.path_hooks")):
                yield Hit(_line(node), f"{q}() changes where imports come from")
        for t in _store_targets(node):
            if src.qualname(t) in ("sys.path", "sys.meta_path", "sys.path_hooks"):
                yield Hit(_line(node), "rebinds sys.path")


_CPP_RUNS_PYTHON = re.compile(r"\bPyRun_\w+|\bPy_CompileString\w*|\bPyEval_EvalCode\w*|\bPyEval_GetFrame\w*|"
                              r"\bpy(?:bind11)?::(?:exec|eval|eval_file)\b")


@register(R.DYNAMIC_CODE)
def _dynamic_code(src: SourceInfo) -> Iterator[Hit]:
    fns = ("builtins.eval", "builtins.exec", "builtins.compile", "marshal.loads", "pickle.loads", "dill",
           "types.FunctionType", "types.CodeType", "code.InteractiveInterpreter", "code.interact", "codeop")
    for node, q in src.calls():
        if _under(q, fns):
            yield Hit(_line(node), f"{_pretty(q)}() runs code built at run time")
    for node, code in _cpp_sources(src):
        m = _CPP_RUNS_PYTHON.search(code)
        if m:
            yield Hit(_line(node), f"C++ source calls {m.group(0)}: Python run from native code, out of sight of "
                                   "the Python-level checks")


_INTROSPECTION_CALLS = ("sys._getframe", "sys._current_frames", "sys.settrace", "sys.setprofile",
                        "threading.settrace", "threading.setprofile", "builtins.globals", "inspect",
                        "sys.addaudithook", "sys.setrecursionlimit", "traceback.walk_stack", "sys.exc_info")
_FRAME_ATTRS = frozenset({"f_back", "f_globals", "f_locals", "f_builtins", "f_code", "tb_frame", "gi_frame",
                          "cr_frame", "ag_frame", "__globals__", "__builtins__", "__subclasses__", "__closure__",
                          "__code__", "f_trace"})


@register(R.INTROSPECTION)
def _introspection(src: SourceInfo) -> Iterator[Hit]:
    for node in ast.walk(src.tree):
        for name in _imported_modules(node):
            if _under(name, ("inspect", "kernelrl", "__main__", "gc.get_objects", "gc.get_referrers",
                             "gc.get_referents")):
                yield Hit(_line(node), f"imports {name}: reaches into the interpreter or the harness")
        if isinstance(node, ast.Attribute) and node.attr in _FRAME_ATTRS:
            yield Hit(_line(node), f"accesses .{node.attr}: frames, globals or code objects of other code")
        elif isinstance(node, ast.Name) and node.id == "__builtins__":
            yield Hit(_line(node), "accesses __builtins__")
        elif isinstance(node, ast.Call) and src.qualname(node.func) == "builtins.getattr" and len(node.args) >= 2:
            base = src.qualname(node.args[0])
            if base and "()" not in base and base.split(".")[0] in _PATCH_ROOTS and _const_str(node.args[1]) is None:
                yield Hit(_line(node), f"getattr({base}, <computed name>) hides which attribute it reaches")
    for node, q in src.refs():
        if _under(q, ("sys.modules",)):
            yield Hit(_line(node), "accesses sys.modules, the interpreter's module table")
        elif _under(q, ("gc",)) and q != "gc.collect" and not q.startswith(("gc.disable", "gc.freeze",
                                                                             "gc.set_threshold")):
            yield Hit(_line(node), f"uses {q}: the garbage collector can reach any object, including the judge's")
        elif _under(q, ("kernelrl", "__main__")):
            yield Hit(_line(node), f"uses {q}: the harness's own modules")
    for node, q in src.calls():
        if _under(q, _INTROSPECTION_CALLS):
            yield Hit(_line(node), f"{_pretty(q)}() inspects other code's frames or globals")


# ---------------------------------------------------------------------------------------------
# Outputs: tensor subclasses and caching


@register(R.TENSOR_SUBCLASS)
def _tensor_subclass(src: SourceInfo) -> Iterator[Hit]:
    tensor_types = ("torch.Tensor", "torch._C.TensorBase", "torch._C._TensorBase", "torch.nn.Parameter",
                    "torch.nn.parameter.Parameter", "torch.tensor")
    for node in ast.walk(src.tree):
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                q = src.qualname(base)
                if q in tensor_types:
                    yield Hit(_line(node), f"class {node.name} subclasses {q}")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in (
                "__torch_function__", "__torch_dispatch__"):
            yield Hit(_line(node), f"defines {node.name}, which intercepts tensor operations")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                "as_subclass", "_make_subclass", "_make_wrapper_subclass"):
            yield Hit(_line(node), f".{node.func.attr}() creates a tensor subclass instance")
    yield from _tensor_method_overrides(src)


# Methods a harness calls on an output to move, copy or compare it. Replacing one on the object a
# candidate returns defers work to whoever reads the output. Names common as data attributes
# (size, type, max, ...) are left out: a config object's `x.size = 3` is no hack.
_TENSOR_READ_METHODS = frozenset({"detach", "cpu", "cuda", "to", "clone", "numpy", "tolist", "item", "contiguous",
                                  "float", "double", "__eq__", "__ne__", "eq", "equal", "allclose", "isclose",
                                  "__sub__", "sub", "copy_", "data_ptr", "untyped_storage", "storage", "__array__",
                                  "__repr__", "__format__", "__getitem__", "nan_to_num", "isnan", "isfinite",
                                  "__torch_function__", "__torch_dispatch__"})


def _tensor_method_overrides(src: SourceInfo) -> Iterator[Hit]:
    for node in ast.walk(src.tree):
        pairs: list[tuple[ast.AST, set[str]]] = []
        for t in _store_targets(node):
            if isinstance(t, ast.Attribute) and t.attr in _TENSOR_READ_METHODS:
                pairs.append((t.value, {t.attr}))
        if isinstance(node, ast.Call) and src.qualname(node.func) in ("builtins.setattr", "object.__setattr__") \
                and len(node.args) >= 2:
            names = _possible_strings(src, node.args[1]) or set()
            if names & _TENSOR_READ_METHODS:
                pairs.append((node.args[0], names & _TENSOR_READ_METHODS))
        for owner, names in pairs:
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            q = src.qualname(owner)
            if q and "()" not in q and q.split(".")[0] in _PATCH_ROOTS:
                continue  # torch.Tensor.cpu = ...: module_patching
            yield Hit(_line(node), f"overrides {', '.join(sorted(names))} on one object: whoever reads the "
                                   "output through that method runs the candidate's code outside the timed call")


_KEY_ATTRS = frozenset({"data_ptr", "shape", "size", "_version", "stride", "untyped_storage", "storage",
                        "_cdata", "storage_offset"})
_EMPTY_CONTAINERS = ("builtins.dict", "builtins.list", "collections.OrderedDict", "collections.defaultdict",
                     "weakref.WeakKeyDictionary", "weakref.WeakValueDictionary", "builtins.set")


def _is_empty_container(src: SourceInfo, value: ast.AST) -> bool:
    if isinstance(value, ast.Dict) and not value.keys:
        return True
    if isinstance(value, ast.List) and not value.elts:
        return True
    if isinstance(value, ast.Call) and not value.args:
        return src.qualname(value.func) in _EMPTY_CONTAINERS
    return False


def _container_key(node: ast.AST) -> str | None:
    """'self.X' or 'X' for a container expression."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return f"self.{node.attr}"
    return None


def _identity_key(src: SourceInfo, node: ast.AST, assigned: dict[str, list[ast.AST]], depth: int = 0) -> str | None:
    """What identity-like property a cache key is built from (following `key = ...` once or twice)."""
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and n.attr in _KEY_ATTRS:
            return f".{n.attr}"
        if isinstance(n, ast.Call) and src.qualname(n.func) in ("builtins.id", "builtins.hash"):
            return f"{_pretty(src.qualname(n.func) or '')}()"
        if isinstance(n, ast.Name) and depth < 2:
            for value in assigned.get(n.id, []):
                what = _identity_key(src, value, assigned, depth + 1)
                if what:
                    return what
    return None


def _assigned_values(tree: ast.AST) -> dict[str, list[ast.AST]]:
    out: dict[str, list[ast.AST]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    out.setdefault(t.id, []).append(node.value)
    return out


@register(R.OUTPUT_CACHING)
def _output_caching(src: SourceInfo) -> Iterator[Hit]:
    containers: set[str] = set()
    for node in ast.walk(src.tree):
        if isinstance(node, ast.Assign) and _is_empty_container(src, node.value):
            for t in node.targets:
                k = _container_key(t)
                if k:
                    containers.add(k)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in node.decorator_list:
                q = src.qualname(d.func if isinstance(d, ast.Call) else d)
                if q in ("functools.lru_cache", "functools.cache"):
                    yield Hit(_line(d), f"@{q} on {node.name} memoises results across calls")
        if isinstance(node, ast.Attribute) and node.attr == "_version":
            yield Hit(_line(node), "reads a tensor's _version counter, which only caches need")
    assigned = _assigned_values(src.tree)
    for node in ast.walk(src.tree):
        key_expr = None
        if isinstance(node, ast.Subscript) and _container_key(node.value) in containers:
            key_expr = node.slice
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) \
                and any(_container_key(c) in containers for c in node.comparators):
            key_expr = node.left
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("get", "setdefault", "__getitem__", "__contains__") \
                and _container_key(node.func.value) in containers and node.args:
            key_expr = node.args[0]
        if key_expr is not None:
            what = _identity_key(src, key_expr, assigned)
            if what:
                yield Hit(_line(node), f"cache keyed on {what}: results reused across calls")
    yield from _memoised_returns(src)
    yield from _hidden_state(src)


def _hidden_state(src: SourceInfo) -> Iterator[Hit]:
    """State that outlives a call without being an attribute of the module: mutable default
    arguments, attributes stored on functions, `nonlocal` closures, context variables."""
    functions = {n.name for n in src.tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for node in ast.walk(src.tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in node.args.defaults + [d for d in node.args.kw_defaults if d is not None]:
                if _is_empty_container(src, d) or isinstance(d, (ast.Dict, ast.List, ast.Set)):
                    yield Hit(_line(d), f"{node.name} keeps state across calls in a mutable default argument")
        elif isinstance(node, ast.Nonlocal):
            yield Hit(_line(node), f"a closure keeps state across calls (nonlocal {', '.join(node.names)})")
        elif isinstance(node, ast.Call) and _under(src.qualname(node.func) or "", ("contextvars.ContextVar",)):
            yield Hit(_line(node), "a context variable keeps state across calls")
        for t in _store_targets(node):
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in functions:
                yield Hit(_line(node), f"stores {t.attr} on the function {t.value.id}: state kept across calls")


def _memoised_returns(src: SourceInfo) -> Iterator[Hit]:
    """`if self.out is None: self.out = ...; return self.out` and similar memoised outputs."""
    for fn in ast.walk(src.tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or fn.name == "__init__":
            continue
        conditional: set[str] = set()
        for node in ast.walk(fn):
            if isinstance(node, ast.If):
                tested = {_container_key(n) for n in ast.walk(node.test)} - {None}
                for stmt in node.body:
                    for t in _store_targets(stmt):
                        k = _container_key(t)
                        if k and k.startswith("self.") and k in tested:
                            conditional.add(k)
        for node in ast.walk(fn):
            if isinstance(node, ast.Return) and node.value is not None:
                k = _container_key(node.value)
                if k in conditional:
                    yield Hit(_line(node), f"{fn.name} returns {k}, which it only computes when unset: a "
                                           "memoised output")
        for node in ast.walk(fn):
            if isinstance(node, ast.Global) and fn.name == "forward":
                yield Hit(_line(node), f"forward rebinds module-level state ({', '.join(node.names)}) between calls")


@register(R.RNG_SEEDING)
def _rng_seeding(src: SourceInfo) -> Iterator[Hit]:
    fns = ("torch.manual_seed", "torch.seed", "torch.random.manual_seed", "torch.random.seed",
           "torch.cuda.manual_seed", "torch.cuda.manual_seed_all", "torch.set_rng_state", "torch.cuda.set_rng_state",
           "torch.random.set_rng_state", "numpy.random.seed", "numpy.random.set_state", "random.seed",
           "random.setstate")
    for node, q in src.calls():
        if _under(q, fns):
            yield Hit(_line(node), f"{q}() seeds or restores a random generator")
    for node in ast.walk(src.tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "manual_seed" \
                and src.qualname(node.func) is None:
            yield Hit(_line(node), ".manual_seed() seeds a random generator")


# ---------------------------------------------------------------------------------------------
# Rebinding a module's entry points after construction

_ENTRY_ATTRS = frozenset({"forward", "__call__", "__class__", "_call_impl"})
_CONSTRUCTORS = frozenset({"__init__", "__new__", "__init_subclass__", "__post_init__"})


@register(R.FORWARD_REBINDING)
def _forward_rebinding(src: SourceInfo) -> Iterator[Hit]:
    """`self.forward = ...` outside the constructor, `type(m).__call__ = ...`, setattr forms, and
    class-level `X.__call__ = ...` after the class body: later calls run something other than
    the forward that was judged (typically a stored answer)."""
    for node in ast.walk(src.tree):
        targets: list[tuple[ast.AST, str]] = []
        for t in _store_targets(node):
            if isinstance(t, ast.Attribute) and t.attr in _ENTRY_ATTRS:
                targets.append((t, t.attr))
            elif isinstance(t, ast.Subscript) and isinstance(t.value, ast.Attribute) and t.value.attr == "__dict__" \
                    and _const_str(t.slice) in _ENTRY_ATTRS:
                targets.append((t, _const_str(t.slice) or ""))
        if isinstance(node, ast.Call) and src.qualname(node.func) in ("builtins.setattr", "object.__setattr__",
                                                                       "builtins.object.__setattr__") \
                and len(node.args) >= 2:
            names = _possible_strings(src, node.args[1])
            hit = sorted(n for n in names or () if n in _ENTRY_ATTRS)
            if hit:
                targets.append((node, hit[0]))
        for target, attr in targets:
            owner = target.value if isinstance(target, ast.Attribute) else None
            owner_q = src.qualname(owner) if owner is not None else None
            if owner_q and owner_q.split(".")[0] in _PATCH_ROOTS:
                continue  # torch.nn.Module.__call__ = ...: module_patching
            fn = src.enclosing(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if fn is None:
                # Module level: binding a method on a class before any instance exists is a
                # definition, except __call__/__class__, which change how the harness calls it.
                if attr in ("forward", "_call_impl"):
                    continue
            elif isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.name in _CONSTRUCTORS:
                continue
            where = "at module level" if fn is None else f"in {getattr(fn, 'name', 'a lambda')}"
            yield Hit(_line(node), f"rebinds {attr} {where}: calls after this one run something other than the "
                                   "forward that was judged")


def _possible_strings(src: SourceInfo, node: ast.AST, depth: int = 0) -> set[str] | None:
    """The strings an expression can hold: a literal, or a name bound only to literals or looped over
    a literal tuple. None when the tree cannot tell."""
    text = _const_str(node)
    if text is not None:
        return {text}
    if not isinstance(node, ast.Name) or depth > 3:
        return None
    out: set[str] = set()
    found = False
    for n in ast.walk(src.tree):
        values: list[ast.AST] = []
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == node.id for t in n.targets):
            values = [n.value]
        elif isinstance(n, (ast.For, ast.AsyncFor, ast.comprehension)) and isinstance(n.target, ast.Name) \
                and n.target.id == node.id:
            values = _literal_elements(src, n.iter) or [ast.Name(id="<unknown>", ctx=ast.Load())]
        for v in values:
            found = True
            got = _possible_strings(src, v, depth + 1)
            if got is None:
                return None
            out |= got
    return out if found else None


# ---------------------------------------------------------------------------------------------
# Custom kernels (for the strict policy)

_LOADERS = ("torch.utils.cpp_extension.load_inline", "torch.utils.cpp_extension.load")
_KERNEL_DECORATORS = ("triton.jit", "triton.autotune", "triton.heuristics", "numba.cuda.jit", "numba.njit",
                      "numba.jit", "cuda.jit", "tilelang.jit", "helion.kernel")
_KERNEL_CALLS = ("cupy.RawKernel", "cupy.RawModule", "cupy.ElementwiseKernel", "cupy.ReductionKernel",
                 "torch.cuda.jiterator._create_jit_fn", "torch.cuda.jiterator._create_multi_output_jit_fn")
_C_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_REAL_CPP = re.compile(r"\bfor\s*\(|\bwhile\s*\(|parallel_for|data_ptr|\.accessor<|packed_accessor|__m\d+|"
                       r"_mm\d*_|#pragma\s+omp|\bvec_\w+|at::vec::", re.IGNORECASE)


@dataclass(frozen=True)
class KernelInfo:
    kind: str  # "cpp", "cuda", "triton", ...
    line: int | None
    real: bool  # False: the extension only calls ATen ops
    note: str = ""


def _kw(node: ast.Call, name: str, pos: int | None) -> ast.AST | None:
    for k in node.keywords:
        if k.arg == name:
            return k.value
    if pos is not None and len(node.args) > pos:
        return node.args[pos]
    return None


def custom_kernels(src: SourceInfo) -> list[KernelInfo]:
    out: list[KernelInfo] = []
    for node, q in src.calls():
        if q in _LOADERS or q.endswith("cpp_extension.load_inline") or q.endswith("cpp_extension.load"):
            if q.endswith(".load"):
                out.append(KernelInfo(kind="cpp", line=_line(node), real=True, note="sources from files"))
                continue
            cpp = _kw(node, "cpp_sources", 1)
            cuda = _kw(node, "cuda_sources", 2)
            cpp_text = _string_value(cpp, src.strings) if cpp is not None else None
            cuda_text = _string_value(cuda, src.strings) if cuda is not None else None
            if cpp_text is None and cuda_text is None:
                # Built from something the tree cannot read (a file, a function): give the benefit
                # of the doubt; the strict policy is about fallbacks, not about proving a kernel.
                out.append(KernelInfo(kind="cpp", line=_line(node), real=True, note="source not resolvable"))
                continue
            cuda_code = _C_COMMENT.sub("", cuda_text or "")
            cpp_code = _C_COMMENT.sub("", cpp_text or "")
            if "__global__" in cuda_code:
                out.append(KernelInfo(kind="cuda", line=_line(node), real=True))
            elif _REAL_CPP.search(cpp_code) or _REAL_CPP.search(cuda_code):
                out.append(KernelInfo(kind="cpp", line=_line(node), real=True))
            else:
                out.append(KernelInfo(kind="cpp", line=_line(node), real=False,
                                      note="the extension only calls ATen/torch ops"))
        elif _under(q, _KERNEL_CALLS):
            out.append(KernelInfo(kind=q.split(".")[0], line=_line(node), real=True))
    for node in ast.walk(src.tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in node.decorator_list:
                q = src.qualname(d.func if isinstance(d, ast.Call) else d) or ""
                if _under(q, _KERNEL_DECORATORS):
                    out.append(KernelInfo(kind=q.split(".")[0], line=_line(node), real=True))
    return out


@register(R.NO_CUSTOM_KERNEL)
def _no_custom_kernel(src: SourceInfo) -> Iterator[Hit]:
    kernels = custom_kernels(src)
    if any(k.real for k in kernels):
        return
    if kernels:
        yield Hit(kernels[0].line, f"no custom kernel: {kernels[0].note}")
    else:
        yield Hit(None, "no custom kernel (load_inline with C++/CUDA code, a Triton kernel, numba/cupy kernel)")
