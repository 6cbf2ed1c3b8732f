"""Candidates: source code that defines `ModelNew`, and its extraction from an LLM's answer.

Guarantees: `extract_code` returns the last *complete* fenced code block of an answer (a block
whose closing fence is missing is ignored, since a truncated answer's last block is unfinished
code), preferring blocks that define `ModelNew`; `Candidate.hash` depends on the source only;
`language` is inferred from the source (inline C++/CUDA through torch's extension loader,
Triton when the source defines a kernel with Triton's `jit`, `autotune` or `heuristics`,
otherwise PyTorch-level code); `Language.interpreted_on(device)` says where a language's
kernels run under an interpreter (Triton on CPU), so outputs can be checked but times mean
nothing.

Does not check that the code is correct, safe or honest: that is the evaluator's and the
checks' work.
"""

from __future__ import annotations

import ast
import enum
import hashlib
import re
from dataclasses import dataclass, field

from kernelrl import syntax

_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([\w+#.-]*)[^\n]*$", re.MULTILINE)


class Language(str, enum.Enum):
    PYTORCH = "pytorch"
    CPP = "cpp"
    CUDA = "cuda"
    TRITON = "triton"

    @property
    def needs_gpu(self) -> bool:
        """Written for a GPU (Triton also runs on a CPU, under its interpreter)."""
        return self in (Language.CUDA, Language.TRITON)

    def interpreted_on(self, device: str) -> bool:
        """Whether kernels in this language run under an interpreter on `device`.

        Triton on a CPU runs under `TRITON_INTERPRET=1`: every program instance is executed in
        Python on host tensors, so outputs are real and can be checked, but times are not the
        kernel's (seconds for what a GPU does in microseconds).
        """
        return self is Language.TRITON and device == "cpu"


@dataclass(frozen=True, kw_only=True)
class Candidate:
    source: str
    origin: str = ""  # file path, proposer spec or database id: for messages only
    meta: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    @property
    def hash(self) -> str:
        return source_hash(self.source)

    @property
    def language(self) -> Language:
        return detect_language(self.source)


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


# What makes a function a Triton kernel (triton.jit, triton.autotune, triton.heuristics).
_TRITON_KERNEL_MAKERS = frozenset({"jit", "autotune", "heuristics"})


def defines_triton_kernel(source: str) -> bool:
    """The source decorates (or wraps) a function with Triton's jit, autotune or heuristics.

    Names are followed through imports (`import triton as t`, `from triton import jit`); an
    import alone (`try: import triton`) is not a kernel. Unparsable source falls back to a text
    search for `triton.jit`.
    """
    try:
        tree = syntax.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return re.search(r"\btriton\.(jit|autotune|heuristics)\b", source) is not None
    modules: set[str] = set()  # names bound to the triton package
    makers: set[str] = set()  # names bound to triton's jit, autotune or heuristics
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "triton" or (alias.name.startswith("triton.") and alias.asname is None):
                    modules.add(alias.asname or "triton")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "triton":
            makers.update(a.asname or a.name for a in node.names if a.name in _TRITON_KERNEL_MAKERS)

    def is_maker(e: ast.expr) -> bool:
        if isinstance(e, ast.Call):
            e = e.func  # @triton.autotune(configs=...) and triton.jit(fn)
        if isinstance(e, ast.Name):
            return e.id in makers
        return (isinstance(e, ast.Attribute) and e.attr in _TRITON_KERNEL_MAKERS
                and isinstance(e.value, ast.Name) and e.value.id in modules)

    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(map(is_maker, node.decorator_list)):
            return True
        if isinstance(node, ast.Call) and is_maker(node.func):
            return True
    return False


def detect_language(source: str) -> Language:
    if defines_triton_kernel(source):
        return Language.TRITON
    uses_loader = re.search(r"\bload_inline\b|\bcpp_extension\b", source) is not None
    if uses_loader and re.search(r"cuda_sources\s*=|__global__|<<<", source):
        return Language.CUDA
    if uses_loader:
        return Language.CPP
    return Language.PYTORCH


def defines_model_new(source: str) -> bool:
    try:
        tree = syntax.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "ModelNew":
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "ModelNew" for t in node.targets):
            return True
    return False


def fenced_blocks(answer: str) -> list[tuple[str, str]]:
    """Complete fenced blocks as (language tag, body), in order of appearance."""
    blocks: list[tuple[str, str]] = []
    pos = 0
    while True:
        m = _FENCE.search(answer, pos)
        if not m:
            break
        fence, tag = m.group(1), m.group(2).lower()
        # The closing fence uses the same character, at least as long, with no info string.
        close = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$", re.MULTILINE)
        c = close.search(answer, m.end())
        if not c:
            break  # unclosed: truncated answer; nothing after it is complete either
        body = answer[m.end() + 1 : c.start()] if m.end() < len(answer) else ""
        blocks.append((tag, body.rstrip("\n") + "\n"))
        pos = c.end()
    return blocks


def extract_code(answer: str) -> str | None:
    """The candidate program in an LLM answer: the last complete fenced block.

    Among complete blocks, the last one that defines `ModelNew` wins; failing that, the last
    Python-tagged (or untagged) block. Returns None when the answer has no complete block.
    """
    blocks = fenced_blocks(answer)
    if not blocks:
        return None
    with_model = [body for _, body in blocks if defines_model_new(body)]
    if with_model:
        return with_model[-1]
    python_like = [body for tag, body in blocks if tag in ("", "python", "py", "python3")]
    return python_like[-1] if python_like else blocks[-1][1]
