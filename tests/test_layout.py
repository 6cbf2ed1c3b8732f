"""The package's shape: no import cycle between modules nor between packages, modules of a readable size, a README in every folder, a
command line whose help and task list start without the runtime (torch, the trainer, the server)."""

from __future__ import annotations

import ast
import itertools
import json
import subprocess
import sys
from pathlib import Path

import kernelrl

ROOT = Path(kernelrl.__file__).parent
# Data, not modules: task files, example candidates and templates are read, never imported.
_DATA = ("tasks/builtin", "examples")
MAX_LINES = 650


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(_DATA):
            continue
        name = "kernelrl." + rel.removesuffix(".py").replace("/", ".").removesuffix(".__init__")
        out[name.removesuffix(".__init__")] = path
    return out


def _imports(path: Path, name: str, modules: set[str], tree: ast.AST | None = None) -> set[str]:
    """Every kernelrl module a module imports anywhere: at import time, inside functions, and under
    TYPE_CHECKING (or those under `tree` alone, a part of the module). A cycle hidden by an import
    inside a function is still a cycle of the design."""
    tree = ast.parse(path.read_text()) if tree is None else tree
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative: from the package, up level - 1 folders
                base = package.split(".")
                module = ".".join(base[:len(base) - (node.level - 1)] + ([module] if module else []))
            found.add(module)
            found.update(f"{module}.{a.name}" for a in node.names)
    return {m for m in found if m in modules}


