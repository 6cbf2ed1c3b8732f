"""A program's canonical token stream: what is left when edits that change nothing it computes are erased.

`canonical_tokens(code)` parses a program and erases, in order:

- imports: import statements are dropped and every alias is written out as the module it names
  (`nn.Linear`, `from torch import nn; nn.Linear` and `torch.nn.Linear` are one token), so import
  order, unused imports and aliasing do not count;
- equivalent spellings: `torch.matmul/mm/bmm(a, b)`, `a.matmul(b)` and `a @ b`; `torch.add/sub/
  mul/div/pow` and their tensor methods and the operators; `x.tanh()` and `torch.tanh(x)` (and
  other elementwise functions); `torch.nn.functional.f` and `torch.f`; `range(0, n, 1)` and
  `range(n)`; `x += y` and `x = x + y`; `super(C, self)` and `super()`; keyword argument order;
  numbers by value; the operands of `+` and `*` in one order;
- dead code: `pass`, bare constant statements (docstrings), branches under a constant condition,
  statements after `return`/`raise`/`break`/`continue`, and (to a fixed point) functions, classes,
  methods, assignments and attributes nothing reads;
- names: every name the program binds (classes other than `ModelNew`, functions, arguments,
  variables, loop targets, attributes it sets on objects, methods it defines other than `forward`
  and dunders) becomes `_`, so renamings and the order names first appear in do not count;
- definition order: the functions and classes of a body are sorted by their canonical text;
- layout, comments, parentheses, quote styles (the syntax tree written out by `ast.unparse`);
- inline C++/CUDA sources (string constants): comments and layout dropped, then cut into C tokens
  with every identifier that is not a keyword, type or CUDA builtin written `_`.

Guarantees: linear in the text's length (one parse, one pass per transform, bounded fixed-point
rounds); a program that does not parse is its whitespace-separated words.

Does not prove two programs equivalent: it erases the edits above, and `kernelrl.train.copies`
allows a few token edits for what it misses.
"""

from __future__ import annotations

import ast
import io
import math
import re
import tokenize
from collections.abc import Callable, Iterable

from kernelrl import syntax

_FIXED_POINT_ROUNDS = 4  # dead-code removal rounds (each can free more names)
_ERASED = "_"


def canonical_tokens(code: str) -> tuple[str, ...]:
    """The canonical token stream of a program (see the module docstring)."""
    try:
        tree = syntax.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return tuple(code.split())
    try:
        aliases = _drop_imports(tree)
        tree = _Spellings(aliases).visit(tree)
        for _ in range(_FIXED_POINT_ROUNDS):
            if not _drop_dead(tree):
                break
        _Erase(_bound_names(tree), _set_attributes(tree)).visit(tree)
        _sort_definitions(tree)
        _fill_empty(tree)
        ast.fix_missing_locations(tree)
        text = ast.unparse(tree)
    except RecursionError:
        return tuple(code.split())
    return tuple(_tokens(text))


