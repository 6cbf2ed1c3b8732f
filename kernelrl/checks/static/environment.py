"""The process environment: reading it, writing it, and which variables are settings.

Rules:
- `environment_access`: reading `os.environ`/`environb`/`posix.environ` or `os.getenv` (where
  keys and seeds can be found), and naming `environ` or `/proc/*/environ` in a string the
  program uses. Build settings read by constant name (`os.environ["K"]`, `.get("K")`,
  `getenv("K")`, `"K" in os.environ`, with K in `BUILD_ENV` or `TORCH_EXTENSIONS_VERBOSE`,
  `CUDA_VISIBLE_DEVICES`, `TRITON_INTERPRET`) are no finding: the judge sets them, they hold no
  secret.
- `environment_write` (warns): setting ordinary variables (`TORCH_CUDA_ARCH_LIST` before a
  build, say). Variables that change precision (`PRECISION_ENV`), thread counts (`is_thread_env`)
  or a backend (`PYTORCH_*`, `TORCHINDUCTOR_*`, `TORCH_*`, `CUDA_LAUNCH*`, `CUBLAS_*`,
  `CUDNN_*` other than build settings) are left to the settings rules (`settings.py`), which
  read the same writes through `env_writes`.

Does not catch: a write under a name computed at run time is reported as an ordinary write
(`<computed>`, a warning), so it can set a precision or thread variable the settings rules do not
see; reads and writes by native code. The worker's environment is built from an allow-list
(`kernelrl.judge.isolation.sandbox.worker_env`), so a read finds no secret of the judge's; this rule
refuses the attempt.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from kernelrl.checks import rules as R
from kernelrl.checks.static.registry import Hit, register
from kernelrl.checks.static.source import SourceInfo
from kernelrl.checks.static.syntax import const_str, line_of, under

# Variables that change float precision, thread counts, or only a build: what each settings rule
# reports instead of environment_write.
PRECISION_ENV = ("NVIDIA_TF32_OVERRIDE", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE")
_THREAD_ENV_PREFIXES = ("OMP", "MKL", "OPENBLAS", "NUMEXPR", "VECLIB", "BLIS", "GOTO", "KMP", "GOMP", "TORCH")
_THREAD_ENV_WORDS = ("THREADS", "AFFINITY", "PROC_BIND", "PLACES", "DYNAMIC")
_WORD = re.compile(r"\w+")


def is_thread_env(key: str) -> bool:
    """A variable that sets thread counts or placement: a word (letters, digits, `_`) that starts
    with a threading library's prefix and holds one of the settings' words after it.

    What `^(OMP|...)_?\\w*(THREADS|...)\\w*$` matched, read in linear time: that pattern took
    time quadratic in a long word holding many `THREADS` (the key is the candidate's text).
    """
    key = key[:-1] if key.endswith("\n") else key  # as `$` allowed one final newline
    if _WORD.fullmatch(key) is None:
        return False
    return any(key.startswith(p) and any(w in key[len(p):] for w in _THREAD_ENV_WORDS) for p in _THREAD_ENV_PREFIXES)
BUILD_ENV = ("TORCH_CUDA_ARCH_LIST", "TORCH_EXTENSIONS_DIR", "CXX", "CC", "MAX_JOBS", "CUDA_HOME",
             "CUDA_PATH", "CXXFLAGS", "CFLAGS", "LDFLAGS", "NVCC_FLAGS", "TRITON_CACHE_DIR")
# Build settings a program may read by name: what the judge sets for builds, never a secret.
_READABLE_ENV = frozenset(BUILD_ENV) | {"TORCH_EXTENSIONS_VERBOSE", "CUDA_VISIBLE_DEVICES", "TRITON_INTERPRET"}


def env_writes(src: SourceInfo) -> Iterator[tuple[ast.AST, str | None, ast.AST]]:
    """(statement or call, variable name or None, the os.environ node) for environment writes."""
    for node in ast.walk(src.tree):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)) \
                and src.qualname(node.value) in ("os.environ", "os.environb", "posix.environ"):
            yield node, const_str(node.slice), node.value
        elif isinstance(node, ast.Call):
            q = src.qualname(node.func) or ""
            if (q in ("os.putenv", "os.unsetenv") and node.args) \
                    or (q in ("os.environ.setdefault", "os.environ.pop", "os.environ.__setitem__") and node.args):
                yield node, const_str(node.args[0]), node.func
            elif q in ("os.environ.update",):
                keys = []
                if node.args and isinstance(node.args[0], ast.Dict):
                    keys = [const_str(k) for k in node.args[0].keys if k is not None]
                keys += [k.arg for k in node.keywords if k.arg]
                for k in keys or [None]:
                    yield node, k, node.func
            elif q in ("os.environ.clear", "os.environ.popitem"):
                yield node, None, node.func


def _env_write_nodes(src: SourceInfo) -> set[int]:
    ids = set()
    for _, _, env_node in env_writes(src):
        for n in ast.walk(env_node):
            ids.add(id(n))
    return ids


def _reads_build_setting(src: SourceInfo, node: ast.AST) -> bool:
    """os.environ["K"], os.environ.get("K"), os.getenv("K") or "K" in os.environ with K a build setting."""
    parent = src.parents.get(node)
    if isinstance(parent, ast.Subscript) and parent.value is node:
        return const_str(parent.slice) in _READABLE_ENV
    if isinstance(parent, ast.Call) and parent.func is node and parent.args:
        return const_str(parent.args[0]) in _READABLE_ENV
    if isinstance(parent, ast.Compare) and node in parent.comparators and len(parent.ops) == 1 \
            and isinstance(parent.ops[0], (ast.In, ast.NotIn)):
        return const_str(parent.left) in _READABLE_ENV
    return False


@register(R.ENVIRONMENT_ACCESS)
def _environment_access(src: SourceInfo) -> Iterator[Hit]:
    writes = _env_write_nodes(src)
    for node, q in src.refs():
        if id(node) in writes or _reads_build_setting(src, node):
            continue
        if under(q, ("os.environ", "os.environb", "posix.environ", "os.getenv", "os.getenvb")):
            if q.rsplit(".", 1)[-1] in ("setdefault", "update", "pop", "clear", "popitem"):
                continue  # writes: environment_write or a settings rule
            yield Hit(line_of(node), f"reads the environment ({q})")
    for node in ast.walk(src.tree):
        text = src.code_string(node)
        if text is not None and (text in ("environ", "environb") or "/environ" in text):
            yield Hit(line_of(node), f"names {text[:40]!r}, a process environment")


@register(R.ENVIRONMENT_WRITE)
def _environment_write(src: SourceInfo) -> Iterator[Hit]:
    for node, key, _ in env_writes(src):
        if key in PRECISION_ENV or (key and is_thread_env(key)):
            continue  # reported by the precision / thread rules
        if key and key.startswith(("PYTORCH_", "TORCHINDUCTOR_", "CUDA_LAUNCH", "CUBLAS_", "CUDNN_")) \
                and key not in BUILD_ENV:
            continue  # backend settings
        if key and key.startswith("TORCH_") and key not in BUILD_ENV:
            continue
        yield Hit(line_of(node), f"sets environment variable {key or '<computed>'}")
