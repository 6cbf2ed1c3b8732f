"""Parsing Python source into syntax trees, safely from any thread.

Guarantees: `parse(source)` is `ast.parse(source)`, with the same results and errors, called by one
thread at a time. CPython 3.11 keeps the recursion depth of its tree conversion in state shared by
the whole interpreter; two threads parsing at once (the judge's groups, a search's chains, a
client's threads building requests) can fail with "SystemError: AST constructor recursion depth
mismatch" for source that parses. Every parse in kernelrl goes through here.

Does not cache trees or bound the source's size or nesting: callers decide what they parse.
"""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()


def parse(source: str) -> ast.Module:
    with _LOCK:
        return ast.parse(source)
