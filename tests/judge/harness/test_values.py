"""The harness's own copies and reads (kernelrl.judge.harness.values): a timed call's input made a chunk at a
time has the whole-tensor expression's values, and a plain CPU output is read without a copy."""

from __future__ import annotations

import random

import pytest
import torch

from kernelrl.judge.harness import values


def whole(x: torch.Tensor, noise: torch.Tensor, scale: float, shift: int, jitter: float) -> torch.Tensor:
    return torch.addcmul(torch.mul(x, scale), x, torch.roll(noise, shift), value=scale * jitter)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_a_staged_input_is_the_whole_tensor_expression_bitwise(monkeypatch, dtype):
    monkeypatch.setattr(values, "CHUNK", 1000)  # chunk edges everywhere, shifts wrapping across them
    rng = random.Random(0)
    for shape in [(1,), (7,), (3, 1001), (4096, 3), (2, 3, 777)]:
        x = torch.randn(shape, dtype=torch.float32).to(dtype)
        noise = (torch.rand(shape) * 2 - 1).to(dtype)
        for _ in range(5):
            scale, shift = rng.uniform(0.5, 2.0), rng.randrange(-30000, 30000)
            got = values.stage(x, noise, scale=scale, shift=shift, jitter=0.1)
            assert torch.equal(got, whole(x, noise, scale, shift, 0.1)), (shape, dtype, shift)
            assert got.data_ptr() not in (x.data_ptr(), noise.data_ptr())  # new storage


def test_a_non_contiguous_input_keeps_its_strides():
    x = torch.randn(64, 32).t()
    noise = torch.rand(32, 64) * 2 - 1
    got = values.stage(x, noise, scale=1.5, shift=17, jitter=0.1)
    assert got.stride() == x.stride() and torch.equal(got, whole(x, noise, 1.5, 17, 0.1))


@pytest.mark.parametrize("chunk", [1000, 64, 7])
def test_noise_smaller_than_the_input_is_repeated_over_it(monkeypatch, chunk):
    # u[i] = noise[(i - shift) mod m]: the input's own roll where m is its size, the noise read
    # round and round over a larger input, whatever the chunk (shorter than the noise or not).
    monkeypatch.setattr(values, "CHUNK", chunk)
    rng = random.Random(1)
    x = torch.randn(3, 1001)
    for m in (1, 5, 64, 1000, 3003):
        noise = torch.rand(m) * 2 - 1
        for _ in range(3):
            scale, shift = rng.uniform(0.5, 2.0), rng.randrange(-30000, 30000)
            index = (torch.arange(x.numel()) - shift) % m
            expected = torch.addcmul(torch.mul(x, scale), x, noise[index].reshape(x.shape), value=scale * 0.1)
            got = values.stage(x, noise, scale=scale, shift=shift, jitter=0.1)
            assert torch.equal(got, expected), (m, shift)


def test_a_plain_cpu_output_is_read_in_place_and_anything_else_is_copied_or_described():
    out = torch.randn(8)
    assert values.readable(out).data_ptr() == out.data_ptr()
    assert values.to_cpu(out).data_ptr() != out.data_ptr()

    class Lazy(torch.Tensor):
        pass

    lazy = torch.randn(4).as_subclass(Lazy)
    assert values.readable(lazy) == {"not_plain_tensor": f"{__name__}.{Lazy.__qualname__}"}
    # for a fingerprint: a plain tensor where it is (on a GPU too: no host copy), anything else described
    assert values.in_place([out])[0].data_ptr() == out.data_ptr()
    assert values.in_place(lazy) == {"not_plain_tensor": f"{__name__}.{Lazy.__qualname__}"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_a_moved_set_is_the_whole_expression_bitwise_and_leaves_the_rest(dtype):
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(1000, generator=g) * 3).to(dtype)
    ints, empty, flag = torch.arange(5), torch.empty(0, dtype=dtype), True
    scale, frac = 1.7, -0.35
    got = values.perturb([x, ints, empty, flag, torch.zeros(4, dtype=dtype)], scale, frac)
    assert torch.equal(got[0], x * scale + frac * float(x.abs().mean())) and got[0].dtype == dtype
    assert got[1] is ints and got[2] is empty and got[3] is flag
    assert torch.equal(got[4], torch.full((4,), frac, dtype=dtype))  # mean|x| of zeros: the shift is frac
    assert not torch.equal(got[0], x)  # new values in new storage; the input is untouched
    assert got[0].data_ptr() != x.data_ptr()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_value_is_found_in_any_chunk_of_any_tensor(monkeypatch, bad):
    monkeypatch.setattr(values, "CHUNK", 16)  # read a chunk at a time: a value past the first chunk counts
    x = torch.randn(16 * 3 + 5)
    assert values.all_finite([x, (torch.arange(4), 2.0)])
    for at in (0, 20, x.numel() - 1):
        y = x.clone()
        y[at] = bad
        assert not values.all_finite([torch.ones(3), (y,)])
        assert not values.all_finite(y.reshape(-1, 1).expand(-1, 2).t())  # not contiguous


def test_a_sets_own_copy_on_a_device_is_new_storage_even_for_a_tensor_already_there():
    # The reference's arguments off the host: a tensor `get_inputs` made on the device itself is
    # cloned, so a reference writing its inputs leaves the set as made (checked here on the CPU,
    # the one device every machine has: there every tensor is "already there").
    made = [torch.randn(8), [torch.randn(3), 2], 5]
    copy = values.own_copy(made, "cpu")
    flat_made = [made[0], made[1][0]]
    flat_copy = [copy[0], copy[1][0]]
    assert all(torch.equal(a, b) and a.data_ptr() != b.data_ptr() for a, b in zip(flat_copy, flat_made))
    assert copy[1][1] == 2 and copy[2] == 5
    before = [t.clone() for t in flat_made]
    for t in flat_copy:
        t.mul_(2)
    assert all(torch.equal(a, b) for a, b in zip(flat_made, before))
