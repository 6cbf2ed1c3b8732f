"""Fingerprints read on a device: the keyed digest and the byte comparison, run here on the CPU
(the same torch operations a GPU runs), against a model of the hash in Python integers."""

from __future__ import annotations

import random

import pytest
import torch

from kernelrl.judge.harness import fingerprint as F

_M = 1 << 64


@pytest.fixture
def small_segments(monkeypatch: pytest.MonkeyPatch) -> int:
    """Segments of 3 blocks (48 KiB), so that small tensors cross segment boundaries."""
    size = 3 * F._BLOCK * F._WORD
    monkeypatch.setattr(F, "_SEGMENT", size)
    return size


def _model(data: bytes, key: int) -> list[int]:
    """The segment hash in Python integers: both levels modulo 2^64, words little-endian."""
    first, second = (t.tolist() for t in F._tables(key, torch.device("cpu")))
    data += b"\0" * (-len(data) % F._WORD)
    words = [int.from_bytes(data[i:i + 4], "little") for i in range(0, len(data), 4)]
    lanes = []
    for lane in range(F._LANES):
        blocks = [sum(w * (first[lane][i % F._BLOCK] % _M) for i, w in enumerate(words[j:j + F._BLOCK], j)) % _M
                  for j in range(0, len(words), F._BLOCK)]
        halves = [b & 0xFFFFFFFF for b in blocks] + [b >> 32 for b in blocks]
        lanes.append(sum(h * (second[lane][i] % _M) for i, h in enumerate(halves)) % _M)
    return lanes


def test_the_segment_hash_is_the_modular_hash_it_claims():
    data = torch.randint(0, 256, (4 * F._BLOCK * 2 + 4 * 37 + 3,), dtype=torch.uint8)  # two blocks, a tail, odd bytes
    first, second = F._tables(7, torch.device("cpu"))
    got = [v % _M for v in F._segment_hash(data, first, second).tolist()]
    assert got == _model(bytes(data.tolist()), 7)


def test_equal_values_give_equal_digests_whatever_their_layout(small_segments: int):
    x = torch.randn(64, 300)  # 75 KiB: two segments
    strided = x.t().contiguous().t()
    assert not strided.is_contiguous()
    assert F.keyed_digest(x, 11) == F.keyed_digest(x.clone(), 11) == F.keyed_digest(strided, 11)


def test_a_row_larger_than_a_segment_is_read_in_order(small_segments: int):
    x = torch.randn(3, 20_000)  # each row 78 KiB, more than a segment
    strided = x.t().contiguous().t()
    assert F.keyed_digest(strided, 5) == F.keyed_digest(x, 5)
    assert F.keyed_digest(strided.flip(0), 5) != F.keyed_digest(x, 5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int8, torch.bool, torch.int64])
def test_any_one_changed_byte_changes_the_digest(dtype: torch.dtype, small_segments: int):
    rng = random.Random(3)
    x = (torch.rand(12_345) * 100).to(dtype)
    raw = x.view(torch.uint8)
    before = F.keyed_digest(x, 99)
    for _ in range(20):
        at, old = rng.randrange(raw.numel()), None
        old = int(raw[at])
        raw[at] = old ^ (1 << rng.randrange(8))
        assert F.keyed_digest(x, 99) != before, (dtype, at)
        raw[at] = old
    assert F.keyed_digest(x, 99) == before


def test_raw_bytes_count_a_nan_payload_and_a_zero_sign():
    x = torch.tensor([0.0, float("nan")])
    other = x.clone()
    other.view(torch.int32)[1] += 1  # another NaN
    assert F.keyed_digest(x, 1) != F.keyed_digest(other, 1)
    assert F.keyed_digest(x, 1) != F.keyed_digest(torch.tensor([-0.0, float("nan")]), 1)
    assert not F.same_bytes(x, other)


def test_shape_dtype_and_the_leaves_enter_the_digest():
    x = torch.arange(12, dtype=torch.int32)
    digests = {F.keyed_digest(v, 4) for v in (x, x.view(3, 4), x.view(torch.float32), [x, 1], [x, 2], [x, x])}
    assert len(digests) == 6


def test_the_digest_depends_on_the_key():
    x = torch.randn(1000)
    assert len({F.keyed_digest(x, k) for k in range(8)}) == 8


def test_same_bytes_compares_every_segment(small_segments: int):
    x = torch.randn(40_000)
    y = x.clone()
    square = x.view(200, 200)
    assert F.same_bytes(x, y) and F.same_bytes([square, 3], [square.t().contiguous().t(), 3])
    y[-1] += 1  # the last segment
    assert not F.same_bytes(x, y)
    assert not F.same_bytes(x, x[:-1]) and not F.same_bytes([x], [x, x]) and not F.same_bytes([x, 3], [x, 4])
