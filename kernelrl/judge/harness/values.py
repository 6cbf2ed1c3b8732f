"""How the worker's harness copies, reads and makes values, never running a candidate's code.

A candidate's outputs are read through `torch.Tensor`'s own functions, bound when this module is
imported (the worker imports it before any candidate code runs), never through the object's
attributes: a program cannot run code of its own (deferred work, say) while the harness reads
what it returned, and one that patches torch does not change how its inputs are made.

- `to_cpu`: an output for the judge, plain tensors as CPU copies, anything else described by a
  marker (`not_plain_tensor`, `unsupported_output`) that never crosses the channel as an object;
- `readable`: the same, but a plain CPU tensor as itself (no copy), for the harness to read
  or send at once; `in_place`: a plain tensor on any device as itself, for a fingerprint read a
  chunk at a time (no host copy of a GPU tensor);
- `kept`: a timed call's output as it was when returned (plain tensors copied on their device);
- `own_copy`: a set on a device in storage of its own (the reference's arguments there);
- `all_finite`: no NaN or infinity in a value's floating tensors, read a chunk at a time;
- `perturb(values, scale, offset_frac)`: a moved correctness set, made with one tensor of the
  input's size beside it at a time;
- `pool_noise(pool, seed=, most=)`: a timing pool's noise, one tensor per floating input;
- `stage(x, noise, scale=, shift=, jitter=)`: a timed call's fresh input, `x * scale * (1 +
  jitter * roll(noise, shift))`: new storage and new values for every call, and no multiple of
  any earlier input. Written into one new tensor a chunk of `CHUNK` elements at a time, it takes
  that input and a chunk more, where the whole-tensor expression took two more tensors of its
  size (the rolled noise and the scaled copy): for KernelBench's 6 GiB elementwise inputs, 12 GiB
  of a worker's peak. Its values are the whole-tensor expression's (the same operations on each
  element; tests/judge/harness/test_values.py); a non-contiguous input is made from a contiguous copy and
  laid out with its strides. The noise may be smaller than the input and is then repeated over it
  (the worker's is at most `protocol.POOL_NOISE_ELEMENTS` values per floating input: on an input
  that size or smaller it is the input's own size and the values are the ones above; on a larger
  one it costs 16 MiB of fp32, not a second input).

Does not decide what is compared or timed: the worker and the judge do.
"""


from __future__ import annotations

from collections.abc import Callable

import torch

CHUNK = 1 << 22  # elements: 16 MiB of fp32

_Tensor = torch.Tensor
_empty_like, _addcmul, _mul = torch.empty_like, torch.addcmul, torch.mul
_reshape, _is_contiguous, _numel = _Tensor.reshape, _Tensor.is_contiguous, _Tensor.numel
_detach, _to, _clone_tensor = _Tensor.detach, _Tensor.to, _Tensor.clone
_TENSOR_ATTRS = frozenset(dir(_Tensor))


def each_tensor(x: object, fn: Callable[[torch.Tensor], object]) -> object:
    """`fn` applied to every tensor of a value, a list or a tuple (nested), the rest kept."""
    if isinstance(x, _Tensor):
        return fn(x)
    if isinstance(x, (list, tuple)):
        out = [each_tensor(v, fn) for v in x]
        return tuple(out) if isinstance(x, tuple) else out
    return x


def to_device(x: object, device: str) -> object:
    return each_tensor(x, lambda t: t.to(device))


def clone(x: object) -> object:
    return each_tensor(x, lambda t: t.clone())


def own_copy(values: list[object], device: str) -> list[object]:
    """`values` on `device` in storage of their own: each tensor copied there, one already there
    cloned (a set `get_inputs` made on the device), so a call that writes them leaves `values` as made."""
    def copy(t: torch.Tensor) -> torch.Tensor:
        moved = _to(t, device)
        return _clone_tensor(moved) if moved is t else moved

    return [each_tensor(v, copy) for v in values]


def shadows_tensor(x: object) -> bool:
    """A tensor whose own attributes replace Tensor's (a per-object `detach`, say): not plain."""
    own = getattr(x, "__dict__", None) or {}
    return any(name in _TENSOR_ATTRS for name in own)


def to_cpu(x: object) -> object:
    """An output for the judge: plain tensors become CPU copies; anything else is described."""
    if type(x) is _Tensor and not shadows_tensor(x):
        return _clone_tensor(_to(_detach(x), "cpu"))
    if isinstance(x, (list, tuple)):
        return [to_cpu(v) for v in x]
    if isinstance(x, _Tensor):
        # A subclass (a lazy tensor, say) or a tensor with its own methods never crosses the
        # channel: the judge gets a marker.
        what = type(x).__module__ + "." + type(x).__qualname__
        if type(x) is _Tensor:
            what += " with its own " + ", ".join(sorted(n for n in x.__dict__ if n in _TENSOR_ATTRS))
        return {"not_plain_tensor": what}
    if isinstance(x, (int, float, bool)) or x is None:
        return x
    return {"unsupported_output": type(x).__module__ + "." + type(x).__qualname__}


