"""Other processes, and the candidate's own process's life: starting them, ending or signalling it.

Rules:
- `process_creation`: `os.fork`/`forkpty`, `os.system`/`popen`, `os.spawn*`/`exec*`,
  `posix_spawn`, `register_at_fork`, `subprocess`, `multiprocessing` (`torch.multiprocessing`
  too), process pools, `pty`; calling them or importing their modules. Thread pools that
  `multiprocessing` offers (`multiprocessing.dummy`, `pool.ThreadPool`) are left to
  `thread_creation`.
- `process_control`: `os._exit`, `os.abort`, `os.kill`/`killpg`, `sys.exit`, `exit()`/`quit()`,
  `signal`, `atexit`, `faulthandler`, and `raise SystemExit`/`KeyboardInterrupt`.

Does not catch: processes started or signals sent by native code (a C++ `fork()` or `kill()`),
or through a name the syntax tree cannot resolve. The worker runs each candidate in its own
sandboxed process and the judge's channel refuses an exit without a result
(`result_channel_forged`).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from kernelrl.checks import rules as R
from kernelrl.checks.static.registry import Hit, register
from kernelrl.checks.static.source import SourceInfo
from kernelrl.checks.static.syntax import imported_modules, line_of, pretty, under

_PROCESS_MODULES = ("subprocess", "multiprocessing", "torch.multiprocessing", "pty", "concurrent.futures.process")


@register(R.PROCESS_CREATION)
def _process_creation(src: SourceInfo) -> Iterator[Hit]:
    fns = ("os.fork", "os.forkpty", "os.system", "os.popen", "os.register_at_fork", "os.posix_spawn",
           "os.posix_spawnp", "concurrent.futures.ProcessPoolExecutor", "platform.popen")
    for node, q in src.calls():
        if under(q, fns) or q.startswith(("os.spawn", "os.exec")) or under(q, _PROCESS_MODULES):
            if under(q, ("multiprocessing.dummy", "multiprocessing.pool.ThreadPool")):
                continue  # threads, reported by thread_creation
            yield Hit(line_of(node), f"{q}() creates a process")
    for stmt in ast.walk(src.tree):
        for name in imported_modules(stmt):
            if under(name, _PROCESS_MODULES):
                yield Hit(line_of(stmt), f"imports {name}, which runs other processes")


@register(R.PROCESS_CONTROL)
def _process_control(src: SourceInfo) -> Iterator[Hit]:
    fns = ("os._exit", "os.abort", "os.kill", "os.killpg", "sys.exit", "builtins.exit", "builtins.quit",
           "signal", "atexit", "faulthandler")
    for node, q in src.calls():
        if under(q, fns):
            yield Hit(line_of(node), f"{pretty(q)}() exits, signals or hooks the process's exit")
    for stmt in ast.walk(src.tree):
        if isinstance(stmt, ast.Raise) and stmt.exc is not None:
            exc = stmt.exc.func if isinstance(stmt.exc, ast.Call) else stmt.exc
            eq = src.qualname(exc)
            if eq in ("builtins.SystemExit", "builtins.KeyboardInterrupt"):
                yield Hit(line_of(stmt), f"raises {pretty(eq)} to end the process")
