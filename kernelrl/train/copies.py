"""Copies: is a generated program one its prompt already showed?

A contrastive prompt shows the task's best versions with their measured speedups, and a
refinement turn shows the episode's earlier answers. Under CUDA-L1's absolute-speedup reward a
policy shown a 3x version earns 3x by writing it out again (and with the code database's reuse,
without even being judged): it can collapse into copying. What should pay is improving on what
was shown, so the reward pays a copy as no speedup (`kernelrl.reward`, property 8) and the
trainer records it as a copy.

`program_key(code)` is a canonical form of a program: Python's syntax tree (so whitespace,
comments and docstrings do not count), every name the program binds (its classes, functions,
arguments, variables, import aliases and attributes set on `self`) renamed in order of first
binding, and string constants (inline C++/CUDA sources) with their `//` and `/* */` comments
removed and whitespace collapsed. `shown_keys(prompt)` is the set of keys of every complete
fenced block in a prompt, and `is_copy(code, shown)` asks whether a program's key is among them.

Guarantees: two programs that differ only in layout, comments, docstrings or the names they
bind have the same key; a program that does not parse is compared by its text with whitespace
collapsed; every step is linear in the text's length (the syntax tree walk, one scan per
string), so a hostile answer cannot stall the reward.

Does not catch a copy with a real but useless change (an extra statement, a reordered
expression, a changed constant): those are new programs and are judged and paid as such. The
names of attributes of modules (`torch.relu`) and of other objects are kept: renaming them would
make different programs equal.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable

from kernelrl import syntax
from kernelrl.candidate import fenced_blocks


def program_key(code: str) -> str:
    """The canonical form of a program (see the module docstring)."""
    try:
        tree = syntax.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return "text:" + " ".join(code.split())
    try:
        _Canonical(_bound_names(tree)).visit(tree)
        return "ast:" + ast.dump(tree, annotate_fields=False, include_attributes=False)
    except RecursionError:
        return "text:" + " ".join(code.split())


def shown_keys(prompt: str) -> frozenset[str]:
    """The keys of every complete fenced block of a prompt: the programs it showed."""
    return frozenset(program_key(body) for _, body in fenced_blocks(prompt))


def is_copy(code: str | None, shown: Iterable[str]) -> bool:
    """`code` is one of the programs whose keys are `shown`."""
    if code is None:
        return False
    keys = shown if isinstance(shown, (set, frozenset)) else frozenset(shown)
    return bool(keys) and program_key(code) in keys


def _bound_names(tree: ast.AST) -> dict[str, str]:
    """Every name the program binds, in order of first binding, to a canonical name."""
    order: dict[str, str] = {}

    def bind(name: str | None) -> None:
        if name and name not in order and name != "self":
            order[name] = f"n{len(order)}"

    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bind(node.name)
        elif isinstance(node, ast.arg):
            bind(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bind(node.id)
        elif isinstance(node, ast.alias):
            bind(node.asname or node.name.split(".")[0])
        elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
              and isinstance(node.value, ast.Name) and node.value.id == "self"):
            bind("self." + node.attr)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            for name in node.names:
                bind(name)
    return order


class _Canonical(ast.NodeTransformer):
    """Renames bound names, drops docstrings, normalises string constants, in place."""

    def __init__(self, names: dict[str, str]) -> None:
        self.names = names

    def _name(self, name: str) -> str:
        return self.names.get(name, name)

    def visit_Name(self, node: ast.Name) -> ast.AST:
        node.id = self._name(node.id)
        return node

    def visit_arg(self, node: ast.arg) -> ast.AST:
        node.arg = self._name(node.arg)
        node.annotation = None
        return node

    def visit_alias(self, node: ast.alias) -> ast.AST:
        # The module imported is kept; what it is bound to is renamed.
        node.asname = self._name(node.asname or node.name.split(".")[0])
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.value, ast.Name) and node.value.id == "self" and ("self." + node.attr) in self.names:
            node.attr = self.names["self." + node.attr]
        return node

    def visit_Global(self, node: ast.Global) -> ast.AST:
        node.names = [self._name(n) for n in node.names]
        return node

    def visit_Nonlocal(self, node: ast.Nonlocal) -> ast.AST:
        node.names = [self._name(n) for n in node.names]
        return node

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        if isinstance(node.value, str):
            node.value = _normalise_source_text(node.value)
        return node

    def _body(self, node: ast.AST) -> None:
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            body.pop(0)  # a docstring
            if not body:
                body.append(ast.Pass())

    def visit_Module(self, node: ast.Module) -> ast.AST:
        self._body(node)
        self.generic_visit(node)
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        self._body(node)
        node.name = self._name(node.name)
        node.returns = None
        self.generic_visit(node)
        return node

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> ast.AST:
        self._body(node)
        node.name = self._name(node.name)
        node.returns = None
        self.generic_visit(node)
        return node

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.AST:
        self._body(node)
        node.name = self._name(node.name)
        self.generic_visit(node)
        return node


def _normalise_source_text(text: str) -> str:
    """A string constant with C/C++ comments removed and whitespace collapsed, in one pass.

    String and character literals inside the text are kept as they are (a `//` inside a C
    string is not a comment)."""
    out: list[str] = []
    i, n = 0, len(text)
    quote = ""
    while i < n:
        c = text[i]
        if quote:
            out.append(c)
            if c == "\\" and i + 1 < n:
                out.append(text[i + 1])
                i += 2
                continue
            if c == quote:
                quote = ""
            i += 1
            continue
        if c in "\"'":
            quote = c
            out.append(c)
            i += 1
        elif text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            out.append(" ")
            i = n if end < 0 else end + 2
        else:
            out.append(c)
            i += 1
    return " ".join("".join(out).split())
