"""Algebraic rewrite: after the two per-channel statistics, the normalisation and the affine
transform are one per-channel affine map y = x * a_c + b_c with a_c = w_c / (k * mad_c + eps) and
b_c = bias_c - mu_c * a_c, applied in a single addcmul pass instead of three elementwise passes."""

import math

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, channels: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(1.0 + 0.2 * torch.randn(channels))
        self.bias = nn.Parameter(0.1 * torch.randn(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mu = x.mean(dim=(0, 2, 3), keepdim=True)
        mad = (x - mu).abs_().mean(dim=(0, 2, 3), keepdim=True)
        a = self.weight.view(1, -1, 1, 1) / (math.sqrt(math.pi / 2) * mad + self.eps)
        b = self.bias.view(1, -1, 1, 1) - mu * a
        return torch.addcmul(b, x, a)
