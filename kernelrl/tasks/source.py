"""Task sources as syntax: the size constants a program declares, and the program with them set.

The sizes are module-level integer constants, integer elements >= 16 of module-level tuples and
lists (`input_shape = (32768,)`, keyed `input_shape[0]`) and integer literals that size layers
inside the program (`literal:512` for every 512 in VGG's `nn.Conv2d(256, 512, 3)` and its
neighbours). They are read from the syntax tree (no code runs) and substituted in it before a
module runs, so values derived from them follow.

Guarantees: nothing here executes task code. Does not guarantee that a program given
`literal:<v>` constants is the same program: one that copies the task's layers (a candidate)
matches the reference at that size only when compiled with the same constants (`compile_task`).
"""

from __future__ import annotations

import ast
import re
import types

from kernelrl import syntax


class TaskError(ValueError):
    """A task cannot be loaded or instantiated; the message says why, for a person."""


# Only constants at least this large are halved: small ones are usually structural
# (kernel sizes, head counts, strides). The exception is a constant that sizes only the data
# (the batch): it may halve down to 1, as halving it leaves the model unchanged.
_SHRINK_MIN_CONSTANT = 16


# Keys of constants beyond plain module-level integers: `input_shape[0]` is an element of a
# module-level tuple or list; `literal:512` is every integer literal 512 in the program's code.
_ELEMENT_KEY = re.compile(r"^([A-Za-z_]\w*)\[(\d+)\]$")


_LITERAL_KEY = re.compile(r"^literal:(\d+)$")


# Layers whose first two arguments and width keywords are sizes: literals there become knobs.
_LAYERS = frozenset({
    "Linear", "Bilinear", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d",
    "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d", "LayerNorm",
    "GroupNorm", "RMSNorm", "Embedding", "EmbeddingBag", "MultiheadAttention", "LSTM", "GRU", "RNN", "LSTMCell",
    "GRUCell", "RNNCell", "TransformerEncoderLayer", "TransformerDecoderLayer", "Transformer",
})


_WIDTH_KEYWORDS = frozenset({
    "in_features", "out_features", "in1_features", "in2_features", "in_channels", "out_channels", "num_features",
    "normalized_shape", "num_channels", "num_embeddings", "embedding_dim", "embed_dim", "input_size",
    "hidden_size", "d_model", "dim_feedforward",
})


def module_int_constants(source: str) -> dict[str, int]:
    """Module-level integer constants, read from the syntax tree (no code runs).

    Reads `a = 3`, `a: int = 3`, `a = b = 3`, `a, b = 3, 4` and literal arithmetic (`2 * 1024`).
    """
    out: dict[str, int] = {}
    for node in _parse(source).body:
        out.update(_constant_assignments(node))
    return out


def module_size_elements(source: str) -> dict[str, int]:
    """Integer elements >= 16 of module-level tuple and list literals, keyed `name[i]` (no code runs).

    `input_shape = (32768,)` gives {"input_shape[0]": 32768} and `layer_sizes = [400, 800]` two
    keys; `kernel_size = (3, 5)` and `bias_shape = (out_channels, 1, 1)` give none: small elements
    are structural (kernel sizes, strides, padding) and names are constants of their own.
    """
    out: dict[str, int] = {}
    for node in _parse(source).body:
        seq = _sequence_assignment(node)
        if seq is None:
            continue
        name, elts = seq
        for i, elt in enumerate(elts):
            value = _int_literal(elt)
            if value is not None and value >= _SHRINK_MIN_CONSTANT:
                out[f"{name}[{i}]"] = value
    return out


def _parse(source: str) -> ast.Module:
    try:
        return syntax.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise TaskError(f"task source does not parse: {type(e).__name__}: {e}") from e


def _constant_assignments(node: ast.stmt) -> dict[str, int]:
    """Names bound to integer literals by one module-level statement."""
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
        value = _int_literal(node.value)
        return {} if value is None else {node.target.id: value}
    if not isinstance(node, ast.Assign):
        return {}
    if len(node.targets) == 1 and isinstance(node.targets[0], ast.Tuple) and isinstance(node.value, ast.Tuple):
        names, values = node.targets[0].elts, node.value.elts
        ints = [_int_literal(v) for v in values]
        pairs = [(n.id, v) for n, v in zip(names, ints) if isinstance(n, ast.Name) and v is not None]
        return dict(pairs) if len(pairs) == len(names) == len(values) else {}
    value = _int_literal(node.value)
    targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
    if value is None or len(targets) != len(node.targets):
        return {}
    return dict.fromkeys(targets, value)


def _sequence_assignment(node: ast.stmt) -> tuple[str, list[ast.expr]] | None:
    """(name, elements) when one module-level statement binds one name to a tuple or list literal."""
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        target, value = node.target, node.value
    elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        target, value = node.targets[0], node.value
    else:
        return None
    if isinstance(value, (ast.Tuple, ast.List)):
        return target.id, value.elts
    return None