def _dotted(node: ast.AST) -> str | None:
    """`a.b.c` of a chain of attributes on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _drop_imports(tree: ast.Module) -> dict[str, str]:
    """Every import removed from the tree; what each bound name stands for (`nn` -> `torch.nn`)."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    aliases[a.asname] = a.name
                else:
                    top = a.name.split(".")[0]
                    aliases[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                if a.name != "*":
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    _remove_statements(tree, lambda s: isinstance(s, (ast.Import, ast.ImportFrom)))
    return aliases


def _remove_statements(tree: ast.AST, drop: Callable[[ast.stmt], bool]) -> bool:
    """Remove every statement `drop(stmt)` is true of, in every body; True if any was."""
    changed = False
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            body = getattr(node, name, None)
            if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                kept = [s for s in body if not drop(s)]
                if len(kept) != len(body):
                    changed = True
                    body[:] = kept
    return changed


# Elementwise functions written either as `torch.f(x)` or `x.f()`.
_UNARY = frozenset((
    "abs", "acos", "asin", "atan", "ceil", "cos", "cosh", "erf", "exp", "expm1", "floor", "gelu", "log",
    "log1p", "log2", "neg", "reciprocal", "relu", "round", "rsqrt", "sigmoid", "sign", "silu", "sin", "sinh",
    "softplus", "sqrt", "square", "tan", "tanh", "trunc"
))
_BINARY = {"add": ast.Add, "sub": ast.Sub, "subtract": ast.Sub, "mul": ast.Mult, "multiply": ast.Mult,
           "div": ast.Div, "divide": ast.Div, "true_divide": ast.Div, "pow": ast.Pow, "matmul": ast.MatMult,
           "mm": ast.MatMult, "bmm": ast.MatMult}


class _Spellings(ast.NodeTransformer):
    """Aliases written out, equivalent spellings made one (see the module docstring)."""

    def __init__(self, aliases: dict[str, str]) -> None:
        self.aliases = aliases

    def _module_path(self, node: ast.AST) -> str | None:
        """The dotted path of an attribute chain rooted at an imported name, aliases written out."""
        dotted = _dotted(node)
        if dotted is None:
            return None
        head, _, rest = dotted.partition(".")
        if head not in self.aliases:
            return None
        path = self.aliases[head] + ("." + rest if rest else "")
        if path.startswith("torch.nn.functional."):
            path = "torch." + path[len("torch.nn.functional."):]
        return path

    def visit_Name(self, node: ast.Name) -> ast.AST:
        path = self._module_path(node) if isinstance(node.ctx, ast.Load) else None
        return ast.Name(id=path, ctx=node.ctx) if path else node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        path = self._module_path(node) if isinstance(node.ctx, ast.Load) else None
        if path:
            return ast.Name(id=path, ctx=node.ctx)
        self.generic_visit(node)
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        node.keywords.sort(key=lambda k: k.arg or "")
        func = node.func
        name = func.id if isinstance(func, ast.Name) else None
        if name and name.startswith("torch.") and not node.keywords:
            op = name[len("torch."):]
            if op in _BINARY and len(node.args) == 2:
                return ast.BinOp(left=node.args[0], op=_BINARY[op](), right=node.args[1])
        if isinstance(func, ast.Attribute) and not node.keywords and not _is_path(func.value):
            if func.attr in _BINARY and len(node.args) == 1:
                return ast.BinOp(left=func.value, op=_BINARY[func.attr](), right=node.args[0])
            if func.attr in _UNARY and not node.args:
                return ast.Call(func=ast.Name(id="torch." + func.attr, ctx=ast.Load()), args=[func.value],
                                keywords=[])
        if name == "range" and not node.keywords:
            args = node.args
            if len(args) == 3 and _is_number(args[2], 1):
                args = args[:2]
            if len(args) == 2 and _is_number(args[0], 0):
                args = args[1:]
            node.args = args
        if name == "super" and len(node.args) == 2:
            node.args = []
        return node

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.op, (ast.Add, ast.Mult)):
            # `a * b` and `b * a` alike (elementwise arithmetic commutes; for similarity, strings too)
            left, right = ast.dump(node.left), ast.dump(node.right)
            if right < left:
                node.left, node.right = node.right, node.left
        return node

    def visit_AugAssign(self, node: ast.AugAssign) -> ast.AST:
        self.generic_visit(node)
        load = _as_load(node.target)
        if load is None:
            return node
        return ast.Assign(targets=[node.target], value=ast.BinOp(left=load, op=node.op, right=node.value))

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        v = node.value
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            try:
                number = float(v)
            except OverflowError:
                return node
            if math.isfinite(number):
                return ast.Constant(value=number)
        return node


