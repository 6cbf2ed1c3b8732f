"""Global settings a candidate changes for everything that runs after it in the process.

Rules:
- `precision_change` (warns under `open`, rejects under `strict`: the one precision policy it
  shares with `reduced_precision_compute`, see `precision.py`): TF32 and reduced-precision
  flags under `torch.backends` set away from PyTorch's default (`x.y = v` or `setattr`),
  `set_float32_matmul_precision` below "highest", `set_default_dtype`, `set_flush_denormal`,
  torch's private setters for them, and `NVIDIA_TF32_OVERRIDE`-like variables.
- `thread_setting_change`: `set_num_threads`, `set_num_interop_threads`, `sched_setaffinity`,
  `threadpoolctl`, `os.nice`/`setpriority`, and `OMP_NUM_THREADS`-like variables.
- `backend_setting_change` (warns under `open`): other `torch.backends` flags away from their
  defaults (`cudnn.benchmark`, `cudnn.deterministic`, ...), compiler configs
  (`torch._dynamo.config`, `torch._inductor.config`, ...), SDP backend toggles,
  `use_deterministic_algorithms`, grad mode or `gc` switched as a statement (not as a `with`
  context), and `PYTORCH_*`/`TORCH_*`-like variables that are not build settings.

A setting assigned the value it already has (`_SETTING_DEFAULTS`, `_CALL_DEFAULTS`: PyTorch's
defaults as of the supported torch) changes nothing and is no finding; a value the syntax tree
cannot read is a change. `SETTINGS_PREFIXES` is what `module_patching` leaves to these rules.

Does not catch: settings reached through names the tree cannot resolve, or changed by native
code. The dynamic `global_state_changed`, `backend_state_changed` and `precision_state_changed`
compare the settings in the candidate's process before and after, whatever changed them.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from kernelrl.checks import rules as R
from kernelrl.checks.static.environment import BUILD_ENV, PRECISION_ENV, env_writes, is_thread_env
from kernelrl.checks.static.registry import Hit, register
from kernelrl.checks.static.source import SourceInfo
from kernelrl.checks.static.syntax import const_str, line_of, store_targets, under

# Settings handled by the settings rules instead of module_patching
SETTINGS_PREFIXES = ("torch.backends", "torch._dynamo.config", "torch._inductor.config",
                     "torch._functorch.config", "torch.fx.experimental._config", "torch.jit._state")
_PRECISION_ATTR = re.compile(r"tf32|reduced_precision|fp32_precision|allow_fp16|allow_bf16", re.IGNORECASE)
_PRECISION_CALLS = ("torch.set_default_dtype", "torch.set_default_tensor_type", "torch.set_flush_denormal",
                    "torch._C._set_cublas_allow_tf32", "torch._C._set_cudnn_allow_tf32",
                    "torch._C._set_cublas_allow_fp16_reduced_precision_reduction",
                    "torch._C._set_cublas_allow_bf16_reduced_precision_reduction",
                    "torch._C._set_float32_matmul_precision")

# Global settings set to the value they already have change nothing. PyTorch's defaults, as of
# the torch this package supports; a flag set to anything else, or to a value the syntax tree
# cannot read, is a change.
_SETTING_DEFAULTS: dict[str, tuple[object, ...]] = {
    "torch.backends.cudnn.allow_tf32": (True,),
    "torch.backends.cuda.matmul.allow_tf32": (False,),
    "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction": (True,),
    "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction": (True,),
    "torch.backends.cuda.matmul.allow_fp16_accumulation": (False,),
    "torch.backends.fp32_precision": ("ieee", "none"),
    "torch.backends.cuda.matmul.fp32_precision": ("ieee", "none"),
    "torch.backends.cudnn.fp32_precision": ("ieee", "none"),
    "torch.backends.cudnn.conv.fp32_precision": ("tf32",),
    "torch.backends.cudnn.rnn.fp32_precision": ("tf32",),
    "torch.backends.mkldnn.fp32_precision": ("ieee", "none"),
    "torch.backends.mkldnn.matmul.fp32_precision": ("ieee", "none"),
    "torch.backends.mkldnn.conv.fp32_precision": ("ieee", "none"),
    "torch.backends.mkldnn.rnn.fp32_precision": ("ieee", "none"),
    "torch.backends.cudnn.benchmark": (False,),
    "torch.backends.cudnn.deterministic": (False,),
    "torch.backends.cudnn.enabled": (True,),
    "torch.backends.mkldnn.enabled": (True,),
}
_CALL_DEFAULTS: dict[str, tuple[object, ...]] = {
    "torch.set_float32_matmul_precision": ("highest",),
    "torch.set_default_dtype": ("torch.float32", "torch.float"),
    "torch.set_flush_denormal": (False,),
    "torch.use_deterministic_algorithms": (False,),
}


def _setting_stores(src: SourceInfo) -> Iterator[tuple[ast.AST, str]]:
    """(node, dotted path) for assignments to torch settings attributes (x.y = v and setattr)."""
    for node in ast.walk(src.tree):
        for t in store_targets(node):
            if isinstance(t, ast.Attribute):
                q = src.qualname(t)
                if q and under(q, SETTINGS_PREFIXES):
                    yield node, q
        if isinstance(node, ast.Call) and src.qualname(node.func) == "builtins.setattr" and len(node.args) >= 2:
            base, attr = src.qualname(node.args[0]), const_str(node.args[1])
            if base and under(base, SETTINGS_PREFIXES):
                yield node, f"{base}.{attr or '<computed>'}"


def _setting_value(node: ast.AST) -> ast.AST | None:
    """The value a settings store assigns (x.y = v, setattr(x, "y", v))."""
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        return node.value
    if isinstance(node, ast.Call) and len(node.args) >= 3:
        return node.args[2]
    return None


def _is_default(src: SourceInfo, setting: str, value: ast.AST | None) -> bool:
    defaults = _SETTING_DEFAULTS.get(setting) if setting in _SETTING_DEFAULTS else _CALL_DEFAULTS.get(setting)
    if defaults is None or value is None:
        return False
    if isinstance(value, ast.Constant):
        return any(type(value.value) is type(d) and value.value == d for d in defaults)
    q = src.qualname(value)
    return q is not None and q in defaults


def _is_precision_setting(q: str) -> bool:
    return bool(_PRECISION_ATTR.search(q.rsplit(".", 1)[-1]) or _PRECISION_ATTR.search(q))


@register(R.PRECISION_CHANGE)
def _precision_change(src: SourceInfo) -> Iterator[Hit]:
    for node, q in _setting_stores(src):
        if _is_precision_setting(q) and not _is_default(src, q, _setting_value(node)):
            yield Hit(line_of(node), f"sets {q}, a global precision setting, away from its default")
    for call, q in src.calls():
        if q == "torch.set_float32_matmul_precision":
            arg = const_str(call.args[0]) if call.args else None
            if arg != "highest":
                yield Hit(line_of(call), f"torch.set_float32_matmul_precision({arg or '...'!r}) lowers float32 "
                                         "matmul precision globally")
        elif under(q, _PRECISION_CALLS) and not _is_default(src, q, call.args[0] if call.args else None):
            yield Hit(line_of(call), f"{q}() changes global precision")
    for node, key, _ in env_writes(src):
        if key in PRECISION_ENV:
            yield Hit(line_of(node), f"sets environment variable {key}, which changes float precision")


@register(R.THREAD_SETTING_CHANGE)
def _thread_setting_change(src: SourceInfo) -> Iterator[Hit]:
    calls = ("torch.set_num_threads", "torch.set_num_interop_threads", "os.sched_setaffinity",
             "threadpoolctl", "mkl.set_num_threads", "numexpr.set_num_threads", "torch._C._set_num_threads",
             "os.nice", "os.setpriority")
    for node, q in src.calls():
        if under(q, calls):
            yield Hit(line_of(node), f"{q}() changes global threading or scheduling")
    for write, key, _ in env_writes(src):
        if key and is_thread_env(key):
            yield Hit(line_of(write), f"sets environment variable {key}, which changes thread counts")


@register(R.BACKEND_SETTING_CHANGE)
def _backend_setting_change(src: SourceInfo) -> Iterator[Hit]:
    for node, q in _setting_stores(src):
        if not _is_precision_setting(q) and not _is_default(src, q, _setting_value(node)):
            yield Hit(line_of(node), f"sets {q}, a global backend setting")
    calls = ("torch.use_deterministic_algorithms", "torch.set_deterministic_debug_mode",
             "torch.backends.cuda.enable_flash_sdp", "torch.backends.cuda.enable_mem_efficient_sdp",
             "torch.backends.cuda.enable_math_sdp", "torch.backends.cuda.enable_cudnn_sdp",
             "torch.backends.cuda.preferred_linalg_library", "torch.backends.cuda.preferred_blas_library",
             "torch.autograd.set_detect_anomaly", "torch._C._set_")
    statement_calls = ("torch.set_grad_enabled", "torch.autograd.set_grad_enabled",
                       "torch.autograd.grad_mode.set_grad_enabled", "torch._C._set_grad_enabled",
                       "torch.inference_mode", "gc.disable", "gc.freeze", "gc.set_threshold")
    for call, q in src.calls():
        if (under(q, calls) or (q.startswith("torch._C._set_") and not under(q, _PRECISION_CALLS)
                                and q != "torch._C._set_num_threads")) \
                and not _is_default(src, q, call.args[0] if call.args else None):
            yield Hit(line_of(call), f"{q}() changes a global backend setting")
        elif under(q, statement_calls) and isinstance(src.parents.get(call), ast.Expr):
            yield Hit(line_of(call), f"{q}() as a statement changes global state for everything that runs later")
    for write, key, _ in env_writes(src):
        if key and (key.startswith(("PYTORCH_", "TORCHINDUCTOR_", "TORCH_", "CUDA_LAUNCH", "CUBLAS_", "CUDNN_"))
                    and key not in BUILD_ENV and key not in PRECISION_ENV and not is_thread_env(key)):
            yield Hit(line_of(write), f"sets environment variable {key}, a backend setting")