def _int_literal(node: ast.AST) -> int | None:
    # Accept plain literals and simple arithmetic of literals (e.g. 2 * 1024, 1 << 20)
    try:
        value = ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Add, ast.Sub, ast.LShift, ast.Pow,
                                                                ast.FloorDiv)):
            left, right = _int_literal(node.left), _int_literal(node.right)
            if left is None or right is None:
                return None
            try:
                return int(eval(compile(ast.Expression(node), "<const>", "eval"), {"__builtins__": {}}))
            except Exception:  # noqa: BLE001 - any failure means "not a constant"
                return None
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def _width_literals(source: str) -> dict[str, int]:
    """Integer literals >= 16 that size layers built inside the program's classes, keyed `literal:<v>`.

    `nn.Conv2d(64, 128, kernel_size=3)` gives literal:64 and literal:128: a layer's first two
    arguments and its width keywords count, arithmetic included (`nn.Linear(512 * 7 * 7, 4096)`
    gives 512 and 4096; 7 is below the threshold). A knob stands for every literal of that value in
    the code, so `nn.Conv2d(64, 128)` followed by `nn.Conv2d(128, 256)` stays consistent.
    """
    values: set[int] = set()
    for cls in (n for n in _parse(source).body if isinstance(n, ast.ClassDef)):
        for call in (n for n in ast.walk(cls) if isinstance(n, ast.Call)):
            func = call.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name not in _LAYERS:
                continue
            sized = list(call.args[:2]) + [k.value for k in call.keywords if k.arg in _WIDTH_KEYWORDS]
            for expr in sized:
                for lit in ast.walk(expr):
                    if isinstance(lit, ast.Constant) and type(lit.value) is int and lit.value >= _SHRINK_MIN_CONSTANT:
                        values.add(lit.value)
    return {f"literal:{v}": v for v in sorted(values)}


class _RewriteLiterals(ast.NodeTransformer):
    """Every integer literal of a mapped value takes the new value (bools are left alone)."""

    def __init__(self, mapping: dict[int, int]) -> None:
        self.mapping = mapping

    def visit_Constant(self, node: ast.Constant) -> ast.AST:  # noqa: N802 - ast API
        if type(node.value) is int and node.value in self.mapping:
            return ast.copy_location(ast.Constant(self.mapping[node.value]), node)
        return node


def _with_constants(source: str, constants: dict[str, int]) -> ast.Module:
    """The task's syntax tree with its constant assignments set to `constants`.

    Substituting before the module runs (rather than rebinding after) keeps derived values
    right: `bias_shape = (out_channels, 1, 1)` follows a shrunk `out_channels`. Keys `name[i]` set
    one element of a module-level tuple or list literal; `literal:<v>` keys set every integer
    literal `v` in the code outside those module-level assignments (which are knobs of their own).
    """
    tree = syntax.parse(source)
    elements: dict[str, dict[int, int]] = {}
    literals: dict[int, int] = {}
    for key, value in constants.items():
        if m := _ELEMENT_KEY.match(key):
            elements.setdefault(m.group(1), {})[int(m.group(2))] = value
        elif (m := _LITERAL_KEY.match(key)) and int(m.group(1)) != value:
            literals[int(m.group(1))] = value
    rewrite = _RewriteLiterals(literals) if literals else None
    body: list[ast.stmt] = []
    for node in tree.body:
        found = _constant_assignments(node)
        seq = _sequence_assignment(node)
        if found and any(name in constants for name in found):
            for name, value in found.items():
                assign = ast.Assign(targets=[ast.Name(name, ast.Store())], value=ast.Constant(constants.get(name, value)))
                body.append(ast.copy_location(assign, node))
        elif seq is not None:
            name, elts = seq
            for i, value in elements.get(name, {}).items():
                if i < len(elts) and _int_literal(elts[i]) is not None:
                    elts[i] = ast.copy_location(ast.Constant(value), elts[i])
            body.append(node)
        elif found or rewrite is None:
            body.append(node)
        else:
            body.append(rewrite.visit(node))
    tree.body = body
    return ast.fix_missing_locations(tree)


def sized_source(source: str, constants: dict[str, int]) -> str:
    """A program's source with the constants set (comments are not kept): what a candidate that
    copied the task's tuples or layer literals runs, so that it matches the sized reference."""
    return ast.unparse(_with_constants(source, constants))


def compile_task(source: str, constants: dict[str, int], filename: str) -> types.CodeType:
    """The task's code with its integer constants set: what every process that runs a task runs."""
    return compile(_with_constants(source, constants), filename, "exec")


# ---------------------------------------------------------------------------------------------
# Loading


def is_task_source(source: str) -> bool:
    """True when the source defines Model, get_inputs and get_init_inputs at module level."""
    try:
        tree = syntax.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return {"Model", "get_inputs", "get_init_inputs"} <= names


class _RenameModel(ast.NodeTransformer):
    def __init__(self, new: str) -> None:
        self.new = new

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.AST:  # noqa: N802 - ast API
        if node.name == "Model":
            node.name = self.new
        self.generic_visit(node)
        return node

    def visit_Name(self, node: ast.Name) -> ast.AST:  # noqa: N802 - ast API
        if node.id == "Model":
            node.id = self.new
        return node


def embed_reference(source: str, new_name: str = "_Reference") -> str:
    """The reference program with `Model` renamed and its input factories dropped (the evaluator
    takes inputs and init arguments from the task). Module constants stay: forward may read them."""
    tree = syntax.parse(source)
    tree.body = [n for n in tree.body
                 if not (isinstance(n, ast.FunctionDef) and n.name in ("get_inputs", "get_init_inputs"))]
    tree = _RenameModel(new_name).visit(tree)
    return ast.unparse(ast.fix_missing_locations(tree))