def _is_path(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and "." in node.id


def _is_number(node: ast.AST, value: float) -> bool:
    return isinstance(node, ast.Constant) and not isinstance(node.value, bool) and node.value == value


def _as_load(target: ast.AST) -> ast.expr | None:
    if isinstance(target, ast.Name):
        return ast.Name(id=target.id, ctx=ast.Load())
    if isinstance(target, ast.Attribute):
        return ast.Attribute(value=target.value, attr=target.attr, ctx=ast.Load())
    if isinstance(target, ast.Subscript):
        return ast.Subscript(value=target.value, slice=target.slice, ctx=ast.Load())
    return None


# -- dead code ----------------------------------------------------------------------------------

_KEEP_METHODS = frozenset({"forward", "__init__"})


def _drop_dead(tree: ast.Module) -> bool:
    """One round of dead-code removal; True if anything was removed. One walk of the tree."""
    loaded: set[str] = set()
    words: set[str] = set()
    method_scopes: set[int] = set()
    blocks: list[list[ast.stmt]] = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Name):
            if isinstance(n.ctx, (ast.Load, ast.Del)):
                loaded.add(n.id)
        elif isinstance(n, ast.Attribute):
            if isinstance(n.ctx, ast.Load):
                loaded.add(n.attr)
        elif isinstance(n, ast.Constant):
            # a name a string mentions (a `getattr(self, "w")`, a `load_inline(functions=["f"])`) is kept
            if isinstance(n.value, str):
                words.update(re.findall(r"[A-Za-z_]\w*", n.value[:10000]))
        elif isinstance(n, ast.ClassDef):
            method_scopes.update(id(s) for s in n.body)
        for name in ("body", "orelse", "finalbody"):
            body = getattr(n, name, None)
            if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                blocks.append(body)
    changed = _prune_blocks(blocks)
    used = loaded | words

    def dead(s: ast.stmt) -> bool:
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if id(s) in method_scopes:
                return not (s.name in _KEEP_METHODS or s.name.startswith("__") or s.name in used)
            return s.name not in used
        if isinstance(s, ast.ClassDef):
            return s.name != "ModelNew" and s.name not in used
        if isinstance(s, ast.Assign):
            return all(_unused_target(t, used) for t in s.targets)
        if isinstance(s, ast.AnnAssign):
            return s.value is None or _unused_target(s.target, used)
        return False

    for body in blocks:
        kept = [s for s in body if not dead(s)]
        if len(kept) != len(body):
            changed = True
            body[:] = kept
    return changed


def _unused_target(target: ast.AST, used: set[str]) -> bool:
    if isinstance(target, ast.Name):
        return target.id not in used
    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
        return target.attr not in used
    if isinstance(target, (ast.Tuple, ast.List)):
        return all(_unused_target(e, used) for e in target.elts)
    return False


def _prune_blocks(blocks: list[list[ast.stmt]]) -> bool:
    """`pass`, bare constants, constant conditions and unreachable statements removed from each body."""
    changed = False
    for body in blocks:
        out: list[ast.stmt] = []
        for s in body:
            if isinstance(s, ast.Pass) or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)):
                continue
            if isinstance(s, (ast.If, ast.While)) and isinstance(s.test, ast.Constant):
                if isinstance(s, ast.While) and s.test.value:
                    out.append(s)  # an endless loop stays what it is
                else:
                    out.extend(s.body if s.test.value else s.orelse)
                continue
            out.append(s)
            if isinstance(s, (ast.Return, ast.Raise, ast.Break, ast.Continue)):
                break
        if len(out) != len(body) or any(a is not b for a, b in zip(out, body)):
            changed = True
            body[:] = out
    return changed


# -- names ----------------------------------------------------------------------------------------


def _bound_names(tree: ast.AST) -> set[str]:
    """Every name the program binds (`ModelNew` and dotted module paths excepted)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            out.add(node.id)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            out.update(node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            out.add(node.name)
    out.discard("ModelNew")
    return {n for n in out if "." not in n and n not in _KEEP_METHODS and not n.startswith("__")}


def _set_attributes(tree: ast.AST) -> set[str]:
    """Attributes the program sets on objects it binds, and the methods it defines."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)):
            out.add(node.attr)
        elif isinstance(node, ast.ClassDef):
            out.update(s.name for s in node.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
                       and s.name not in _KEEP_METHODS and not s.name.startswith("__"))
    return out


