"""Work that can run outside the timed call: side streams and threads.

Rules:
- `stream_creation`: work put on a side stream (`with torch.cuda.stream(s)`, `set_stream(s)`, a
  launch with `stream=s` or `s.cuda_stream`) that is not joined before the function returns, and
  C++/CUDA sources that take a pool stream or create one (`getStreamFromPool`, `cudaStreamCreate*`)
  without ever synchronising or waiting, and C++/CUDA sources that create or switch a CUDA context
  of their own (`cuCtxCreate`, `cuCtxPushCurrent`, `cuCtxSetCurrent`, `cuGreenCtxCreate`): the
  judge's device-wide synchronisation covers the current context's work, not another's, and no
  kernel needs one. Streams are judged by use: creating one is no finding,
  nor is switching to `torch.cuda.current_stream()`. A join is `torch.cuda.synchronize()`,
  `<x>.synchronize()`, `.wait_stream(...)`, `.wait_event(...)` or `<event>.wait()` after the
  block and before the first `return` that follows it, in the same function; a `return` inside
  the block is refused.
- `thread_creation`: `threading.Thread/Timer`, executors, `asyncio` loops and tasks,
  `torch.jit.fork`, `run_in_executor`/`call_soon_threadsafe`, and Thread subclasses.
  `threading.Lock` and other primitives that start nothing are not flagged.

Does not catch: joins done in another method or a helper (flagged here, possibly wrongly),
stream handles passed through containers or C++ objects, names hidden from text (a pasted
`cudaStreamCreateWithFlags`), threads started by native code. The judge synchronises the whole
device before its clock stops and refuses work still running after the call
(`side_work_after_return`), so these are the defence that does not read code.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from kernelrl.checks import rules as R
from kernelrl.checks.static.kernels import cpp_sources
from kernelrl.checks.static.registry import Hit, register
from kernelrl.checks.static.source import SourceInfo
from kernelrl.checks.static.syntax import call_arg, container_key, line_of, under

_STREAM_MAKERS = ("torch.cuda.Stream", "torch.cuda.streams.Stream", "torch.cuda.ExternalStream",
                  "torch.cuda.streams.ExternalStream", "torch.Stream", "torch.cuda.get_stream_from_external",
                  "cupy.cuda.Stream", "numba.cuda.stream")
_STREAM_SWITCHES = ("torch.cuda.stream", "torch.cuda.StreamContext", "torch.cuda.use_stream", "torch.cuda.set_stream",
                    "torch.cuda.streams.StreamContext", "torch.cuda.utils.stream")
_JOIN_METHODS = frozenset({"synchronize", "wait_stream", "wait_event", "wait"})
# C++/CUDA sources: side streams, and what joins them.
_CPP_OWN_CONTEXT = re.compile(r"\bcu(?:Ctx(?:Create|PushCurrent|SetCurrent)|GreenCtxCreate)\w*")
_CPP_SIDE_STREAM = re.compile(r"\bgetStreamFromPool\b|\bget_stream_from_pool\b|\bcudaStreamCreate\w*|\bcuStreamCreate\w*")
_CPP_JOIN = re.compile(r"\bcudaStreamSynchronize\b|\bcudaDeviceSynchronize\b|\bcudaStreamWaitEvent\b|"
                       r"\bcudaEventSynchronize\b|\bcuStreamSynchronize\b|\bcuCtxSynchronize\b|"
                       r"\bdevice_synchronize\b|\.synchronize\s*\(|\bcuStreamWaitEvent\b")


def _stream_handles(src: SourceInfo) -> set[str]:
    """Names and `self.x` attributes bound to streams the program made."""
    out: set[str] = set()
    for node in ast.walk(src.tree):
        if isinstance(node, ast.Assign):
            made = any(isinstance(n, ast.Call) and under(src.qualname(n.func) or "", _STREAM_MAKERS)
                       for n in ast.walk(node.value))
            if made:
                for t in node.targets:
                    for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]):
                        k = container_key(e)
                        if k:
                            out.add(k)
    return out


def _mentions(node: ast.AST, handles: set[str]) -> bool:
    return any(container_key(n) in handles for n in ast.walk(node))


def _current_stream(src: SourceInfo, call: ast.Call) -> bool:
    """torch.cuda.stream(torch.cuda.current_stream()) and the like switch to the stream already in use."""
    arg = call_arg(call, "stream", 0)
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
                if isinstance(ctx, ast.Call) and under(src.qualname(ctx.func) or "", _STREAM_SWITCHES) \
                        and not _current_stream(src, ctx):
                    yield node, f"work under {ast.unparse(ctx)[:50]}"
                elif container_key(ctx) in handles:
                    yield node, f"work under stream {container_key(ctx)}"
        elif isinstance(node, ast.Call):
            q = src.qualname(node.func) or ""
            parent = src.parents.get(node)
            in_with = isinstance(parent, ast.withitem)
            if under(q, _STREAM_SWITCHES) and not in_with and not _current_stream(src, node):
                yield node, f"{q}() switches the current stream"
            elif not in_with:
                for kw in node.keywords:
                    if kw.arg == "stream" and _mentions(kw.value, handles):
                        yield node, f"launch with stream={ast.unparse(kw.value)[:40]}"
                        break
                else:
                    if any(isinstance(a, ast.Attribute) and a.attr in ("cuda_stream", "ptr", "handle")
                           and container_key(a.value) in handles for a in node.args):
                        yield node, "launch on a stream handle the program made"


def _joined_after(src: SourceInfo, use: ast.AST) -> bool:
    """A join (synchronize, wait_stream, wait_event, event.wait) after the use and before any return
    that follows it in the same function."""
    scope = src.enclosing(use, (ast.FunctionDef, ast.AsyncFunctionDef)) or src.tree
    end = getattr(use, "end_lineno", None) or line_of(use) or 0
    start = line_of(use) or 0
    returns = sorted(line_of(n) or 0 for n in ast.walk(scope) if isinstance(n, ast.Return) and (line_of(n) or 0) >= start)
    limit = returns[0] if returns else float("inf")
    if limit <= end:
        return False  # returns from inside the block that put work on the side stream
    for n in ast.walk(scope):
        if not isinstance(n, ast.Call) or not (end < (line_of(n) or 0) <= limit):
            continue
        q = src.qualname(n.func) or ""
        if q in ("torch.cuda.synchronize", "torch.cuda.current_stream().synchronize"):
            return True
        if isinstance(n.func, ast.Attribute) and n.func.attr in _JOIN_METHODS:
            return True
    return False


@register(R.STREAM_CREATION)
def _stream_creation(src: SourceInfo) -> Iterator[Hit]:
    handles = _stream_handles(src)
    for use, what in _stream_uses(src, handles):
        if not _joined_after(src, use):
            yield Hit(line_of(use), f"{what}, not joined before returning: work on a side stream can escape the "
                                    "timed stream (join it with wait_stream, synchronize or an event)")
    for node, code in cpp_sources(src):
        ctx = _CPP_OWN_CONTEXT.search(code)
        if ctx:
            yield Hit(line_of(node), f"C++/CUDA source calls {ctx.group(0)}: work in a CUDA context of its own escapes "
                                     "the device-wide synchronisation of the timed call's context")
        m = _CPP_SIDE_STREAM.search(code)
        if m and not _CPP_JOIN.search(code):
            yield Hit(line_of(node), f"C++/CUDA source uses {m.group(0)} and never synchronises or waits on it: "
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
        if under(q, _THREAD_CALLS):
            yield Hit(line_of(node), f"{q}() starts concurrent work that can run after forward returns")
        elif isinstance(node.func, ast.Attribute) and node.func.attr in ("run_in_executor", "call_soon_threadsafe"):
            yield Hit(line_of(node), f".{node.func.attr}() schedules work on another thread")
    for cls in ast.walk(src.tree):
        if isinstance(cls, ast.ClassDef):
            for base in cls.bases:
                bq = src.qualname(base)
                if bq and under(bq, ("threading.Thread", "threading.Timer")):
                    yield Hit(line_of(cls), f"class {cls.name} subclasses {bq}")
