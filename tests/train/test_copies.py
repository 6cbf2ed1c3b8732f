"""Copies by behaviour: a shown version up to edits that change nothing it computes, not faster
beyond noise, is a copy; an honest improvement is not.

The property test draws random combinations of behaviour-preserving edits (each class the module
docstring names, and two it does not erase: a temporary variable and a no-op `.contiguous()`), applies
them to realistic programs, checks the PyTorch ones still compute the same output, and asks the
copy rule about the result."""

from __future__ import annotations

import ast
import random
import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernelrl.result import EvalResult, Status
from kernelrl.train.canonical import canonical_tokens
from kernelrl.train.copies import Canonical, Comparer, CopyRule, ShownVersion, edits, faster_beyond_noise

TANH = '''import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """tanh(x @ W), four times."""

    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, n) / n ** 0.5)

    def forward(self, x):
        y = x
        for _ in range(4):
            y = torch.tanh(x @ self.weight)
        return y
'''

LINEAR = '''import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, features, hidden):
        super().__init__()
        self.linear = nn.Linear(features, hidden)
        self.scale = 2.0

    def activate(self, x):
        return F.relu(x) * self.scale

    def forward(self, x):
        y = self.linear(x)
        y = self.activate(y)
        z = torch.sigmoid(y @ y.transpose(0, 1))
        return z.sum(dim=1, keepdim=True) + y.mean()
'''

CUDA = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = """
#include <torch/extension.h>
// one thread per element
__global__ void scale_kernel(const float* x, float* out, float s, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = x[i] * s;  /* scaled */
    }
}

torch::Tensor scale(torch::Tensor x, double s) {
    auto out = torch::empty_like(x);
    int n = x.numel();
    scale_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), out.data_ptr<float>(), s, n);
    return out;
}
"""
cpp = "torch::Tensor scale(torch::Tensor x, double s);"
module = load_inline(name="scale", cpp_sources=cpp, cuda_sources=source, functions=["scale"])


class ModelNew(nn.Module):
    def __init__(self, s):
        super().__init__()
        self.s = s

    def forward(self, x):
        return module.scale(x.contiguous(), self.s)
