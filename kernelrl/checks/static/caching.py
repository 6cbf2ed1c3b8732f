"""Answers kept across calls: output caches and replay, and reseeded random generators.

Rules (both warn: heuristics, not proofs):
- `output_caching`: dict/list/set caches (containers created empty) looked up with keys built
  from `id()`, `hash()`, `.data_ptr`, `.shape`, `.size`, `.stride`, `._version`, storages
  (following `key = ...` up to twice); `functools.lru_cache`/`cache`; reads of `._version`;
  memoised outputs (`if self.out is None: self.out = ...; return self.out` outside `__init__`);
  `global` in `forward`; and state that outlives a call outside the module: mutable default
  arguments, attributes stored on module-level functions, `nonlocal` closures, context variables.
  Caches filled in `__init__` (weights prepared once) are not flagged.
- `rng_seeding`: `torch.manual_seed`, `np.random.seed`, `random.seed`, restoring RNG states and
  `.manual_seed()` on generators (e.g. to reproduce the judge's inputs).

Does not catch: caches keyed on values (the contents compared or hashed), state kept in objects
the tree cannot tell are containers (a class instance, a mutable object a closure holds). The
judge feeds fresh, jittered inputs to every timed call and spot-checks outputs against the
reference for that call's input (`output_cached_across_calls`), which refuses a replay however it
is hidden.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from kernelrl.checks import rules as R
from kernelrl.checks.static.registry import Hit, register
from kernelrl.checks.static.source import SourceInfo
from kernelrl.checks.static.syntax import container_key, line_of, pretty, store_targets, under

_KEY_ATTRS = frozenset({"data_ptr", "shape", "size", "_version", "stride", "untyped_storage", "storage",
                        "_cdata", "storage_offset"})
_EMPTY_CONTAINERS = ("builtins.dict", "builtins.list", "collections.OrderedDict", "collections.defaultdict",
                     "weakref.WeakKeyDictionary", "weakref.WeakValueDictionary", "builtins.set")


def _is_empty_container(src: SourceInfo, value: ast.AST) -> bool:
    if isinstance(value, ast.Dict) and not value.keys:
        return True
    if isinstance(value, ast.List) and not value.elts:
        return True
    if isinstance(value, ast.Call) and not value.args:
        return src.qualname(value.func) in _EMPTY_CONTAINERS
    return False


def _identity_key(src: SourceInfo, node: ast.AST, depth: int = 0) -> str | None:
    """What identity-like property a cache key is built from (following `key = ...` once or twice)."""
    for n in ast.walk(node):
        if isinstance(n, ast.Attribute) and n.attr in _KEY_ATTRS:
            return f".{n.attr}"
        if isinstance(n, ast.Call) and src.qualname(n.func) in ("builtins.id", "builtins.hash"):
            return f"{pretty(src.qualname(n.func) or '')}()"
        if isinstance(n, ast.Name) and depth < 2:
            for value in src.assigned.get(n.id, []):
                what = _identity_key(src, value, depth + 1)
                if what:
                    return what
    return None


@register(R.OUTPUT_CACHING)
def _output_caching(src: SourceInfo) -> Iterator[Hit]:
    containers: set[str] = set()
    for node in ast.walk(src.tree):
        if isinstance(node, ast.Assign) and _is_empty_container(src, node.value):
            for t in node.targets:
                k = container_key(t)
                if k:
                    containers.add(k)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in node.decorator_list:
                q = src.qualname(d.func if isinstance(d, ast.Call) else d)
                if q in ("functools.lru_cache", "functools.cache"):
                    yield Hit(line_of(d), f"@{q} on {node.name} memoises results across calls")
        if isinstance(node, ast.Attribute) and node.attr == "_version":
            yield Hit(line_of(node), "reads a tensor's _version counter, which only caches need")
    for node in ast.walk(src.tree):
        key_expr = None
        if isinstance(node, ast.Subscript) and container_key(node.value) in containers:
            key_expr = node.slice
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) \
                and any(container_key(c) in containers for c in node.comparators):
            key_expr = node.left
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("get", "setdefault", "__getitem__", "__contains__") \
                and container_key(node.func.value) in containers and node.args:
            key_expr = node.args[0]
        if key_expr is not None:
            what = _identity_key(src, key_expr)
            if what:
                yield Hit(line_of(node), f"cache keyed on {what}: results reused across calls")
    yield from _memoised_returns(src)
    yield from _hidden_state(src)


def _hidden_state(src: SourceInfo) -> Iterator[Hit]:
    """State that outlives a call without being an attribute of the module: mutable default
    arguments, attributes stored on functions, `nonlocal` closures, context variables."""
    functions = {n.name for n in src.tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for node in ast.walk(src.tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in node.args.defaults + [d for d in node.args.kw_defaults if d is not None]:
                if _is_empty_container(src, d) or isinstance(d, (ast.Dict, ast.List, ast.Set)):
                    yield Hit(line_of(d), f"{node.name} keeps state across calls in a mutable default argument")
        elif isinstance(node, ast.Nonlocal):
            yield Hit(line_of(node), f"a closure keeps state across calls (nonlocal {', '.join(node.names)})")
        elif isinstance(node, ast.Call) and under(src.qualname(node.func) or "", ("contextvars.ContextVar",)):
            yield Hit(line_of(node), "a context variable keeps state across calls")
        for t in store_targets(node):
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in functions:
                yield Hit(line_of(node), f"stores {t.attr} on the function {t.value.id}: state kept across calls")


def _memoised_returns(src: SourceInfo) -> Iterator[Hit]:
    """`if self.out is None: self.out = ...; return self.out` and similar memoised outputs."""
    for fn in ast.walk(src.tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or fn.name == "__init__":
            continue
        conditional: set[str] = set()
        for node in ast.walk(fn):
            if isinstance(node, ast.If):
                tested = {container_key(n) for n in ast.walk(node.test)} - {None}
                for stmt in node.body:
                    for t in store_targets(stmt):
                        k = container_key(t)
                        if k and k.startswith("self.") and k in tested:
                            conditional.add(k)
        for node in ast.walk(fn):
            if isinstance(node, ast.Return) and node.value is not None:
                k = container_key(node.value)
                if k in conditional:
                    yield Hit(line_of(node), f"{fn.name} returns {k}, which it only computes when unset: a "
                                             "memoised output")
        for node in ast.walk(fn):
            if isinstance(node, ast.Global) and fn.name == "forward":
                yield Hit(line_of(node), f"forward rebinds module-level state ({', '.join(node.names)}) between calls")


@register(R.RNG_SEEDING)
def _rng_seeding(src: SourceInfo) -> Iterator[Hit]:
    fns = ("torch.manual_seed", "torch.seed", "torch.random.manual_seed", "torch.random.seed",
           "torch.cuda.manual_seed", "torch.cuda.manual_seed_all", "torch.set_rng_state", "torch.cuda.set_rng_state",
           "torch.random.set_rng_state", "numpy.random.seed", "numpy.random.set_state", "random.seed",
           "random.setstate")
    for call, q in src.calls():
        if under(q, fns):
            yield Hit(line_of(call), f"{q}() seeds or restores a random generator")
    for node in ast.walk(src.tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "manual_seed" \
                and src.qualname(node.func) is None:
            yield Hit(line_of(node), ".manual_seed() seeds a random generator")
