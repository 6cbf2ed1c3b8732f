"""RMSNorm in one C++ pass pair per row: sum of squares, then scale by rsqrt and the weight;
rows split across threads. The reference makes four passes (square, mean, two multiplies)."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CPP = r"""
#include <torch/extension.h>
#include <cmath>

torch::Tensor rmsnorm(torch::Tensor x, torch::Tensor weight, double eps) {
    TORCH_CHECK(x.scalar_type() == torch::kFloat && weight.scalar_type() == torch::kFloat, "rmsnorm expects float32");
    auto xc = x.contiguous();
    auto wc = weight.contiguous();
    auto out = torch::empty_like(xc);
    const int64_t cols = xc.size(-1);
    TORCH_CHECK(wc.numel() == cols, "weight size must match the last dimension");
    const int64_t rows = xc.numel() / cols;
    const float* in = xc.data_ptr<float>();
    const float* w = wc.data_ptr<float>();
    float* o = out.data_ptr<float>();
    at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
            const float* xr = in + r * cols;
            float* orow = o + r * cols;
            float acc = 0.f;
            for (int64_t j = 0; j < cols; ++j) acc += xr[j] * xr[j];
            const float inv = 1.0f / std::sqrt(acc / static_cast<float>(cols) + static_cast<float>(eps));
            for (int64_t j = 0; j < cols; ++j) orow[j] = xr[j] * inv * w[j];
        }
    });
    return out;
}
"""

_ext = load_inline(name="kernelrl_example_rmsnorm_cpp", cpp_sources=[_CPP], functions=["rmsnorm"],
                   extra_cflags=["-O3", "-fopenmp"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(1.0 + 0.2 * torch.randn(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.rmsnorm(x, self.weight, self.eps)
