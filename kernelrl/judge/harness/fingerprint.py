"""Fingerprints read where the data lives: a keyed digest computed on the tensors' own device,
and a byte-for-byte comparison of values on a device with their host copies.

`keyed_digest(values, key)` is what two workers give the judge so that it can tell whether the
same inputs came back the same from both (a spot check, `kernelrl.judge.timing.timer`): only a few
numbers per 32 MiB leave the device, so a 6 GiB input costs milliseconds on a GPU instead of a
copy to the host and a hash on one thread. `same_bytes(a, b)` is a worker's own check that its
device copy of a value still holds what it was given (a correctness run, `kernelrl.judge.harness.worker`).

Guarantees:
- `keyed_digest` is a two-level multilinear hash, two lanes, over each tensor's bytes read as
  little 32-bit words, cut into 32 MiB segments (the same cut for a contiguous tensor and a
  strided one with the same values): for any two values that differ in a byte, a shape or a
  dtype, chosen without knowing `key`, the digests are equal with probability at most 2^-62
  over the key (per lane and level at most 2^-32, since a word's difference has at most 31
  factors of two); the same values under the same key give the same digest on any device;
- `same_bytes` compares raw bytes (a NaN's payload, a zero's sign) a segment at a time: the
  worker's extra memory is one segment per side, not a copy of the value.

Does not hold against a program that knows the key before it writes: the judge draws a fresh key
after the program's calls have returned, and only then asks for the digest (`protocol.Output`).
Values that are not tensors enter by `repr`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import numpy as np
import torch

from kernelrl.judge.harness.compare import flatten

__all__ = ["keyed_digest", "same_bytes"]

_WORD = 4  # bytes
_BLOCK = 4096  # words per first-level block
_SEGMENT = 32 << 20  # bytes per segment: a multiple of _BLOCK words
_LANES = 2
_LOW = 0xFFFFFFFF


def _tables(key: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The key's two weight tables, the same on every device (drawn on the host, then moved)."""
    rng = np.random.Generator(np.random.PCG64(key))
    blocks = _SEGMENT // _WORD // _BLOCK
    first = rng.integers(0, 1 << 64, size=(_LANES, _BLOCK), dtype=np.uint64).view(np.int64)
    second = rng.integers(0, 1 << 64, size=(_LANES, 2 * blocks), dtype=np.uint64).view(np.int64)
    return torch.from_numpy(first).to(device), torch.from_numpy(second).to(device)


def _segments(x: torch.Tensor) -> Iterator[torch.Tensor]:
    """`x`'s bytes in row-major order as flat uint8 tensors of `_SEGMENT` bytes (the last one
    shorter): slices of `x` where it is contiguous, a staging buffer on its device where not."""
    if x.is_contiguous():
        flat = x.detach().reshape(-1).view(torch.uint8)
        for start in range(0, flat.numel(), _SEGMENT):
            yield flat[start:start + _SEGMENT]
        return
    staging = torch.empty(_SEGMENT, dtype=torch.uint8, device=x.device)
    fill = 0
    for piece in _pieces(x.detach()):
        data = piece.reshape(-1).view(torch.uint8)
        while data.numel():
            take = min(_SEGMENT - fill, data.numel())
            staging[fill:fill + take].copy_(data[:take])
            fill, data = fill + take, data[take:]
            if fill == _SEGMENT:
                yield staging
                fill = 0
    if fill:
        yield staging[:fill]


def _pieces(x: torch.Tensor) -> Iterator[torch.Tensor]:
    """`x` as contiguous pieces in row-major order, each at most a segment where a row allows."""
    if x.is_contiguous() or x.dim() <= 1:
        yield x.contiguous()
        return
    row = x[0].numel() * x.element_size()
    if row > _SEGMENT:  # a row larger than a segment: its own rows, one at a time
        for i in range(x.shape[0]):
            yield from _pieces(x[i])
        return
    rows = max(1, _SEGMENT // max(1, row))
    for i in range(0, x.shape[0], rows):
        yield x[i:i + rows].contiguous()


def _segment_hash(data: torch.Tensor, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """One segment's two lanes (int64, arithmetic modulo 2^64)."""
    if data.numel() % _WORD:
        data = torch.cat([data, data.new_zeros(_WORD - data.numel() % _WORD)])
    words = data.view(torch.int32).to(torch.int64) & _LOW  # unsigned 32-bit words
    full, tail = divmod(words.numel(), _BLOCK)
    blocks = []
    if full:
        body = words[:full * _BLOCK].view(full, _BLOCK)
        blocks.append(torch.stack([(body * first[lane]).sum(dim=1) for lane in range(_LANES)]))
    if tail:
        rest = words[full * _BLOCK:]
        blocks.append(torch.stack([(rest * first[lane, :tail]).sum().reshape(1) for lane in range(_LANES)]))
    if not blocks:
        return torch.zeros(_LANES, dtype=torch.int64, device=data.device)
    sums = torch.cat(blocks, dim=1)  # (lanes, blocks): each block's first-level hash
    # The second level takes each block hash as two 32-bit halves, so that a difference in any
    # half is bounded as a word's is.
    halves = torch.cat([sums & _LOW, (sums >> 32) & _LOW], dim=1)
    return (halves * second[:, :halves.shape[1]]).sum(dim=1)


def keyed_digest(values: object, key: int) -> str:
    """The digest of a nested value under `key` (see the module's guarantees)."""
    h = hashlib.sha256(usedforsecurity=False)
    tables: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
    for x in flatten(values):
        if not isinstance(x, torch.Tensor):
            h.update(f"V{x!r};".encode())
            continue
        h.update(f"T{tuple(x.shape)}{x.dtype};".encode())
        if x.device not in tables:
            tables[x.device] = _tables(key, x.device)
        first, second = tables[x.device]
        lanes = [_segment_hash(seg, first, second) for seg in _segments(x)]
        if lanes:  # one transfer per tensor: a few numbers per segment
            h.update(torch.stack(lanes).cpu().numpy().tobytes())
    return h.hexdigest()


def same_bytes(a: object, b: object) -> bool:
    """Whether two nested values hold the same structure, shapes, dtypes and bytes (`b` may be
    on another device than `a`: each segment of `a` is brought to `b`'s device to compare)."""
    xs, ys = flatten(a), flatten(b)
    if len(xs) != len(ys):
        return False
    for x, y in zip(xs, ys, strict=True):
        if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
            if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor) or repr(x) != repr(y):
                return False
            continue
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        for sx, sy in zip(_segments(x), _segments(y), strict=True):
            if not torch.equal(sx.to(sy.device), sy):
                return False
    return True
