"""C++ epilogue fusion: the GEMM with bias goes to addmm, then one threaded loop applies
exact GELU (erf form) and the scale in place, instead of two more passes over the output."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CPP = r"""
#include <torch/extension.h>
#include <cmath>

torch::Tensor linear_gelu_scale(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double scale) {
    TORCH_CHECK(x.scalar_type() == torch::kFloat, "linear_gelu_scale expects float32");
    auto y = at::addmm(bias, x, weight.t()).contiguous();
    float* p = y.data_ptr<float>();
    const float s = static_cast<float>(scale);
    const float inv_sqrt2 = 0.70710678118654752f;
    at::parallel_for(0, y.numel(), 4096, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
            const float v = p[i];
            p[i] = 0.5f * v * (1.0f + std::erf(v * inv_sqrt2)) * s;
        }
    });
    return y;
}
"""

_ext = load_inline(name="kernelrl_example_linear_gelu_cpp", cpp_sources=[_CPP], functions=["linear_gelu_scale"],
                   extra_cflags=["-O3", "-fopenmp"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int, scale: float):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.linear_gelu_scale(x, self.linear.weight, self.linear.bias, self.scale)
