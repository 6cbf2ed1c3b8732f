"""No pattern or scanner applied to untrusted text takes more than linear time.

Untrusted text: request bodies (`api.check_body`), Host headers (`guard`), candidate sources (the
static rules, `kernelrl.candidate`), model answers (`extract_code`), compiler output and
tracebacks (`kernelrl.episodes.feedback`, `kernelrl.judge.harness.toolchain`). Each is driven, at the size
limit the server or the judge allows, by text built from the pieces its patterns look for,
repeated: what makes a backtracking pattern quadratic (an opening never closed, an escape that
hides a terminator, a prefix that almost matches). A quadratic scan of 256 KiB takes minutes
(the comment pattern this replaced: 10 s at 64 KB); every case here must finish in `BOUND_S`.
Where a pattern was replaced by a scanner, the scanner is checked against the old pattern's
answers on small random text, so the rewrite changed the cost and nothing else.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernelrl.backends.api import TooLarge, check_body, scrub_paths
from kernelrl.candidate import detect_language, extract_code, fenced_blocks
from kernelrl.checks.static.environment import is_thread_env
from kernelrl.checks.static.kernels import strip_c_comments
from kernelrl.checks.static.scan import check_source
from kernelrl.episodes import feedback
from kernelrl.judge.harness import toolchain
from kernelrl.serve.config import ServeConfig
from kernelrl.web import guard

BOUND_S = 2.0  # generous on a loaded two-core machine; a quadratic scan at these sizes takes minutes
SOURCE_LIMIT = ServeConfig().max_source_bytes  # 256 KiB: a candidate, a task, an answer
BODY_LIMIT = ServeConfig().max_body_bytes  # 32 MiB
OUTPUT_LIMIT = 1 << 20  # compiler output and tracebacks, as read back from a worker

FAST = settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def fill(unit: str, size: int, tail: str = "") -> str:
    return (unit * (size // max(1, len(unit)) + 1))[: size - len(tail)] + tail


# -- request bodies ------------------------------------------------------------------------------

_OLD_JSON_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[{}\[\],:]', re.DOTALL)


def _old_check_body(body: bytes, *, max_items: int, max_string_bytes: int) -> str | None:
    """The quadratic scan this replaced, as the reference of what is refused."""
    limit, longest = 20 * max_items + 32, 6 * max_string_bytes + 2
    depth = items = 0
    for n, m in enumerate(_OLD_JSON_TOKEN.finditer(body), 1):
        if n > limit:
            return "values"
        first = body[m.start()]
        if first == 0x22:
            if m.end() - m.start() > longest:
                return "string"
        elif first in b"{[":
            depth += 1
            if depth == 3 and first == 0x7B:
                items += 1
                if items > max_items:
                    return "items"
        elif first in b"}]":
            depth -= 1
    return None


@settings(max_examples=1500, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from([b'"', b"\\", b'\\"', b"{", b"}", b"[", b"]", b",", b":", b"a", b"\n"]), max_size=40))
def test_body_scan_refuses_what_the_old_pattern_refused(parts: list[bytes]) -> None:
    body = b"".join(parts)
    try:
        check_body(body, max_items=2, max_string_bytes=1)
        got = None
    except TooLarge as e:
        got = "values" if "JSON values" in str(e) else "string" if "string" in str(e) else "items"
    old = _old_check_body(body, max_items=2, max_string_bytes=1)
    if got != old:  # only where a string is never closed, which no JSON parser accepts either
        with pytest.raises(ValueError):
            json.loads(body)


@pytest.mark.parametrize("unit", [b'\\"', b'"\\"', b"\\\\\\", b'{"a":"', b"[{", b'"",', b"\\u00"])
@pytest.mark.parametrize("size", [64 << 10, BODY_LIMIT])
def test_body_scan_is_linear_at_the_body_limit(unit: bytes, size: int) -> None:
    body = b'{"items": [{"task": "' + unit * (size // len(unit))
    assert timed(lambda: _scan(body)) < BOUND_S


def _scan(body: bytes) -> None:
    try:
        check_body(body, max_items=1024, max_string_bytes=SOURCE_LIMIT)
    except TooLarge:
        pass


def test_body_scan_measures_strings_cut_anywhere() -> None:
    # A string longer than a source may be is refused however its escapes fall on the scan's slices.
    for pad in range(4):
        body = b'{"items": [{"task": "' + b"a" * pad + b'\\"' * (4 * SOURCE_LIMIT) + b'"}]}'
        with pytest.raises(TooLarge, match="string"):
            check_body(body, max_items=1024, max_string_bytes=SOURCE_LIMIT)
    ok = b'{"items": [{"task": "' + b'\\"' * (SOURCE_LIMIT // 2) + b'", "candidate": "x"}]}'
    check_body(ok, max_items=1024, max_string_bytes=SOURCE_LIMIT)


@FAST
@given(st.text(alphabet="[]:.-0123456789abcdef", min_size=1, max_size=8))
def test_host_pattern_is_linear(unit: str) -> None:
    host = fill(unit, 64 << 10, "!")  # far past any header limit
    assert timed(lambda: guard._HOST.match(host)) < BOUND_S


# -- candidate sources ---------------------------------------------------------------------------

_OLD_C_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)


@settings(max_examples=1500, deadline=None, derandomize=True)
@given(st.text(alphabet="/*\nab", max_size=30))
def test_comment_stripping_is_the_old_patterns(text: str) -> None:
    assert strip_c_comments(text) == _OLD_C_COMMENT.sub("", text)


_OLD_THREAD_ENV = re.compile(r"^(OMP|MKL|OPENBLAS|NUMEXPR|VECLIB|BLIS|GOTO|KMP|GOMP|TORCH)_?\w*(THREADS|AFFINITY|"
                             r"PROC_BIND|PLACES|DYNAMIC)\w*$")


@settings(max_examples=1500, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from(["OMP", "GOMP", "TORCH", "_", "THREADS", "PLACES", "PROC_BIND", "x", "-", "\n"]),
                max_size=6))
def test_thread_variable_test_is_the_old_patterns(parts: list[str]) -> None:
    key = "".join(parts)
    assert is_thread_env(key) == bool(_OLD_THREAD_ENV.match(key))


CPP_UNITS = ["/*x", "/*", "//", "/**", "*/", "#include ", "for (", "for ", "__m", "cudaStreamCreate", "PyRun_",
             "py::", "torch::", "\\", '"', "\n"]
PY_UNITS = ["OMP_THREADS", "THREADS", "```", "~~~", "```python\n", "\n", " ", "\t", "\\", "(", "[", "{", "'",
            '"', "'''", "#", "triton.", "load_inline", "cuda_sources ", "__global__", "<<", "float16"]


def cpp_candidate(cpp: str) -> str:
    """A candidate whose load_inline C++ and CUDA sources are `cpp` (made a valid string literal)."""
    return ('import os\nfrom torch.utils.cpp_extension import load_inline\nsrc = """#include <torch/extension.h>\n'
            + cpp.replace('"', "'").replace("\\", "/") + '"""\n'
            'ext = load_inline(name="x", cpp_sources=src, cuda_sources=src, functions=["f"])\n')


