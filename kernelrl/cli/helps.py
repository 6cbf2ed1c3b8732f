"""Help text of generated flags, read from the config classes' own field comments: one source.

A config field documents itself where it is declared: a comment at the end of its line, or the
comment lines directly above it (or a string right after it, an attribute docstring). `field_docs`
reads those for every field of a config, nested configs included, keyed by dotted path, so
`--help` says what the code says and nothing is written twice. A `FlagTable.helps` entry is for
what the command line adds (e.g. the proposer kinds a spec may name).

Guarantees: reads source text only (`inspect.getsource` and the tokenizer), never runs anything;
a field with no comment has no entry (tests/test_cli_flags.py requires one for every flag).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import textwrap
import tokenize
import typing

from kernelrl import syntax
from kernelrl.plain import dataclass_in


def field_docs(cls: type, prefix: str = "") -> dict[str, str]:
    """Dotted field path -> its documentation, for `cls` and every config nested in it."""
    out: dict[str, str] = {}
    own = _own_docs(cls)
    hints = typing.get_type_hints(cls)
    for name in (f.name for f in dataclasses.fields(cls) if f.init):
        path = f"{prefix}{name}"
        inner = dataclass_in(hints[name])
        if inner is not None:
            out.update(field_docs(inner, path + "."))
        elif name in own:
            out[path] = own[name]
    return out


@functools.cache
def _own_docs(cls: type) -> dict[str, str]:
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    comments: dict[int, str] = {}
    code_lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                              tokenize.ENDMARKER):
            code_lines.add(tok.start[0])
    tree = syntax.parse(source)
    klass = next((n for n in tree.body if isinstance(n, ast.ClassDef)), None)
    if klass is None:
        return {}
    docs: dict[str, str] = {}
    body = klass.body
    for i, node in enumerate(body):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        name = node.target.id
        end = node.end_lineno or node.lineno
        trailing = [comments[n] for n in range(node.lineno, end + 1) if n in comments and n in code_lines]
        above: list[str] = []
        line = node.lineno - 1
        while line in comments and line not in code_lines:
            above.insert(0, comments[line])
            line -= 1
        after = body[i + 1] if i + 1 < len(body) else None
        docstring = (after.value.value if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                     and isinstance(after.value.value, str) else None)
        text = " ".join(p for p in (" ".join(above), " ".join(trailing)) if p) or " ".join((docstring or "").split())
        if text:
            docs[name] = text
    return docs
