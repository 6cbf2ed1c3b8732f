"""Where a path expression points: inside the candidate's own temp and build folders, or not.

The worker runs a candidate with its own temporary folder as cwd, HOME and TMPDIR and names its
build folder in `TORCH_EXTENSIONS_DIR`. `PathOwnership.kind` decides from the syntax tree alone
whether a path stays there: `Own.DIR` (the own folder or below it), `Own.FILE` (a file directly
in it: `__file__`) or `Own.NO`; its docstring lists the roots and joins it follows.
`file_access` (`files.py`) refuses what it cannot place.

Guarantees: a path is own only when every value each name or `self.x` attribute in it is ever
assigned is own (a function parameter is not); a literal `..` or absolute component, a step
out of the own folder to its parent (which is shared) or a sibling name (`root + "_x"`) refuses it;
tempfile calls are own unless their `dir` is not.

Does not guarantee: a component computed at run time (`os.path.join(root, name)` with `name`
from a hash or an argument) is trusted, so a computed `".."` escapes, as any string built at run
time escapes every static rule. The sandbox does not confine the file system either, so this is
a tripwire, not a wall.
"""

from __future__ import annotations

import ast
import enum
import re
from collections.abc import Iterable

from kernelrl.checks.static.source import SourceInfo
from kernelrl.checks.static.syntax import call_arg, const_str, container_key

# tempfile calls create inside TMPDIR (the candidate's own folder) unless `dir` points elsewhere.
TEMPFILE_DIR_ARG: dict[str, int] = {"tempfile.mkdtemp": 2, "tempfile.mkstemp": 2, "tempfile.mktemp": 2,
                                    "tempfile.TemporaryDirectory": 2, "tempfile.NamedTemporaryFile": 6,
                                    "tempfile.TemporaryFile": 6, "tempfile.SpooledTemporaryFile": 7}
_OWN_DIR_CALLS = frozenset({"tempfile.mkdtemp", "tempfile.gettempdir", "tempfile.gettempdirb", "os.getcwd",
                            "os.getcwdb", "pathlib.Path.cwd", "pathlib.Path.home",
                            "torch.utils.cpp_extension._get_build_directory",
                            "torch.utils.cpp_extension.get_default_build_root"})
# The build folder the judge names through the environment; its parent is shared by every program.
_OWN_DIR_ENV = frozenset({"TORCH_EXTENSIONS_DIR"})
_SAME_PATH_CALLS = frozenset({"os.path.abspath", "os.path.realpath", "os.path.normpath", "os.path.expanduser",
                              "builtins.str", "os.fspath", "pathlib.Path", "pathlib.PurePath", "pathlib.PosixPath"})