def readable(x: object) -> object:
    """`x` for the harness to read: a plain CPU tensor as itself (no copy), else as `to_cpu` gives it."""
    if type(x) is _Tensor and not shadows_tensor(x) and x.device.type == "cpu":
        return _detach(x)
    return [readable(v) for v in x] if isinstance(x, (list, tuple)) else to_cpu(x)


def in_place(x: object) -> object:
    """`x` for the harness to fingerprint where it is (`compare.content_digest` reads a chunk at a
    time): a plain tensor on any device as itself, no host copy of a GPU tensor; else as `to_cpu`
    gives it."""
    if type(x) is _Tensor and not shadows_tensor(x):
        return _detach(x)
    return [in_place(v) for v in x] if isinstance(x, (list, tuple)) else to_cpu(x)


def kept(x: object) -> object:
    """A timed call's output as it was when returned: plain tensors copied on their device."""
    if type(x) is _Tensor and not shadows_tensor(x):
        return _clone_tensor(_detach(x))
    return [kept(v) for v in x] if isinstance(x, (list, tuple)) else x


def all_finite(x: object) -> bool:
    """No NaN or infinity in any floating tensor of a value (lists and tuples looked into), read a
    chunk at a time: `torch.isfinite` of a whole tensor takes about twice its size in temporaries."""
    if isinstance(x, _Tensor):
        if not x.is_floating_point():
            return True
        flat = _reshape(x, (-1,)) if _is_contiguous(x) else x.flatten()
        return all(bool(torch.isfinite(flat[i:i + CHUNK]).all()) for i in range(0, _numel(flat), CHUNK))
    if isinstance(x, (list, tuple)):
        return all(all_finite(v) for v in x)
    return True


def perturb(values: list[object], scale: float, offset_frac: float) -> list[object]:
    """A moved input set (the reference worker's): floating inputs become `x * scale + offset_frac *
    mean|x|`; integers and booleans stay. The shift is taken before the scaled copy is made and is
    added into it: a tensor of the input's size more at a time, not two (the same values bitwise)."""
    out: list[object] = []
    for x in values:
        if isinstance(x, _Tensor) and x.is_floating_point() and _numel(x):
            shift = offset_frac * (float(x.abs().mean()) or 1.0)
            out.append(_mul(x, scale).add_(shift))
        else:
            out.append(x)
    return out


def pool_noise(pool: list[list[object]], *, seed: int, most: int) -> list[list[torch.Tensor | None]]:
    """A timing pool's noise for `stage`: one uniform tensor in [-1, 1) per floating input of each
    set (None for the rest), seeded by `seed` and the input's place, of the input's size or `most`
    values when the input is larger (then repeated over it: a large set's noise is not a second set)."""
    noise: list[list[torch.Tensor | None]] = []
    for i, values in enumerate(pool):
        row: list[torch.Tensor | None] = []
        for j, x in enumerate(values):
            if isinstance(x, _Tensor) and x.is_floating_point() and _numel(x):
                g = torch.Generator(device=x.device).manual_seed(seed + 1000 * i + j)
                row.append(torch.rand(min(_numel(x), most), generator=g, device=x.device, dtype=x.dtype).mul_(2).sub_(1))
            else:
                row.append(None)
        noise.append(row)
    return noise


def stage(x: torch.Tensor, noise: torch.Tensor, *, scale: float, shift: int, jitter: float) -> torch.Tensor:
    """`x * scale * (1 + jitter * u)` in new storage, `u[i] = noise[(i - shift) mod m]` over the flat
    (row-major) index of `x`, `m` the noise's size: `roll(noise, shift)` where the noise has the
    input's size, the noise repeated over a larger input (see the module docstring)."""
    value = scale * jitter
    if not _is_contiguous(x):  # made from a contiguous copy, then laid out as `x` is
        return _empty_like(x).copy_(stage(x.contiguous(), noise, scale=scale, shift=shift, jitter=jitter))
    n, m = _numel(x), _numel(noise)
    out = _empty_like(x)
    if not n:
        return out
    if not m:
        raise ValueError("stage: a non-empty input needs noise")
    xf, uf, of = _reshape(x, (-1,)), _reshape(noise.contiguous(), (-1,)), _reshape(out, (-1,))
    s = shift % m
    # A chunk at a time, each cut where the noise wraps round: views only, nothing allocated here
    # but the output (a temporary per chunk would leave holes in a worker's pinned heap).
    for start in range(0, n, CHUNK):
        end = min(n, start + CHUNK)
        while start < end:
            a = (start - s) % m
            stop = min(end, start + m - a)
            part = of[start:stop]
            _mul(xf[start:stop], scale, out=part)
            _addcmul(part, xf[start:stop], uf[a:a + stop - start], value=value, out=part)
            start = stop
    return out
