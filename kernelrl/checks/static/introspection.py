"""Code that reads or rewrites other code: frames, globals, the module table, code built at run time.

Rules:
- `introspection`: `sys._getframe`, `sys._current_frames`, trace and profile hooks, audit
  hooks, `inspect`, `traceback.walk_stack`, `sys.exc_info`, `globals()`; frame and function
  internals (`f_back`, `f_globals`, `f_locals`, `tb_frame`, `__globals__`, `__code__`,
  `__closure__`, `__subclasses__`, ...); `__builtins__`; `sys.modules`; the garbage collector
  beyond `gc.collect` (and the switches `backend_setting_change` judges); `getattr` on a shared
  module with a computed name (which hides which attribute it reaches); importing or using
  `kernelrl` or `__main__`, the harness's own modules.
- `dynamic_code`: `eval`, `exec`, builtin `compile`, `marshal`/`pickle.loads`, `dill`,
  `types.FunctionType`/`CodeType`, `code`/`codeop` interpreters; and C++ sources that run Python
  (`PyRun_*`, `Py_CompileString`, `PyEval_EvalCode`, `PyEval_GetFrame`, `py::exec/eval`), out of
  sight of every Python-level rule. `torch.compile` and `re.compile` are not dynamic code.

These are the primitives any hiding from the syntax tree needs (a string decoded at run time
becomes code or an attribute name only through one of them), so refusing them is what makes the
other rules' name resolution hard to evade.

Does not catch: the same done by native code that does not name the Python C API in a string
the tree can read (a prebuilt library, names pasted by the preprocessor). The judge's frames and
modules live in another process, and the dynamic checks do not read code.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from kernelrl.checks import rules as R
from kernelrl.checks.static.kernels import cpp_sources
from kernelrl.checks.static.patching import PATCH_ROOTS
from kernelrl.checks.static.registry import Hit, register
from kernelrl.checks.static.source import SourceInfo
from kernelrl.checks.static.syntax import const_str, imported_modules, line_of, pretty, under

_CPP_RUNS_PYTHON = re.compile(r"\bPyRun_\w+|\bPy_CompileString\w*|\bPyEval_EvalCode\w*|\bPyEval_GetFrame\w*|"
                              r"\bpy(?:bind11)?::(?:exec|eval|eval_file)\b")


@register(R.DYNAMIC_CODE)
def _dynamic_code(src: SourceInfo) -> Iterator[Hit]:
    fns = ("builtins.eval", "builtins.exec", "builtins.compile", "marshal.loads", "pickle.loads", "dill",
           "types.FunctionType", "types.CodeType", "code.InteractiveInterpreter", "code.interact", "codeop")
    for call, q in src.calls():
        if under(q, fns):
            yield Hit(line_of(call), f"{pretty(q)}() runs code built at run time")
    for node, code in cpp_sources(src):
        m = _CPP_RUNS_PYTHON.search(code)
        if m:
            yield Hit(line_of(node), f"C++ source calls {m.group(0)}: Python run from native code, out of sight of "
                                     "the Python-level checks")


_INTROSPECTION_CALLS = ("sys._getframe", "sys._current_frames", "sys.settrace", "sys.setprofile",
                        "threading.settrace", "threading.setprofile", "builtins.globals", "inspect",
                        "sys.addaudithook", "sys.setrecursionlimit", "traceback.walk_stack", "sys.exc_info")
_FRAME_ATTRS = frozenset({"f_back", "f_globals", "f_locals", "f_builtins", "f_code", "tb_frame", "gi_frame",
                          "cr_frame", "ag_frame", "__globals__", "__builtins__", "__subclasses__", "__closure__",
                          "__code__", "f_trace"})


@register(R.INTROSPECTION)
def _introspection(src: SourceInfo) -> Iterator[Hit]:
    for node in ast.walk(src.tree):
        for name in imported_modules(node):
            if under(name, ("inspect", "kernelrl", "__main__", "gc.get_objects", "gc.get_referrers",
                            "gc.get_referents")):
                yield Hit(line_of(node), f"imports {name}: reaches into the interpreter or the harness")
        if isinstance(node, ast.Attribute) and node.attr in _FRAME_ATTRS:
            yield Hit(line_of(node), f"accesses .{node.attr}: frames, globals or code objects of other code")
        elif isinstance(node, ast.Name) and node.id == "__builtins__":
            yield Hit(line_of(node), "accesses __builtins__")
        elif isinstance(node, ast.Call) and src.qualname(node.func) == "builtins.getattr" and len(node.args) >= 2:
            base = src.qualname(node.args[0])
            if base and "()" not in base and base.split(".")[0] in PATCH_ROOTS and const_str(node.args[1]) is None:
                yield Hit(line_of(node), f"getattr({base}, <computed name>) hides which attribute it reaches")
    for ref, q in src.refs():
        if under(q, ("sys.modules",)):
            yield Hit(line_of(ref), "accesses sys.modules, the interpreter's module table")
        elif under(q, ("gc",)) and q != "gc.collect" and not q.startswith(("gc.disable", "gc.freeze",
                                                                           "gc.set_threshold")):
            yield Hit(line_of(ref), f"uses {q}: the garbage collector can reach any object, including the judge's")
        elif under(q, ("kernelrl", "__main__")):
            yield Hit(line_of(ref), f"uses {q}: the harness's own modules")
    for call, q in src.calls():
        if under(q, _INTROSPECTION_CALLS):
            yield Hit(line_of(call), f"{pretty(q)}() inspects other code's frames or globals")
