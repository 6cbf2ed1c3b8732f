"""The harness's own copies and reads (kernelrl.judge.values): a timed call's input made a chunk at a
time has the whole-tensor expression's values, and a plain CPU output is read without a copy."""

from __future__ import annotations

import random

import pytest
import torch

from kernelrl.judge import values


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


def test_a_plain_cpu_output_is_read_in_place_and_anything_else_is_copied_or_described():
    out = torch.randn(8)
    assert values.readable(out).data_ptr() == out.data_ptr()
    assert values.to_cpu(out).data_ptr() != out.data_ptr()

    class Lazy(torch.Tensor):
        pass

    lazy = torch.randn(4).as_subclass(Lazy)
    assert values.readable(lazy) == {"not_plain_tensor": f"{__name__}.{Lazy.__qualname__}"}