@FAST
@given(st.lists(st.sampled_from(CPP_UNITS), min_size=1, max_size=4))
def test_cpp_rules_are_linear_at_the_source_limit(units: list[str]) -> None:
    cpp = fill("".join(units), SOURCE_LIMIT - 400)
    linear_cost(lambda c: check_source(cpp_candidate(c)), cpp)
    assert timed(lambda: strip_c_comments(cpp)) < BOUND_S


@pytest.mark.parametrize("unit", ["/*x", "/*", "//x/*", "/*/", "/**"])
def test_unclosed_comments_at_the_source_limit(unit: str) -> None:
    cpp = fill(unit, SOURCE_LIMIT)
    source = f'from torch.utils.cpp_extension import load_inline\nsrc = """#include <x>\n{cpp}"""\n' \
             'load_inline(name="x", cpp_sources=src, functions=["f"])\n'
    assert timed(lambda: check_source(source)) < BOUND_S


@pytest.mark.parametrize("key", ["OMP_" + "THREADS" * 37000 + "!", "OMP" + "_" * SOURCE_LIMIT + "-"])
def test_environment_names_at_the_source_limit(key: str) -> None:
    source = f"import os\nos.environ[{key!r}] = '1'\n"
    assert timed(lambda: check_source(source)) < BOUND_S


@FAST
@given(st.lists(st.sampled_from(PY_UNITS), min_size=1, max_size=4))
def test_answer_and_candidate_scans_are_linear(units: list[str]) -> None:
    text = fill("".join(units), SOURCE_LIMIT)
    assert timed(lambda: fenced_blocks(text)) < BOUND_S
    assert timed(lambda: extract_code(text)) < BOUND_S
    assert timed(lambda: detect_language(text)) < BOUND_S


def linear_cost(fn: Callable[[str], object], text: str) -> None:
    """`fn` on all of `text` costs at most 8 times what it costs on its first quarter (linear: 4,
    quadratic: 16), or under `BOUND_S` in all. Deep nesting may exhaust the recursion limit: the
    judge turns that into a verdict (kernelrl.judge.group), so it counts as an answer here."""
    def run(t: str) -> None:
        try:
            fn(t)
        except RecursionError:
            pass
    quarter = timed(lambda: run(text[: len(text) // 4]))
    full = timed(lambda: run(text))
    assert full < max(BOUND_S, 8 * quarter), (quarter, full)


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(st.lists(st.sampled_from(PY_UNITS), min_size=1, max_size=4))
def test_static_check_cost_grows_linearly(units: list[str]) -> None:
    linear_cost(check_source, fill("".join(units), SOURCE_LIMIT))


# -- compiler output and tracebacks ----------------------------------------------------------------

OUTPUT_UNITS = ["/a/", "//", "/a.b+c@d", "error", "error: ", "Error", "fatal error: ", "fatal", ": No such file", "cannot open source file \"",
                "(1): ", "/a", "/", "File \"", "\", line 1, in ", "  ", "[1/2]", "ninja", "incorrect on input set 1 (",
                "): ", "output 0 is ", ", expected ", "\n", "x"]


@FAST
@given(st.lists(st.sampled_from(OUTPUT_UNITS), min_size=1, max_size=5))
def test_output_patterns_are_linear(units: list[str]) -> None:
    out = fill("".join(units), OUTPUT_LIMIT)
    line = out.replace("\n", " ")
    assert timed(lambda: toolchain.first_errors(out)) < BOUND_S
    assert timed(lambda: toolchain._MISSING_HEADER.search(out)) < BOUND_S
    assert timed(lambda: feedback._clip(line, n=len(line))) < BOUND_S
    assert timed(lambda: scrub_paths([out])) < BOUND_S
    assert timed(lambda: feedback._mismatch(out)) < BOUND_S
    assert timed(lambda: feedback._mismatch("incorrect on input set 1 (plain): " + line)) < BOUND_S
    assert timed(lambda: [feedback._FRAME.match(x) for x in out.splitlines()]) < BOUND_S
    assert timed(lambda: [feedback._COMPILER_ERROR.search(x) and feedback._BUILD_TOOL.search(x)
                          for x in out.splitlines()]) < BOUND_S
