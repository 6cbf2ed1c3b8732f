"""Memory-format rewrite: batch norm folded into the convolution (as in torch_rewrite.py) and the
convolution run in channels_last layout, which oneDNN and cuDNN handle faster for this shape; the
result is returned in the reference's (contiguous NCHW) layout."""

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
        w = (self.conv.weight * g.view(-1, 1, 1, 1)).contiguous(memory_format=torch.channels_last)
        b = self.bn_bias - self.running_mean * g
        y = F.conv2d(x.contiguous(memory_format=torch.channels_last), w, b, padding=self.conv.padding)
        return F.relu_(y).contiguous()
