"""Files: what a candidate reads and writes, judged by where the path points.

Rule `file_access`:
- calls that take paths (`open`, `os.*`, `shutil`, `glob`, pathlib methods, `torch.save/load`,
  numpy file I/O, `.tofile`) with a path `PathOwnership` (`paths.py`) cannot place in the
  candidate's own temp or build folders, and such calls with a path the tree cannot read;
  `pickle`/`json` dump and load on a file object not opened on an own path; tempfile calls
  whose `dir=` is elsewhere; other `shutil`/`glob`/`tempfile` functions;
- writing a Python file (`.py`, `.pyc`, `.pth`, `sitecustomize`, `usercustomize`) anywhere, the
  own folder included: `python -m` puts the working directory first on the import path, so
  such a file shadows imports of whatever runs there later. The literal names a path can be
  built from are read, loop variables over literal tuples included;
- raw file descriptors wherever they point (`os.write/read/dup/fstat/close`, `fcntl`, the
  standard streams' `fileno()`; the judge's result channel is a descriptor) and readers of
  other programs' files (`fileinput`, `linecache`);
- strings naming `/proc/`, `/dev/shm`, `/dev/fd`, `/dev/mem` or `/sys/` (environ paths are
  `environment_access`'s).

Not flagged: `torch.utils.cpp_extension` (load_inline writes its own build files), build sources
written into the candidate's own folders, `shutil.which`, importing `tempfile` or `shutil`.

Does not catch: a path component computed at run time (trusted, see `paths.py`), files reached
by native code, methods called on objects the tree cannot tell are paths. The sandbox does not
confine the file system, so this rule is a tripwire, not a wall.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from kernelrl.checks import rules as R
from kernelrl.checks.static.paths import TEMPFILE_DIR_ARG, Own, PathOwnership
from kernelrl.checks.static.registry import Hit, register
from kernelrl.checks.static.source import SourceInfo
from kernelrl.checks.static.syntax import call_arg, const_str, line_of, pretty, under

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
_SYSTEM_PATH = re.compile(r"/proc/|/dev/(shm|fd|mem)|/sys/")


def _open_writes(node: ast.Call) -> bool:
    mode = call_arg(node, "mode", 1)
    if mode is None:
        return False
    text = const_str(mode)
    return text is None or any(c in text for c in "wax+")


def _os_open_writes(src: SourceInfo, node: ast.Call) -> bool:
    flags = call_arg(node, "flags", 1)
    if flags is None:
        return False
    names = {src.qualname(n) for n in ast.walk(flags)}
    # only read-only flags named: a read; anything else (a number, a computed value) may write
    return not (names <= {"os.O_RDONLY", "os.O_CLOEXEC", "os.O_NONBLOCK", None}
                and not isinstance(flags, ast.Constant))


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


@register(R.FILE_ACCESS)
def _file_access(src: SourceInfo) -> Iterator[Hit]:
    paths = PathOwnership(src)

    def judge(node: ast.Call, what: str, path: ast.AST | None, writes: bool) -> Iterator[Hit]:
        if path is None:
            return
        kind = paths.kind(path)
        shown = ast.unparse(path)[:60]
        if kind is Own.NO:
            yield Hit(line_of(node), f"{what} reaches {shown}, outside the candidate's own temp and build folders")
        elif writes:
            python = sorted(s for s in paths.strings(path) if _PYTHON_FILE.search(s))
            if python:
                yield Hit(line_of(node), f"{what} writes a Python file ({python[0]}): files that can shadow imports "
                                         "are refused even in the candidate's own folder")

    for call, q in src.calls():
        if under(q, ("torch.utils.cpp_extension",)):
            continue
        if under(q, _FD_CALLS):
            yield Hit(line_of(call), f"{pretty(q)}() uses raw file descriptors or reads other programs' files")
        elif q in _PATH_ARGS:
            positions, names = _PATH_ARGS[q]
            writes = q in _WRITING or (q in ("builtins.open", "io.open", "io.FileIO") and _open_writes(call)) \
                or (q == "os.open" and _os_open_writes(src, call))
            given = False
            for i, (pos, kw) in enumerate(zip(positions, names)):
                arg = call_arg(call, kw, pos)
                if arg is not None:
                    given = True
                    # a copy's or rename's destination is what is written
                    yield from judge(call, f"{pretty(q)}()", arg, writes and (i == len(positions) - 1))
            if not given and q not in ("os.listdir", "os.scandir", "os.walk") and not call.args:
                yield Hit(line_of(call), f"{pretty(q)}() with a path the syntax tree cannot read")
        elif q in _FILE_OBJECT_ARGS:
            pos, kw = _FILE_OBJECT_ARGS[q]
            arg = call_arg(call, kw, pos)
            if arg is None or not paths.own_file_object(arg):
                yield Hit(line_of(call), f"{pretty(q)}() on a file outside the candidate's own folders")
        elif q in TEMPFILE_DIR_ARG or q in ("tempfile.gettempdir", "tempfile.gettempdirb"):
            if q in TEMPFILE_DIR_ARG and paths.tempfile_kind(call, q) is Own.NO:
                yield Hit(line_of(call), f"{q}() creates in a folder outside the candidate's own")
        elif under(q, ("shutil", "glob", "tempfile")) and q not in ("shutil.which", "shutil.get_terminal_size"):
            yield Hit(line_of(call), f"{q}() touches files the syntax tree cannot place")
    for node in ast.walk(src.tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            attr, receiver = node.func.attr, node.func.value
            rq = src.qualname(receiver) or ""
            if rq and "()" not in rq and not rq.startswith("pathlib"):
                continue  # a module function (os.mkdir, ...), judged above by its qualified name
            if attr == "tofile":
                yield from judge(node, ".tofile()", call_arg(node, "fid", 0), True)
            elif attr in _PATH_IO_METHODS or (attr in _PATHLIB_METHODS and _pathlike(src, paths, receiver)):
                yield from judge(node, f".{attr}()", receiver, attr in _PATHLIB_WRITING)
                if attr in ("rename", "replace", "symlink_to", "hardlink_to") and node.args:
                    yield from judge(node, f".{attr}()", node.args[0], True)
        elif (text := src.code_string(node)) is not None and _SYSTEM_PATH.search(text) and "environ" not in text:
            yield Hit(line_of(node), f"names the system path {text[:40]!r}")
