"""Algebraic rewrite: inference batch norm is an affine map per output channel, so it folds into
the convolution's weights and bias (w' = w * g / sqrt(var + eps), b' = beta - mean * g / sqrt(var + eps)).
One convolution with a bias, then an in-place ReLU on its fresh output. Folding happens in every
call from the current parameters (cheap: one small tensor per channel), so it stays exact if the
parameters change. Exact up to float rounding for all inputs."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2, bias=False)
        self.bn_weight = nn.Parameter(1.0 + 0.2 * torch.randn(out_channels))
        self.bn_bias = nn.Parameter(0.1 * torch.randn(out_channels))
        self.register_buffer("running_mean", 0.1 * torch.randn(out_channels))
        self.register_buffer("running_var", 0.5 + torch.rand(out_channels))
        self.eps = 1e-5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self.bn_weight * torch.rsqrt(self.running_var + self.eps)
        w = self.conv.weight * g.view(-1, 1, 1, 1)
        b = self.bn_bias - self.running_mean * g
        return F.relu_(F.conv2d(x, w, b, padding=self.conv.padding))