_DIRNAME_CALLS = frozenset({"os.path.dirname"})
_TEMP_OBJECTS = ("tempfile.NamedTemporaryFile", "tempfile.TemporaryDirectory", "tempfile.SpooledTemporaryFile")


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

    def _bind(self, target: ast.AST, value: ast.expr) -> None:
        if isinstance(target, ast.Name):
            self.names.setdefault(target.id, []).append(value)
            q = self.src.qualname(value.func) if isinstance(value, ast.Call) else None
            if q in _TEMP_OBJECTS:
                self.temp_objects.add(target.id)
            if q in ("builtins.open", "io.open") and isinstance(value, ast.Call):
                self.open_files[target.id] = value
        elif isinstance(target, ast.Attribute):
            key = container_key(target)
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

    def _bind_with(self, target: ast.AST, ctx: ast.expr) -> None:
        q = self.src.qualname(ctx.func) if isinstance(ctx, ast.Call) else None
        if q == "tempfile.TemporaryDirectory" and isinstance(target, ast.Name):
            # `with TemporaryDirectory() as d`: d is the folder's name
            self.names.setdefault(target.id, []).append(ast.Attribute(value=ctx, attr="name", ctx=ast.Load()))
        else:
            self._bind(target, ctx)

    def _bind_loop(self, target: ast.AST, iterable: ast.AST) -> None:
        if isinstance(target, ast.Name):
            elts = self.src.literal_elements(iterable)
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
            key = container_key(node)
            if key and key.startswith("self.") and key in self.attrs and key not in seen:
                return _join_own(self.kind(v, seen | {key}) for v in self.attrs[key])
            if node.attr == "name" and self._is_temp_object(node.value):
                return Own.DIR
            if node.attr == "parent":
                return _parent(self.kind(node.value, seen))
            return Own.NO
        if isinstance(node, ast.Subscript):
            q = self.src.qualname(node.value)
            if q in ("os.environ", "os.environb") and const_str(node.slice) in _OWN_DIR_ENV:
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
            return Own.DIR if self.kind(node.left, seen) is Own.DIR and self.safe_component(node.right) \
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
        if q in ("os.environ.get", "os.getenv") and node.args and const_str(node.args[0]) in _OWN_DIR_ENV:
            default = node.args[1] if len(node.args) > 1 else None
            if default is None or (isinstance(default, ast.Constant) and default.value is None):
                return Own.DIR
            return _join_own([Own.DIR, self.kind(default, seen)])
        if q == "os.path.expanduser" and node.args:
            text = const_str(node.args[0])
            if text is not None and (text == "~" or text.startswith("~/")):
                return Own.DIR if _relative_and_safe(text[2:]) else Own.NO
        if q in _SAME_PATH_CALLS and node.args:
            return self.kind(node.args[0], seen)
        if q in _DIRNAME_CALLS and node.args:
            return _parent(self.kind(node.args[0], seen))
        if q == "os.path.join" and node.args:
            first = self.kind(node.args[0], seen)
            if first is Own.DIR and all(self.safe_component(a) for a in node.args[1:]):
                return Own.DIR
            return Own.NO
        if isinstance(node.func, ast.Attribute) and node.func.attr in ("resolve", "absolute", "expanduser") \
                and not node.args:
            return self.kind(node.func.value, seen)
        if isinstance(node.func, ast.Attribute) and node.func.attr == "joinpath":
            base = self.kind(node.func.value, seen)
            return Own.DIR if base is Own.DIR and all(self.safe_component(a) for a in node.args) else Own.NO
        return Own.NO

    def tempfile_kind(self, node: ast.Call, q: str) -> Own:
        """A tempfile call creates inside the candidate's TMPDIR unless `dir` points elsewhere."""
        pos = TEMPFILE_DIR_ARG.get(q)
        where = call_arg(node, "dir", pos)
        if where is None or (isinstance(where, ast.Constant) and where.value is None):
            return Own.DIR
        return Own.DIR if self.kind(where) is Own.DIR else Own.NO

    def _concat(self, parts: list[ast.AST], seen: frozenset[str]) -> Own:
        """String building: an own root first, then a separator before anything else is added."""
        if not parts:
            return Own.NO
        literals = [const_str(p) for p in parts]
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
        text = const_str(nxt)
        if text is not None:
            # f"{root}/x" stays inside; f"{root}_x" names a sibling of the folder
            return Own.DIR if text.startswith("/") or text == "" else Own.NO
        return Own.DIR if self.src.qualname(nxt) in ("os.sep", "os.path.sep") else Own.NO

    def _is_temp_object(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Call):
            return self.src.qualname(node.func) in _TEMP_OBJECTS \
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
            return call is not None and self.kind(call_arg(call, "file", 0)) is not Own.NO
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

    def safe_component(self, node: ast.AST) -> bool:
        """A component joined onto an own folder: no literal `..` or absolute part (computed ones trusted)."""
        text = const_str(node)
        if text is not None:
            return _relative_and_safe(text)
        if isinstance(node, ast.JoinedStr) and node.values:
            first = const_str(node.values[0])
            if first is not None and first.startswith(("/", "\\")):
                return False
            return not any(".." in re.split(r"[/\\]", const_str(v) or "") for v in node.values)
        elements = self.src.literal_elements(node) if isinstance(node, ast.Name) else None
        if elements is not None:
            return all(self.safe_component(e) for e in elements)
        return True


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
