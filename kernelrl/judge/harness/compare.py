"""Output comparison: is a candidate's output the reference's, within a dtype-aware tolerance?

Guarantees: outputs are compared leaf by leaf after flattening tuples and lists; each leaf must
be a plain `torch.Tensor` (the judge never receives subclasses: see `kernelrl.judge.harness.channel`) with the
reference's shape and dtype; values must satisfy |c - r| <= atol + rtol * |r| elementwise, with
NaN equal to NaN only where the reference has NaN. The result reports the largest absolute and
relative errors even when the comparison passes, so reports can show how close a candidate is
(the relative error over the places where it is defined: not where the reference is NaN or both
sides are infinite). Outputs are compared a chunk at a time (`_COMPARE_CHUNK` elements): the judge's
working memory for a comparison is a few float64 chunks, not float64 copies of the whole output
(several times a 6 GiB fp32 output otherwise).

Tolerances per dtype (atol = rtol; multiplied by `EvalConfig.tol_scale`), against KernelBench's
(`get_tolerance_for_precision` in its eval, after torchbench; its earlier eval used 1e-2 for every
dtype):

| dtype | here | KernelBench |
|---|---|---|
| float64 | 1e-8 | not used |
| float32, exact (default: TF32 off in every worker) | 1e-4 | 1e-4 |
| float32 when the evaluation allows TF32 (`EvalConfig.allow_tf32`) | 1e-2 | 1e-4 (TF32 flags left to torch) |
| float16, bfloat16 | 1e-2 | 1e-2 |
| integers, bool | exact | exact |

TF32 keeps fp16's 10-bit mantissa, so fp32 computed through it gets fp16's tolerance; where TF32 is
off (the default) the reference and every candidate run exact fp32 (`precision.set_precision`), and a
candidate that turns TF32 on for itself is held to 1e-4 and reported (`checks.dynamic`).

A failed comparison also says whether every value was within `NEAR_FACTOR` (100) times the
tolerance (`Comparison.near`: KernelBench's older 1e-2 for fp32): an answer that tracks its input
with too little precision (autocast, fp16 accumulation), not one that ignores it.

Does not decide what a mismatch means (incorrect, cached, nondeterministic): the evaluator does.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import torch
from blake3 import blake3

# dtype -> (atol, rtol). fp32 follows the evaluator protocol (1e-4); half types 1e-2.
DEFAULT_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-8, 1e-8),
    torch.float32: (1e-4, 1e-4),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (1e-2, 1e-2),
}


# A failed comparison whose every value is within this many times the tolerance is `near`.
NEAR_FACTOR = 100.0


class Mismatch(enum.StrEnum):
    """Why two outputs differ."""

    NOT_PLAIN_TENSOR = "not_plain_tensor"  # a subclass, proxy or non-tensor where a tensor was expected
    COUNT = "count"  # a different number of outputs
    VALUE = "value"  # a non-tensor output differs
    SHAPE = "shape"
    DTYPE = "dtype"
    NAN = "nan"  # NaN where the reference has none, or the reverse
    INF = "inf"  # infinities differ
    TOLERANCE = "tolerance"  # values outside the tolerance


@dataclass(frozen=True, kw_only=True)
class Comparison:
    ok: bool
    reason: str  # empty when ok
    max_abs_err: float
    max_rel_err: float
    mismatch: Mismatch | None = None  # None when ok
    # failed on tolerance alone, with every value within NEAR_FACTOR times it: imprecise, not unrelated
    near: bool = False


# Elements hashed at a time (`content_digest`, which reads views and makes no temporaries).
_CHUNK = 1 << 22
# Elements compared (`compare_outputs`) and fingerprinted (`output_digest`) at a time. A comparison
# makes about ten float64 temporaries per chunk; at 64 Ki elements (512 KiB each) they stay in the
# CPU's caches and come from the allocator's free lists. At 4 Mi elements each one was mapped,
# faulted in page by page and unmapped again: the same comparison took 5x the time, most of it in
# the kernel (benchmarks/README.md).
_COMPARE_CHUNK = 1 << 16

# fp32 when the evaluation allows TF32 (matmuls and convolutions with fp16's mantissa): fp16's tolerance.
TF32_TOLERANCE = DEFAULT_TOLERANCES[torch.float16]


def tolerance(dtype: torch.dtype, scale: float = 1.0, *, tf32: bool = False) -> tuple[float, float]:
    if tf32 and dtype is torch.float32:
        atol, rtol = TF32_TOLERANCE
    else:
        atol, rtol = DEFAULT_TOLERANCES.get(dtype, (0.0, 0.0))  # integers and bools: exact
    return atol * scale, rtol * scale


def flatten(x: object) -> list[object]:
    if isinstance(x, (list, tuple)):
        return [y for item in x for y in flatten(item)]
    return [x]


def _failed(reason: str, mismatch: Mismatch) -> Comparison:
    """A comparison that failed before any error could be measured."""
    return Comparison(ok=False, reason=reason, mismatch=mismatch, max_abs_err=math.inf, max_rel_err=math.inf)


@dataclass(frozen=True)
class _LeafErrors:
    nan_differ: int  # places where exactly one side is NaN
    inf_differ: bool  # an infinity where the other side differs
    max_abs: float
    max_rel: float
    outside: int  # values outside the tolerance
    far: int  # values outside NEAR_FACTOR times the tolerance


def _leaf_errors(c: torch.Tensor, r: torch.Tensor, atol: float, rtol: float) -> _LeafErrors:
    """The errors of one flat output against the reference's, a chunk at a time: the judge's working
    memory is a few float64 copies of `_COMPARE_CHUNK` elements, not of the whole output.

    A chunk whose differences are all finite (no NaN or infinity on either side: the usual case)
    skips the handling of NaNs and infinities (about half the time of a comparison; every
    correctness run and spot check compares)."""
    nan_differ = outside = far = 0
    inf_differ = False
    max_abs = max_rel = 0.0
    for start in range(0, r.numel(), _COMPARE_CHUNK):
        c64 = c[start:start + _COMPARE_CHUNK].to(torch.float64)
        r64 = r[start:start + _COMPARE_CHUNK].to(torch.float64)
        diff = c64.sub(r64).abs_()
        r_abs = r64.abs()  # not in place: r64 is the reference's own output where it is float64
        if bool(torch.isfinite(diff).all()):  # neither side has a NaN or an infinity here
            if nan_differ:
                continue  # the verdict is a NaN mismatch; this chunk adds none
            rel = diff.div(r_abs.clamp_min(1e-12))
        else:
            r_nan = torch.isnan(r64)
            nan_differ += int((r_nan != torch.isnan(c64)).sum())
            if nan_differ:
                continue  # the verdict is a NaN mismatch; only its count is still needed
            finite = ~r_nan
            # inf == inf (same sign) gives nan for the difference: count it as exact
            diff = torch.where(torch.isnan(diff) & finite & (c64 == r64), torch.zeros_like(diff), diff)
            diff = torch.where(finite, diff, torch.zeros_like(diff))
            if bool(torch.isnan(diff).any()):
                inf_differ = True
                continue
            # NaN where both are infinite, or where the reference is NaN: no relative error there
            rel = torch.nan_to_num(diff / r_abs.clamp_min(1e-12), nan=0.0, posinf=math.inf)
        if diff.numel():
            max_abs = max(max_abs, float(diff.max()))
            max_rel = max(max_rel, float(rel.max()))
        allowed = r_abs.mul_(rtol).add_(atol)
        out_here = int((diff > allowed).sum())
        outside += out_here
        if out_here:  # only a failing chunk can hold a value far outside: passing ones pay nothing more
            far += int((diff > allowed.mul_(NEAR_FACTOR)).sum())
    return _LeafErrors(nan_differ=nan_differ, inf_differ=inf_differ, max_abs=max_abs, max_rel=max_rel,
                       outside=outside, far=far)


def compare_outputs(candidate: object, reference: object, *, tol_scale: float = 1.0, tf32: bool = False) -> Comparison:
    c_leaves, r_leaves = flatten(candidate), flatten(reference)
    if len(c_leaves) != len(r_leaves):
        return _failed(f"returned {len(c_leaves)} outputs, expected {len(r_leaves)}", Mismatch.COUNT)
    max_abs = max_rel = 0.0
    for i, (c, r) in enumerate(zip(c_leaves, r_leaves)):
        where = f"output {i}" if len(r_leaves) > 1 else "output"
        if isinstance(c, dict):
            what = c.get("not_plain_tensor") or c.get("unsupported_output")
            return _failed(f"{where} is a {what}, not a plain torch.Tensor", Mismatch.NOT_PLAIN_TENSOR)
        if not isinstance(r, torch.Tensor):
            if c != r:
                return _failed(f"{where} is {c!r}, expected {r!r}", Mismatch.VALUE)
            continue
        if type(c) is not torch.Tensor:
            return _failed(f"{where} is {type(c).__name__}, not a plain torch.Tensor", Mismatch.NOT_PLAIN_TENSOR)
        if c.shape != r.shape:
            return _failed(f"{where} has shape {tuple(c.shape)}, expected {tuple(r.shape)}", Mismatch.SHAPE)
        if c.dtype != r.dtype:
            return _failed(f"{where} has dtype {c.dtype}, expected {r.dtype}", Mismatch.DTYPE)
        if r.numel() == 0:
            continue
        if torch.equal(c, r):
            continue  # bitwise the same (NaN never equals itself, so NaNs take the long way)
        atol, rtol = tolerance(r.dtype, tol_scale, tf32=tf32)
        found = _leaf_errors(c.reshape(-1), r.reshape(-1), atol, rtol)
        if found.nan_differ:
            return _failed(f"{where}: NaN in {found.nan_differ} places where the reference differs", Mismatch.NAN)
        if found.inf_differ:
            return _failed(f"{where}: infinite values differ from the reference", Mismatch.INF)
        max_abs, max_rel = max(max_abs, found.max_abs), max(max_rel, found.max_rel)
        if found.outside:
            return Comparison(ok=False, reason=(f"{where}: {found.outside} of {r.numel()} values outside tolerance "
                                                f"(max abs err {found.max_abs:.3g}, atol {atol:g}, rtol {rtol:g})"),
                              max_abs_err=max_abs, max_rel_err=max_rel, mismatch=Mismatch.TOLERANCE,
                              near=found.far == 0)
    return Comparison(ok=True, reason="", max_abs_err=max_abs, max_rel_err=max_rel)


def output_digest(a: object) -> str:
    """A fingerprint of a nested output: the same for two outputs equal value for value (same
    structure, shapes, dtypes and plain values; NaN equal to NaN in the same places, -0.0 to 0.0),
    different otherwise but for a hash collision. The judge keeps it instead of the output, so an output can
    be dropped as soon as it is compared and later ones still be told apart from it. A chunk of
    `_COMPARE_CHUNK` elements at a time: its temporaries (NaN map, zeros folded) stay in the caches."""
    h = blake3()  # a fingerprint, not a secret; BLAKE3 for speed (see content_digest)
    for x in flatten(a):
        if not isinstance(x, torch.Tensor):
            h.update(f"V{x!r};".encode())
            continue
        flat = x.detach().reshape(-1)
        h.update(f"T{tuple(x.shape)}{x.dtype};".encode())
        for start in range(0, flat.numel(), _COMPARE_CHUNK):
            part = flat[start:start + _COMPARE_CHUNK].cpu()
            if part.is_floating_point():
                h.update(torch.isnan(part).view(torch.uint8).numpy().data)
                # NaN as 0 (where they are is hashed above), infinities as the dtype's extremes, and
                # + 0.0 makes -0.0 the 0.0 it equals
                part = torch.nan_to_num(part, nan=0.0).add_(0.0)
            h.update(part.contiguous().view(torch.uint8).numpy().data)
    return h.hexdigest()


def content_digest(a: object) -> str:
    """A fingerprint of a nested value's bytes (BLAKE3 of each tensor's shape, dtype and raw
    memory, chunk by chunk; other values by repr): equal exactly when nothing in it changed,
    collisions aside, which a program cannot make at will (a cryptographic hash). Faster than
    `output_digest` (no NaN or -0.0 folding: a NaN's payload or a zero's sign rewritten is a
    change), for the worker's checks that an input or an output was not written. BLAKE3 on one
    thread, not SHA-256: every correctness run reads its inputs and outputs twice this way, and
    every spot check its inputs (4.7 against 1.8 GB/s on a 2-core machine with SHA instructions:
    benchmarks/worker_costs.py)."""
    h = blake3()  # one thread: a pool of hashing threads would be a thread rise in the worker
    for x in flatten(a):
        if not isinstance(x, torch.Tensor):
            h.update(f"V{x!r};".encode())
            continue
        h.update(f"T{tuple(x.shape)}{x.dtype};".encode())
        if x.is_contiguous():
            flat = x.detach().reshape(-1)
            parts = (flat[i:i + _CHUNK] for i in range(0, flat.numel(), _CHUNK))
        else:  # rows at a time, each made contiguous: never a whole copy
            rows = max(1, _CHUNK // max(1, x[0].numel())) if x.dim() else 1
            parts = (x.detach()[i:i + rows].contiguous().reshape(-1) for i in range(0, x.shape[0], rows))
        for part in parts:
            h.update(part.cpu().view(torch.uint8).numpy().data)
    return h.hexdigest()