'''

PROGRAMS = {"tanh": (TANH, (8,), (4, 8)), "linear": (LINEAR, (6, 5), (3, 6)), "cuda": (CUDA, None, None)}


# -- behaviour-preserving edits, on the syntax tree -------------------------------------------------


def _functions(tree):
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]


def _bodies(tree):
    return [n.body for n in ast.walk(tree) if isinstance(getattr(n, "body", None), list)
            and n.body and isinstance(n.body[0], ast.stmt)]


def _stmt(text: str) -> list[ast.stmt]:
    return ast.parse(text).body


def add_pass(tree, rng):
    body = rng.choice(_bodies(tree))
    body.insert(rng.randrange(len(body) + 1), ast.Pass())


def add_bare_constant(tree, rng):
    body = rng.choice(_bodies(tree))
    body.insert(rng.randrange(len(body) + 1), ast.Expr(value=ast.Constant(value=rng.choice([0, None, "note", 1.5]))))


def add_docstring(tree, rng):
    fn = rng.choice(_functions(tree))
    fn.body.insert(0, ast.Expr(value=ast.Constant(value="What this does, in words.")))


def add_dead_branch(tree, rng):
    body = rng.choice(_bodies(tree))
    body.insert(rng.randrange(len(body) + 1), _stmt("if False:\n    print('never')\n    x = 1 / 0")[0])


def add_unused_assignment(tree, rng):
    fn = rng.choice(_functions(tree))
    fn.body.insert(rng.randrange(len(fn.body)), _stmt(f"unused_{rng.randrange(100)} = {rng.randrange(9)} * 3")[0])


def add_unused_helper(tree, rng):
    tree.body.insert(rng.randrange(len(tree.body) + 1),
                     _stmt("def helper_never_called(a, b):\n    c = a * b\n    for i in range(10):\n        c = c + i\n"
                           "    return c")[0])


def add_unused_import(tree, rng):
    tree.body.insert(0, _stmt(rng.choice(["import os", "import math as m", "from collections import deque"]))[0])


def add_unreachable(tree, rng):
    fn = next(f for f in _functions(tree) if f.name == "forward")
    fn.body.append(_stmt("y_never = 0")[0])


def swap_imports(tree, rng):
    imports = [i for i, s in enumerate(tree.body) if isinstance(s, (ast.Import, ast.ImportFrom))]
    if len(imports) >= 2:
        a, b = rng.sample(imports, 2)
        tree.body[a], tree.body[b] = tree.body[b], tree.body[a]


def swap_definitions(tree, rng):
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "ModelNew")
    defs = [i for i, s in enumerate(cls.body) if isinstance(s, ast.FunctionDef)]
    a, b = rng.sample(defs, 2)
    cls.body[a], cls.body[b] = cls.body[b], cls.body[a]


def rename_local(tree, rng):
    """A variable or argument renamed everywhere in its function."""
    fn = rng.choice([f for f in _functions(tree) if len(f.args.args) > 1 or any(
        isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) for n in ast.walk(f))])
    names = {a.arg for a in fn.args.args[1:]} | {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)
                                                   and isinstance(n.ctx, ast.Store)}
    old = rng.choice(sorted(names))
    new = f"{old}_renamed{rng.randrange(100)}"
    for n in ast.walk(fn):
        if isinstance(n, ast.Name) and n.id == old:
            n.id = new
        elif isinstance(n, ast.arg) and n.arg == old:
            n.arg = new


def rename_attribute(tree, rng):
    """An attribute the program sets on `self`, renamed everywhere."""
    attrs = sorted({n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
                    and isinstance(n.value, ast.Name) and n.value.id == "self"})
    old = rng.choice(attrs)
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and n.attr == old and isinstance(n.value, ast.Name) and n.value.id == "self":
            n.attr = "p_" + old


def rename_self(tree, rng):
    for fn in _functions(tree):
        if fn.args.args and fn.args.args[0].arg == "self":
            fn.args.args[0].arg = "me"
            for n in ast.walk(fn):
                if isinstance(n, ast.Name) and n.id == "self":
                    n.id = "me"


def realias_torch_nn(tree, rng):
    """`import torch.nn as nn` written `from torch import nn as tnn`, its uses renamed."""
    for i, s in enumerate(tree.body):
        if isinstance(s, ast.Import) and s.names[0].name == "torch.nn" and s.names[0].asname == "nn":
            tree.body[i] = _stmt("from torch import nn as tnn")[0]
            for n in ast.walk(tree):
                if isinstance(n, ast.Name) and n.id == "nn":
                    n.id = "tnn"


class _Respell(ast.NodeTransformer):
    def __init__(self, rng):
        self.rng = rng
        self.first_arg = "self"

    def visit_FunctionDef(self, node):
        if node.args.args:
            self.first_arg = node.args.args[0].arg
        self.generic_visit(node)
        return node

    def visit_BinOp(self, node):
        self.generic_visit(node)
        if isinstance(node.op, ast.MatMult) and self.rng.random() < 0.7:
            fn = self.rng.choice(["torch.matmul", "torch.mm"])
            return ast.Call(func=ast.parse(fn, mode="eval").body, args=[node.left, node.right], keywords=[])
        return node

    def visit_Call(self, node):
        self.generic_visit(node)
        f = node.func
        if isinstance(f, ast.Name) and f.id == "range" and len(node.args) == 1 and self.rng.random() < 0.8:
            node.args = [ast.Constant(value=0), node.args[0]] + ([ast.Constant(value=1)] if self.rng.random() < 0.5
                                                                  else [])
        elif (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "torch"
              and f.attr in ("tanh", "sigmoid") and len(node.args) == 1 and self.rng.random() < 0.7):
            return ast.Call(func=ast.Attribute(value=node.args[0], attr=f.attr, ctx=ast.Load()), args=[], keywords=[])
        elif (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "F"
              and f.attr == "relu" and self.rng.random() < 0.7):
            f.value.id = "torch"
        elif isinstance(f, ast.Name) and f.id == "super" and not node.args and self.rng.random() < 0.7:
            node.args = [ast.Name(id="ModelNew", ctx=ast.Load()), ast.Name(id=self.first_arg, ctx=ast.Load())]
        elif len(node.keywords) > 1:
            self.rng.shuffle(node.keywords)
        return node

    def visit_Assign(self, node):
        self.generic_visit(node)
        t, v = node.targets[0], node.value
        if (len(node.targets) == 1 and isinstance(t, ast.Name) and isinstance(v, ast.BinOp)
                and isinstance(v.left, ast.Name) and v.left.id == t.id and self.rng.random() < 0.7):
            return ast.AugAssign(target=t, op=v.op, value=v.right)
        return node


def respell(tree, rng):
    return _Respell(rng).visit(tree)


# Edits the canonical form does not erase: each costs a few token edits of the allowance.
def temporary_variable(tree, rng):
    fn = next(f for f in _functions(tree) if f.name == "forward")
    ret = fn.body[-1]
    if isinstance(ret, ast.Return) and ret.value is not None:
        fn.body[-1:] = [ast.Assign(targets=[ast.Name(id="result_tmp", ctx=ast.Store())], value=ret.value, lineno=0),
                        ast.Return(value=ast.Name(id="result_tmp", ctx=ast.Load()))]


def contiguous(tree, rng):
    """`.contiguous()` on a tensor that already is: the same tensor back."""
    fn = next(f for f in _functions(tree) if f.name == "forward")
    for s in fn.body:
        if isinstance(s, ast.Assign) and isinstance(s.value, ast.Call):
            s.value = ast.Call(func=ast.Attribute(value=s.value, attr="contiguous", ctx=ast.Load()), args=[],
                               keywords=[])
            return
    ret = fn.body[-1]
    if isinstance(ret, ast.Return) and ret.value is not None:
        ret.value = ast.Call(func=ast.Attribute(value=ret.value, attr="contiguous", ctx=ast.Load()), args=[],
                             keywords=[])


def commute(tree, rng):
    nodes = [n for n in ast.walk(tree) if isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Mult, ast.Add))]
    n = rng.choice(nodes)
    n.left, n.right = n.right, n.left


ERASED = [add_pass, add_bare_constant, add_docstring, add_dead_branch, add_unused_assignment, add_unused_helper,
          add_unused_import, add_unreachable, swap_imports, swap_definitions, rename_local, rename_attribute,
          rename_self, realias_torch_nn, respell, commute]
RESIDUAL = [temporary_variable, contiguous]


def relay_text(source: str, rng: random.Random) -> str:
    """Layout and comments: blank lines and comment lines between statements, indented alike."""
    lines = source.splitlines()
    tree = ast.parse(source)
    starts = sorted({s.lineno for s in ast.walk(tree) if isinstance(s, ast.stmt)})
    for line in sorted(rng.sample(starts, min(len(starts), rng.randrange(1, 5))), reverse=True):
        indent = lines[line - 1][:len(lines[line - 1]) - len(lines[line - 1].lstrip())]
        lines.insert(line - 1, indent + rng.choice(["# a comment", "# TODO: faster", ""]))
    return "\n".join(lines) + "\n"


def edited(source: str, seed: int, n_erased: int, n_residual: int) -> str:
    rng = random.Random(seed)
    tree = ast.parse(source)
    steps = [rng.choice(ERASED) for _ in range(n_erased)] + [rng.choice(RESIDUAL) for _ in range(n_residual)]
    rng.shuffle(steps)
    for step in steps:
        try:
            out = step(tree, rng)
        except (IndexError, ValueError, StopIteration):
            continue  # the edit has nothing to act on in this program (no second method, no `+`)
        tree = out if isinstance(out, ast.Module) else tree
    ast.fix_missing_locations(tree)
    return relay_text(ast.unparse(tree), rng)


def output_of(source: str, init: tuple, shape: tuple) -> torch.Tensor:
    scope: dict = {}
    exec(compile(source, "<candidate>", "exec"), scope)  # noqa: S102 - the test's own programs
    torch.manual_seed(0)
    model = scope["ModelNew"](*init)
    torch.manual_seed(1)
    return model(torch.randn(*shape))


def measured(speedup: float, half: float = 0.05) -> EvalResult:
    return EvalResult(task="t", status=Status.CORRECT, speedup=speedup,
                      speedup_ci=(speedup * (1 - half), speedup * (1 + half)), noise_band=(0.97, 1.03))


# -- the property ------------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(PROGRAMS)), seed=st.integers(0, 2 ** 31), n_erased=st.integers(1, 8),
       n_residual=st.integers(0, 2))
def test_any_combination_of_edits_that_change_nothing_is_a_copy(name, seed, n_erased, n_residual):
    source, init, shape = PROGRAMS[name]
    copy = edited(source, seed, n_erased, n_residual)
    if init is not None:  # the edits change nothing the program computes
        assert torch.allclose(output_of(source, init, shape), output_of(copy, init, shape), rtol=1e-5, atol=1e-6)
    shown = ShownVersion(id=7, source=source, result=measured(2.0))
    finding = Comparer([shown]).copy_of(copy, measured(2.02))
    assert finding is not None and finding.version == 7, (copy, finding)
    assert finding.edits <= finding.allowed


def test_a_verbatim_copy_is_zero_edits_from_its_version():
    for source, _, _ in PROGRAMS.values():
        assert edits(Canonical.of(source), Canonical.of(source), 0) == 0


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_an_honest_improvement_faster_beyond_noise_is_not_a_copy(name):
    """A real change to the shown version (a constant, an operation) measured faster than it beyond
    noise is paid as itself; the same change within noise of it is a copy."""
    source = PROGRAMS[name][0]
    better = {"tanh": source.replace("range(4)", "range(1)"), "linear": source.replace("+ y.mean()", ""),
              "cuda": source.replace("(n + 255) / 256, 256", "(n + 1023) / 1024, 1024")}[name]
    assert better != source
    shown = [ShownVersion(id=3, source=source, result=measured(2.0))]
    assert Comparer(shown).copy_of(better, measured(3.0)) is None
    assert Comparer(shown).copy_of(better, measured(2.05)) is not None  # not beyond noise: a copy
    slower = Comparer(shown).copy_of(better, measured(1.2))
    assert slower is not None and slower.version == 3  # a near-copy that is slower is a copy too


def test_a_different_program_is_not_a_copy_whatever_it_measured():
    """Programs that differ in what they compute by more than a few tokens are new programs."""
    loop_free = TANH.replace("        y = x\n        for _ in range(4):\n            y = torch.tanh(x @ self.weight)\n"
                             "        return y\n", "        return torch.tanh(x @ self.weight)\n")
    for a, b in [(TANH, LINEAR), (TANH, loop_free), (LINEAR, CUDA)]:
        shown = [ShownVersion(id=1, source=a, result=measured(2.0))]
        assert Comparer(shown).copy_of(b, measured(1.0)) is None, (a, b)


def test_faster_beyond_noise_needs_the_intervals_apart_by_more_than_the_aa_band():
    assert faster_beyond_noise(measured(3.0), measured(2.0))
    assert not faster_beyond_noise(measured(2.1), measured(2.0))  # intervals overlap
    close = EvalResult(task="t", status=Status.CORRECT, speedup=2.2, speedup_ci=(2.19, 2.21), noise_band=(0.9, 1.1))
    tight = EvalResult(task="t", status=Status.CORRECT, speedup=2.0, speedup_ci=(1.99, 2.01), noise_band=(0.9, 1.1))
    assert not faster_beyond_noise(close, tight)  # apart, but within what identical code measured apart
    assert not faster_beyond_noise(measured(3.0), None)  # nothing to compare with: never shown faster
    assert not faster_beyond_noise(measured(3.0), EvalResult(task="t", status=Status.INCORRECT))


def test_only_correct_timed_answers_are_copies():
    shown = [ShownVersion(id=1, source=TANH, result=measured(2.0))]
    assert Comparer(shown).copy_of(TANH, EvalResult(task="t", status=Status.INCORRECT)) is None
    assert Comparer(shown).copy_of(TANH, EvalResult(task="t", status=Status.CORRECT)) is None  # untimed
    assert Comparer(shown).copy_of(None, measured(2.0)) is None
    assert Comparer([]).copy_of(TANH, measured(2.0)) is None


def test_the_nearest_shown_version_is_named():
    slow = TANH.replace("range(4)", "range(32)")
    shown = [ShownVersion(id=1, source=slow, result=measured(0.5)), ShownVersion(id=2, source=TANH,
                                                                                result=measured(2.0))]
    finding = Comparer(shown).copy_of(TANH, measured(2.0))
    assert finding is not None and finding.version == 2 and finding.edits == 0
    assert "version 2" in finding.reason and "2x" in finding.reason


def test_a_c_source_with_its_variables_renamed_is_the_same_program():
    renamed = CUDA.replace("out[i]", "dst[i]").replace("float* out", "float* dst").replace("int i ", "int idx ")
    renamed = renamed.replace("(i < n)", "(idx < n)").replace("x[i]", "x[idx]").replace("dst[i]", "dst[idx]")
    assert canonical_tokens(renamed) == canonical_tokens(CUDA)


def test_a_program_that_does_not_parse_is_compared_by_its_words():
    assert canonical_tokens("def f(:\n  pass") == canonical_tokens("def f(:   pass")
    assert CopyRule().allowed(10) == 10 and CopyRule().allowed(1000) == 40


def test_hostile_text_is_made_canonical_and_compared_in_linear_time():
    """Unterminated comments, quotes and deep nesting at the source size limit (256 KiB), and two
    long programs a few edits apart."""
    for text in ('x = "' + "/*" * 131072 + '"', "s = '" + "\\'" * 131072, "x = " + "(" * 200000,
                 "'''" + "//" * 131072, "y = [" + "1, " * 80000 + "]"):
        started = time.monotonic()
        canonical_tokens(text)
        assert time.monotonic() - started < 3.0
    long = "x = 0\n" + "".join(f"x = x * {i % 7} + {i}\n" for i in range(8000))
    other = long.replace("x = x * 6 + 1000\n", "x = x * 5 + 1000\n")
    assert other != long
    a, b = Canonical.of(long), Canonical.of(other)
    started = time.monotonic()
    assert edits(a, b, CopyRule().allowed(len(a.tokens))) == 2
    assert time.monotonic() - started < 3.0