class _Erase(ast.NodeTransformer):
    """Bound names and the attributes the program sets written `_`; annotations dropped."""

    def __init__(self, names: set[str], attrs: set[str]) -> None:
        self.names = names
        self.attrs = attrs

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in self.names:
            node.id = _ERASED
        return node

    def visit_arg(self, node: ast.arg) -> ast.AST:
        node.arg = _ERASED
        node.annotation = None
        return node

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        if node.attr in self.attrs and not _is_path(node.value):
            node.attr = _ERASED
        return node

    def _definition(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> ast.AST:
        if node.name in self.names or node.name in self.attrs:
            node.name = _ERASED
        if not isinstance(node, ast.ClassDef):
            node.returns = None
        self.generic_visit(node)
        return node

    visit_FunctionDef = _definition
    visit_AsyncFunctionDef = _definition
    visit_ClassDef = _definition

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST:
        self.generic_visit(node)
        if node.value is None:
            return node
        return ast.Assign(targets=[node.target], value=node.value)

    def visit_Global(self, node: ast.Global) -> ast.AST:
        node.names = [_ERASED if n in self.names else n for n in node.names]
        return node

    def visit_Nonlocal(self, node: ast.Nonlocal) -> ast.AST:
        node.names = [_ERASED if n in self.names else n for n in node.names]
        return node

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> ast.AST:
        self.generic_visit(node)
        if node.name:
            node.name = _ERASED
        return node


def _sort_definitions(tree: ast.AST) -> None:
    """The functions and classes of every body sorted by their canonical text, after the other
    statements (which keep their order)."""
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not (isinstance(body, list) and body and isinstance(body[0], ast.stmt)):
            continue
        defs = [s for s in body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        if len(defs) < 2:
            continue
        rest = [s for s in body if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        body[:] = rest + sorted(defs, key=lambda s: ast.dump(s, include_attributes=False))


def _fill_empty(tree: ast.AST) -> None:
    """A body emptied by the removals holds `pass` again, so the tree can be written out."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.For, ast.AsyncFor, ast.While,
                             ast.If, ast.With, ast.AsyncWith, ast.Try, ast.ExceptHandler)) and not node.body:
            node.body.append(ast.Pass())
        if isinstance(node, ast.Try) and not node.handlers and not node.finalbody:
            node.finalbody.append(ast.Pass())


# -- tokens ---------------------------------------------------------------------------------------

_C_KEEP = frozenset((
    "auto", "bool", "break", "case", "char", "const", "constexpr", "continue", "default", "do", "double",
    "else", "enum", "extern", "float", "for", "goto", "if", "inline", "int", "long", "namespace", "register",
    "restrict", "return", "short", "signed", "sizeof", "static", "struct", "switch", "template", "typedef",
    "typename", "union", "unsigned", "using", "void", "volatile", "while", "half", "int8_t", "int16_t",
    "int32_t", "int64_t", "uint8_t", "uint16_t", "uint32_t", "uint64_t", "size_t", "__global__", "__device__",
    "__host__", "__shared__", "__constant__", "__restrict__", "__forceinline__", "__syncthreads", "__syncwarp",
    "threadIdx", "blockIdx", "blockDim", "gridDim", "warpSize", "dim3", "torch", "Tensor", "at", "cuda",
    "include", "define", "pragma", "unroll"
))
_C_TOKEN = re.compile(r"[A-Za-z_]\w*|\d[\w.]*|::|->|<<|>>|[<>=!+\-*/%&|^]=|&&|\|\||\+\+|--|\S")


def _tokens(text: str) -> Iterable[str]:
    """Python tokens of canonical source; each string literal cut into C tokens, its identifiers
    erased (the inline C++/CUDA sources of a program)."""
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.ENDMARKER):
                continue
            if tok.type == tokenize.INDENT:
                yield "<indent>"
            elif tok.type == tokenize.DEDENT:
                yield "<dedent>"
            elif tok.type == tokenize.STRING:
                yield from _string_tokens(tok.string)
            else:
                yield tok.string
    except (tokenize.TokenError, IndentationError, SyntaxError):
        yield from text.split()


def _string_tokens(literal: str) -> Iterable[str]:
    try:
        value = ast.literal_eval(literal)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        yield literal
        return
    if not isinstance(value, str):
        yield literal
        return
    yield '"'
    for t in _C_TOKEN.findall(_strip_c_comments(value)):
        yield _ERASED if (t[0].isalpha() or t[0] == "_") and t not in _C_KEEP else t
    yield '"'


def _strip_c_comments(text: str) -> str:
    """A string constant with C/C++ comments removed, in one pass (a `//` inside a C string
    literal is kept)."""
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
    return "".join(out)
