"""Modules a candidate may not reach: the network, raw native memory, and the import machinery.

Rules:
- `network_access`: importing or calling sockets, `ssl`, HTTP/FTP/SMTP clients (`http`,
  `urllib`, `requests`, `httpx`, `aiohttp`, ...), RPC and messaging (`grpc`, `zmq`, `xmlrpc`),
  `torch.hub` and `torch.distributed`.
- `native_access`: importing `ctypes`, `cffi`, `mmap` or `numpy.ctypeslib`, and
  `torch.ops.load_library`/`torch.classes.load_library` (arbitrary shared libraries). Building a
  kernel with `torch.utils.cpp_extension` is not native access.
- `dynamic_import`: importing or calling `importlib`, `imp`, `runpy`, `pkgutil`, `zipimport`,
  `__import__`, and changing where imports come from (`sys.path`, `sys.meta_path`,
  `sys.path_hooks`: calls on them or rebinding them).

Does not catch: the same reached through native code (a compiled extension that opens a socket
or maps memory), or through names the tree cannot resolve. The sandbox does not isolate the
network namespace (`kernelrl.judge.isolation.sandbox`), so for the network these rules are the only
defence; what native code could reach of the judge's state lives in another process.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from kernelrl.checks import rules as R
from kernelrl.checks.static.registry import Hit, register
from kernelrl.checks.static.source import SourceInfo
from kernelrl.checks.static.syntax import imported_modules, line_of, pretty, store_targets, under

_NETWORK_MODULES = ("socket", "ssl", "http", "urllib", "urllib3", "requests", "httpx", "aiohttp", "ftplib",
                    "smtplib", "telnetlib", "xmlrpc", "websocket", "websockets", "paramiko", "grpc", "zmq",
                    "torch.hub", "torch.distributed", "asyncio.open_connection", "asyncio.start_server")


@register(R.NETWORK_ACCESS)
def _network_access(src: SourceInfo) -> Iterator[Hit]:
    for stmt in ast.walk(src.tree):
        for name in imported_modules(stmt):
            if under(name, _NETWORK_MODULES):
                yield Hit(line_of(stmt), f"imports {name}, a network module")
    for call, q in src.calls():
        if under(q, _NETWORK_MODULES):
            yield Hit(line_of(call), f"{q}() uses the network")


_NATIVE = ("ctypes", "_ctypes", "cffi", "mmap", "torch.ops.load_library", "torch.classes.load_library",
           "numpy.ctypeslib")


@register(R.NATIVE_ACCESS)
def _native_access(src: SourceInfo) -> Iterator[Hit]:
    for stmt in ast.walk(src.tree):
        for name in imported_modules(stmt):
            if under(name, _NATIVE):
                yield Hit(line_of(stmt), f"imports {name}: raw native memory or library access")
    for call, q in src.calls():
        if under(q, ("torch.ops.load_library", "torch.classes.load_library")):
            yield Hit(line_of(call), f"{q}() loads an arbitrary shared library")


_DYN_IMPORT = ("builtins.__import__", "importlib", "imp", "runpy", "pkgutil", "zipimport")


@register(R.DYNAMIC_IMPORT)
def _dynamic_import(src: SourceInfo) -> Iterator[Hit]:
    for node in ast.walk(src.tree):
        for name in imported_modules(node):
            if under(name, ("importlib", "imp", "runpy", "pkgutil", "zipimport")):
                yield Hit(line_of(node), f"imports {name}: imports by computed name")
        if isinstance(node, ast.Call):
            q = src.qualname(node.func) or ""
            if under(q, _DYN_IMPORT):
                yield Hit(line_of(node), f"{pretty(q)}() imports a module by name at run time")
            elif under(q, ("sys.path", "sys.meta_path", "sys.path_hooks")):
                yield Hit(line_of(node), f"{q}() changes where imports come from")
        for t in store_targets(node):
            if src.qualname(t) in ("sys.path", "sys.meta_path", "sys.path_hooks"):
                yield Hit(line_of(node), "rebinds sys.path")
