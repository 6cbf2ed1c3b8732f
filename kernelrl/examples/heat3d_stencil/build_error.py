"""Does not build: a C++ type error (a double* assigned to a float*), the kind of slip a kernel
author makes when switching a buffer's dtype. The evaluator must report compile_error with the
compiler's message."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CPP = r"""
#include <torch/extension.h>

torch::Tensor heat3d(torch::Tensor u0, int64_t steps, double alpha) {
    auto cur = u0.contiguous().clone();
    float* p = cur.data_ptr<double>();
    const int64_t n = cur.numel();
    for (int64_t s = 0; s < steps; ++s) {
        for (int64_t i = 0; i < n; ++i) p[i] = p[i] * static_cast<float>(1.0 - 6.0 * alpha);
    }
    return cur;
}
"""

_ext = load_inline(name="kernelrl_example_heat3d_build_error", cpp_sources=[_CPP], functions=["heat3d"],
                   extra_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, steps: int, alpha: float):
        super().__init__()
        self.steps = steps
        self.alpha = alpha

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return _ext.heat3d(u, self.steps, self.alpha)