def test_no_import_cycle():
    modules = _modules()
    graph = {name: _imports(path, name, set(modules)) - {name} for name, path in modules.items()}
    # A package importing its own submodules (re-exports) is how packages work, not a cycle.
    for name, path in modules.items():
        if path.name == "__init__.py":
            graph[name] = {m for m in graph[name] if not m.startswith(name + ".")}
    # an import of a submodule imports its package first
    for name in list(graph):
        parts = name.split(".")
        for i in range(2, len(parts)):
            parent = ".".join(parts[:i])
            if parent in graph and parent != name:
                graph[name].add(parent)
    cycles = _cycles(graph)
    assert not cycles, "import cycle: " + " -> ".join(cycles[0])


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The cycle each back edge of a depth-first walk closes (first node repeated at the end), in
    the walk's order."""
    state: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def dfs(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                dfs(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            dfs(node)
    return found


def _package_of(module: str) -> str:
    """The layer a module belongs to: its subpackage (`kernelrl.checks` for `kernelrl.checks.static.scan`),
    or itself for a module at the top (`kernelrl.reward`)."""
    return ".".join(module.split(".")[:2])


def _package_edges(modules: dict[str, Path]) -> dict[tuple[str, str], set[tuple[str, str]]]:
    """(package, package it imports) -> the (module, imported module) pairs behind that edge, from every
    import: at import time, inside functions, under TYPE_CHECKING."""
    edges: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for name, path in modules.items():
        if name == "kernelrl":
            continue
        for target in _imports(path, name, set(modules)):
            a, b = _package_of(name), _package_of(target)
            if target != "kernelrl" and a != b:
                edges.setdefault((a, b), set()).add((name, target))
    return edges


def _package_cycles(edges: dict[tuple[str, str], set[tuple[str, str]]], shown: int = 6) -> list[str]:
    """One message per back edge of a depth-first walk of the package graph: the cycle it closes and, for
    every edge of that cycle, the imports behind it (so the message says which imports to move)."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())

    def behind(a: str, b: str) -> str:
        pairs = sorted(edges[(a, b)])
        text = ", ".join(f"{m} imports {t}" for m, t in pairs[:shown])
        return text + (f", and {len(pairs) - shown} more" if len(pairs) > shown else "")

    found = []
    for cycle in _cycles(graph):
        lines = [f"package import cycle {' -> '.join(cycle)} (back edge {cycle[-2]} -> {cycle[-1]}):"]
        lines += [f"  {a} -> {b}: {behind(a, b)}" for a, b in itertools.pairwise(cycle)]
        found.append("\n".join(lines))
    return found


def test_no_package_import_cycle():
    """Packages layer one way (tasks, checks, judge, then what drives the judge: audit, search, train, serve,
    report, cli): a package that imports another is never imported by it, not even from inside a function."""
    cycles = _package_cycles(_package_edges(_modules()))
    assert not cycles, "\n".join(cycles)


# The packages and top-level modules by floor, lowest first; README.md's "What is here" draws them.
# The rule every arrow follows: a package imports only what stands on a lower floor. A new package
# or top-level module is given its floor here, and a new import that runs sideways or up fails.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("jsontypes", "plain", "syntax", "sqlite", "endpoint"),  # formats and plumbing: no kernelrl import
    ("result", "config", "candidate", "tasks"),  # what is judged, and the verdict's records
    ("checks", "reward"),  # static rules and defences; verdict -> scalar
    ("judge",),  # the sandboxed evaluator: builds, checks, times
    ("store", "episodes", "audit"),  # the run database; what a model is shown, turn by turn
    ("proposers", "report"),  # where programs come from; what a run achieved
    ("web",),  # the run pages and how every server listens
    ("backends", "search"),  # where verdicts come from (judge factory, wire format, client); the search
    ("run_parts", "serve"),  # a run's parts; the reward server
    ("optimize", "train"),  # the runs: search, collect, bench, the recipe's stages
    ("cli",),
    ("__main__",),
)


def test_packages_import_only_lower_floors():
    floor = {f"kernelrl.{name}": i for i, names in enumerate(FLOORS) for name in names}
    edges = _package_edges(_modules())
    unplaced = sorted({p for edge in edges for p in edge if p not in floor})
    assert not unplaced, f"give these a floor in FLOORS: {unplaced}"
    wrong = [f"{a} (floor {floor[a]}) imports {b} (floor {floor[b]}): " + ", ".join(sorted(f"{m} -> {t}" for m, t in pairs)[:4])
             for (a, b), pairs in sorted(edges.items()) if floor[b] >= floor[a]]
    assert not wrong, "\n".join(wrong)


def test_package_cycle_message_names_the_imports_behind_each_edge():
    edges = {("kernelrl.checks", "kernelrl.judge"): {("kernelrl.checks.audit", "kernelrl.judge.evaluator")},
             ("kernelrl.judge", "kernelrl.checks"): {("kernelrl.judge.group", "kernelrl.checks.static"),
                                                     ("kernelrl.judge.trial", "kernelrl.checks.dynamic")},
             ("kernelrl.judge", "kernelrl.tasks"): {("kernelrl.judge.isolation.pool", "kernelrl.tasks.task")}}
    assert _package_cycles(edges) == [
        "package import cycle kernelrl.checks -> kernelrl.judge -> kernelrl.checks "
        "(back edge kernelrl.judge -> kernelrl.checks):\n"
        "  kernelrl.checks -> kernelrl.judge: kernelrl.checks.audit imports kernelrl.judge.evaluator\n"
        "  kernelrl.judge -> kernelrl.checks: kernelrl.judge.group imports kernelrl.checks.static, "
        "kernelrl.judge.trial imports kernelrl.checks.dynamic"]
    del edges[("kernelrl.checks", "kernelrl.judge")]
    assert _package_cycles(edges) == []


def test_no_module_is_too_long_to_read():
    long = {p.relative_to(ROOT).as_posix(): n for p in _modules().values()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, long


def test_every_package_folder_has_a_readme():
    folders = {p.parent for p in _modules().values() if p.name == "__init__.py" and p.parent != ROOT}
    missing = sorted(f.relative_to(ROOT).as_posix() for f in folders if not (f / "README.md").is_file())
    assert not missing, missing


# What a command imports when it does its work, never to answer `--help` or list tasks: each costs
# seconds at start-up (torch alone ~2 s, more on a loaded machine).
RUNTIME = ("torch", "numpy", "triton", "transformers", "trl", "datasets", "accelerate", "peft", "vllm", "ray",
           "fastapi", "uvicorn", "starlette", "httpx", "openai", "matplotlib")

# Runs in a fresh interpreter: `python -m kernelrl ARGS` for `--help`, `tasks` and `CMD --help` of
# every command and training stage (read from the parser, so a new command is covered), and says
# which runtime modules each one imported first.
_STARTS = """
import json, runpy, sys

runtime = set(json.loads(sys.argv[1]))


def start(argv):
    before = {m.split(".")[0] for m in sys.modules}
    sys.argv = ["kernelrl", *argv]
    try:
        runpy.run_module("kernelrl", run_name="__main__", alter_sys=True)
    except SystemExit as e:
        assert e.code in (0, None), (argv, e.code)
    return sorted(({m.split(".")[0] for m in sys.modules} - before) & runtime)


found = {"--help": start(["--help"])}  # first: it imports the whole command line
from kernelrl.cli import build_parser

sub = next(a for a in build_parser()._actions if a.dest == "command")
train = next(a for a in sub.choices["train"]._actions if a.dest == "stage")
for argv in [["tasks"]] + [[c, "--help"] for c in sub.choices] + [["train", s, "--help"] for s in train.choices]:
    found[" ".join(argv)] = start(argv)
print(json.dumps(found), file=sys.stderr)
"""


def test_help_and_tasks_import_no_runtime():
    out = subprocess.run([sys.executable, "-c", _STARTS, json.dumps(RUNTIME)], cwd=ROOT.parent, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stderr.strip().splitlines()[-1])
    assert "train grpo --help" in found and "optimize --help" in found and "tasks" in found, found
    assert not {argv: mods for argv, mods in found.items() if mods}, found


# The judge's rooms, one folder each, in the order they may import one another: a room imports the
# rooms before it, never one after it. The worker side comes first and imports nothing of kernelrl
# outside its folder: a worker process imports that folder alone. Every worker start pays for each
# module it imports: importing the timer, and through it the settings, the static checker and the
# LLM review (52 kernelrl modules in all, 18 without), took 0.11-0.15 s of a ~2 s start
# (`python -X importtime`).
WORKER_SIDE = "kernelrl.judge.harness"
ROOMS = (WORKER_SIDE, "kernelrl.judge.isolation", "kernelrl.judge.timing")
# What a reference worker runs, from inside the functions that load its task (never at import time).
TASK_LOADER = "kernelrl.tasks"
# The settings the timing room reads (declared with the other settings, so reading them imports no torch).
TIMING_READS = ("kernelrl.judge.eval_config",)


def _within(module: str, folder: str) -> bool:
    return module == folder or module.startswith(folder + ".")


def _imports_by_place(path: Path, name: str, modules: set[str]) -> tuple[set[str], set[str]]:
    """(the kernelrl modules a module imports when it is imported, those it imports inside functions)."""
    tree = ast.parse(path.read_text())
    nested: set[str] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            nested |= _imports(path, name, modules, fn)
    return _imports(path, name, modules) - nested, nested


def _worker_side_breaks(modules: dict[str, Path]) -> dict[str, list[str]]:
    out = {}
    for name, path in modules.items():
        if not _within(name, WORKER_SIDE):
            continue
        at_import, nested = _imports_by_place(path, name, set(modules))
        outside = sorted(m for m in at_import | nested if m not in ("kernelrl", "kernelrl.judge")
                         and not _within(m, WORKER_SIDE) and not (m in nested and _within(m, TASK_LOADER)))
        if outside:
            out[name] = outside
    return out


def test_the_worker_side_imports_nothing_outside_its_folder():
    """Enforced by folder: a module added to the worker side is checked, and one that imports the judge's
    side is refused, whatever its name."""
    modules = _modules()
    assert f"{WORKER_SIDE}.worker" in modules
    assert not _worker_side_breaks(modules), _worker_side_breaks(modules)


def test_a_room_imports_no_room_after_it():
    """harness < isolation < timing < the judge's top (orchestration): the reverse edges are what
    would make a room need the rooms that drive it."""
    modules = _modules()
    rank = {room: i for i, room in enumerate(ROOMS)}

    def room_of(module: str) -> int | None:
        found = [rank[r] for r in ROOMS if _within(module, r)]
        if found:
            return found[0]
        return len(ROOMS) if _within(module, "kernelrl.judge") and module != "kernelrl.judge" else None

    wrong = []
    for name, path in modules.items():
        mine = room_of(name)
        if mine is None or mine == len(ROOMS):
            continue
        for target in _imports(path, name, set(modules)):
            theirs = room_of(target)
            if theirs is not None and theirs > mine and not (ROOMS[mine].endswith(".timing") and target in TIMING_READS):
                wrong.append(f"{name} imports {target}")
    assert not wrong, wrong


def test_a_worker_imports_only_the_worker_side():
    script = f"import sys, {WORKER_SIDE}.worker; print(' '.join(m for m in sys.modules if m.startswith('kernelrl.')))"
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT.parent, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    imported = out.stdout.split()
    assert f"{WORKER_SIDE}.worker" in imported
    assert not [m for m in imported if m != "kernelrl.judge" and not _within(m, WORKER_SIDE)], imported


def test_every_server_listens_through_one_binder():
    """The run page, `kernelrl watch` and the reward server listen on sockets from
    `kernelrl.web.app.bind`, the function the preflight port checks call: a check that a
    port is free tests the socket options the server will use."""
    listening = sorted(str(p.relative_to(ROOT)) for p in _modules().values()
                       if any(isinstance(n, ast.Attribute) and n.attr == "listen" for n in ast.walk(ast.parse(p.read_text()))))
    assert listening == ["web/app.py"], listening
