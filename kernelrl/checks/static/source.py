"""A parsed candidate, as every static rule reads it: parent links and import-aware names.

Guarantees: `SourceInfo` never executes, imports or compiles the candidate. `qualname` resolves an
expression to the dotted name it refers to through the candidate's own imports and simple
aliases (`import torch.nn.functional as F`, `T = threading.Thread`, `from os import system`,
`getattr(torch, "allclose")`, `sys.modules["time"]`, `__import__("os")`, builtins the program
does not redefine), so renaming a module does not hide a call from any rule. The tree-wide
questions rules share live here too: which strings a name can hold, the elements of a literal
tuple, whether a string constant is used as a value.

Does not guarantee: flow sensitivity. An alias assigned anywhere counts everywhere, only pure
name chains alias (a call's result does not), and three rounds of alias propagation are made;
names computed at run time resolve to nothing.
"""

from __future__ import annotations

import ast
import builtins
import functools
from collections.abc import Iterator

from kernelrl.checks.static.syntax import const_str, string_value

_BUILTIN_NAMES = frozenset(dir(builtins))


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
        out: dict[str, list[ast.AST]] = {}
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        out.setdefault(t.id, []).append(node.value)
        return out

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
            key = const_str(node.slice)
            if base == "sys.modules" and key:
                return key
            return None
        if isinstance(node, ast.Call):
            fn = self.qualname(node.func)
            if fn in ("builtins.__import__", "importlib.import_module", "sys.modules.get") and node.args:
                name = const_str(node.args[0])
                if name:
                    return name
            if fn == "builtins.getattr" and len(node.args) >= 2:
                base = self.qualname(node.args[0])
                attr = const_str(node.args[1])
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

    # -- values -------------------------------------------------------------------------------

    def code_string(self, node: ast.AST) -> str | None:
        """The text of a string constant the program uses (not a docstring or a bare string statement)."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and not isinstance(self.parents.get(node), ast.Expr):
            return node.value
        return None

    def literal_elements(self, node: ast.AST, depth: int = 0) -> list[ast.AST] | None:
        """The elements of a literal tuple/list/set (directly, or through a name bound only to one)."""
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return list(node.elts)
        if isinstance(node, ast.Name) and depth < 3:
            values = self.assigned.get(node.id, [])
            if len(values) == 1:
                return self.literal_elements(values[0], depth + 1)
        return None

    def possible_strings(self, node: ast.AST, depth: int = 0) -> set[str] | None:
        """The strings an expression can hold: a literal, or a name bound only to literals or looped over
        a literal tuple. None when the tree cannot tell."""
        text = const_str(node)
        if text is not None:
            return {text}
        if not isinstance(node, ast.Name) or depth > 3:
            return None
        out: set[str] = set()
        found = False
        for n in ast.walk(self.tree):
            values: list[ast.AST] = []
            if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == node.id for t in n.targets):
                values = [n.value]
            elif isinstance(n, (ast.For, ast.AsyncFor, ast.comprehension)) and isinstance(n.target, ast.Name) \
                    and n.target.id == node.id:
                values = self.literal_elements(n.iter) or [ast.Name(id="<unknown>", ctx=ast.Load())]
            for v in values:
                found = True
                got = self.possible_strings(v, depth + 1)
                if got is None:
                    return None
                out |= got
        return out if found else None


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


def _module_strings(tree: ast.Module) -> dict[str, str]:
    """Names bound to string constants anywhere (for load_inline sources kept in variables)."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            text = string_value(node.value, out)
            if text is not None:
                out[node.targets[0].id] = text
    return out
