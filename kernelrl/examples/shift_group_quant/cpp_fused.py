"""Shift-scaled group quantisation in one C++ pass per group: max |g|, the power-of-two scale from
frexp (exact, no log2), multiplication by the exact power-of-two reciprocal, round-half-to-even
(matching torch.round) by adding and subtracting 1.5 * 2^23, clamp and dequantise; groups split
across threads. The reference makes about ten passes over the tensor."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CPP = r"""
#include <torch/extension.h>
#include <algorithm>
#include <cmath>

constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23

torch::Tensor shift_group_quant(torch::Tensor grad, int64_t group_size, int64_t bits) {
    TORCH_CHECK(grad.scalar_type() == torch::kFloat, "shift_group_quant expects float32");
    TORCH_CHECK(grad.size(-1) % group_size == 0, "the last dimension must be a multiple of group_size");
    auto g = grad.contiguous();
    auto out = torch::empty_like(g);
    const float* in = g.data_ptr<float>();
    float* o = out.data_ptr<float>();
    const int64_t groups = g.numel() / group_size;
    const float qmax = static_cast<float>((1 << (bits - 1)) - 1);
    const float qmin = -qmax - 1.0f;
    at::parallel_for(0, groups, 64, [&](int64_t begin, int64_t end) {
        for (int64_t k = begin; k < end; ++k) {
            const float* x = in + k * group_size;
            float* y = o + k * group_size;
            float amax = 0.f;
            for (int64_t j = 0; j < group_size; ++j) amax = std::max(amax, std::fabs(x[j]));
            int e = 0;
            std::frexp(amax, &e);  // amax = m * 2^e, m in [0.5, 1); e = 0 for amax == 0
            const int shift = e - static_cast<int>(bits - 1);
            const float scale = std::ldexp(1.0f, shift);
            if (shift < -100) {
                // 1 / scale would overflow float: divide (exact for a power of two), round with nearbyint
                for (int64_t j = 0; j < group_size; ++j) {
                    y[j] = std::min(std::max(std::nearbyint(x[j] / scale), qmin), qmax) * scale;
                }
                continue;
            }
            const float inv = std::ldexp(1.0f, -shift);  // exact reciprocal of a power of two
            for (int64_t j = 0; j < group_size; ++j) {
                // |x * inv| < 2^bits, so adding and removing 1.5 * 2^23 rounds to the nearest
                // integer, ties to even (the default rounding mode), in two vectorisable adds;
                // exact without -ffast-math, which this build does not use.
                const float v = x[j] * inv;
                const float r = (v + kMagic) - kMagic;
                y[j] = std::min(std::max(r, qmin), qmax) * scale;
            }
        }
    });
    return out;
}
"""

_ext = load_inline(name="kernelrl_example_shift_quant_cpp_v2", cpp_sources=[_CPP], functions=["shift_group_quant"],
                   extra_cflags=["-O3", "-fopenmp"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, group_size: int, bits: int):
        super().__init__()
        self.group_size = group_size
        self.bits = bits

    def forward(self, grad: torch.Tensor) -> torch.Tensor:
        return _ext.shift_group_quant(grad, self.group_size, self.bits)
