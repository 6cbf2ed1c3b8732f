"""What single syntax nodes and dotted names say, asked by every static rule family.

Guarantees: pure functions of one node (or one dotted name) and nothing else: a string constant's
text, the value a string expression is built from, a call's argument by keyword or position, the
targets a statement stores to, the modules an import names, the `X` / `self.X` key of a
container, whether a dotted name lies under a prefix. None of them resolves names through the
candidate's imports: that is `SourceInfo` (`source.py`), which needs the whole tree.

Does not guarantee: anything about values computed at run time. A node these helpers cannot
read gives None (or an empty list); a string built partly at run time gives only its literal
parts, which is what the rules that read code strings (kernel sources, build flags) need.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable


def const_str(node: ast.AST | None) -> str | None:
    """The text of a string constant, else None."""
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def string_value(node: ast.AST, known: dict[str, str]) -> str | None:
    """The text a string expression is built from: constants, f-strings (their literal parts), `+`,
    names in `known`, and lists or tuples of strings (joined by newlines). None when no part is known."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(string_value(v, known) or "" for v in node.values)
    if isinstance(node, ast.FormattedValue):
        return string_value(node.value, known)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = string_value(node.left, known), string_value(node.right, known)
        if left is None and right is None:
            return None
        return (left or "") + (right or "")
    if isinstance(node, ast.Name):
        return known.get(node.id)
    if isinstance(node, (ast.List, ast.Tuple)):
        parts = [string_value(e, known) for e in node.elts]
        if all(p is None for p in parts):
            return None
        return "\n".join(p or "" for p in parts)
    return None


def under(q: str, prefixes: Iterable[str]) -> str | None:
    """The first prefix that `q` equals or extends by attribute access, else None."""
    for p in prefixes:
        # `open().write` is the result of open(), already reported at the open() call
        if q == p or (q.startswith(p + ".") and "()" not in q[len(p):]):
            return p
    return None


def line_of(node: ast.AST) -> int | None:
    return getattr(node, "lineno", None)


def pretty(q: str) -> str:
    """A qualified name as a person writes it (`builtins.open` is `open`)."""
    return q.removeprefix("builtins.")


def call_arg(node: ast.Call, name: str, pos: int | None) -> ast.AST | None:
    """A call's argument given by keyword `name` or at position `pos`."""
    for k in node.keywords:
        if k.arg == name:
            return k.value
    if pos is not None and len(node.args) > pos:
        return node.args[pos]
    return None


def container_key(node: ast.AST) -> str | None:
    """'self.X' or 'X' for a container expression."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return f"self.{node.attr}"
    return None


def store_targets(node: ast.AST) -> list[ast.AST]:
    """What a statement assigns, augments, annotates or deletes (tuple targets unpacked one level)."""
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


def imported_modules(node: ast.AST) -> list[str]:
    """The modules an import statement names (`from m import x` names `m` and `m.x`)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and not node.level:
        return [node.module] + [f"{node.module}.{a.name}" for a in node.names if a.name != "*"]
    return []
