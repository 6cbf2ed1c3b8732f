"""Row softmax in C++: per row a max pass, one pass computing exp (an inlined polynomial, so the
compiler may vectorise the loop) and eight partial sums, and a scaling pass; rows split across
threads. Correct, but at the portable -O3 baseline (SSE2) it is slower than torch's softmax, which
dispatches to AVX2/AVX-512 at run time: a realistic candidate that is right and not faster.

`-fopenmp` is needed for `at::parallel_for` to run in parallel: the loop is an OpenMP pragma in
ATen's header, which a build without the flag compiles as a serial loop."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CPP = r"""
#include <torch/extension.h>
#include <cstdint>
#include <cstring>

namespace {

constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: (v + kMagic) - kMagic rounds v to an integer

// exp(x) for x <= 0 in plain arithmetic (no libm call), so the row loop vectorises under -O3:
// x = n ln2 + r with |r| <= ln2 / 2, exp(r) by its Taylor series to r^7 (relative error < 1e-7),
// 2^n by writing the exponent bits. ln2 is split in two so that n * ln2 is exact enough.
inline float exp_nonpositive(float x) {
    x = x < -87.0f ? -87.0f : x;  // exp(-87) ~ 1.6e-38: below that the result is 0 for a softmax
    const float n = (x * 1.44269504088896341f + kMagic) - kMagic;
    const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
    float two_n;
    std::memcpy(&two_n, &bits, sizeof two_n);
    return p * two_n;
}

}  // namespace

torch::Tensor softmax_lastdim(torch::Tensor x) {
    TORCH_CHECK(x.scalar_type() == torch::kFloat, "softmax_lastdim expects float32");
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    const int64_t cols = xc.size(-1);
    const int64_t rows = xc.numel() / cols;
    const float* in = xc.data_ptr<float>();
    float* o = out.data_ptr<float>();
    at::parallel_for(0, rows, 8, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
            const float* xr = in + r * cols;
            float* orow = o + r * cols;
            float m = xr[0];
            for (int64_t j = 1; j < cols; ++j) m = xr[j] > m ? xr[j] : m;
            // eight partial sums: a float reduction the compiler may vectorise without reassociating
            float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
            int64_t j = 0;
            for (; j + 8 <= cols; j += 8) {
                for (int k = 0; k < 8; ++k) {
                    const float e = exp_nonpositive(xr[j + k] - m);
                    orow[j + k] = e;
                    acc[k] += e;
                }
            }
            for (; j < cols; ++j) {
                const float e = exp_nonpositive(xr[j] - m);
                orow[j] = e;
                acc[0] += e;
            }
            const float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
            const float inv = 1.0f / s;
            for (int64_t k = 0; k < cols; ++k) orow[k] *= inv;
        }
    });
    return out;
}
"""

_ext = load_inline(name="kernelrl_example_softmax_cpp_v2", cpp_sources=[_CPP], functions=["softmax_lastdim"],
                   extra_cflags=["-O3", "-fopenmp"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.softmax_lastdim(x)
