"""A plausible bug: the fused rewrite forgets the final scale (output off by a factor of 1.5)."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int, scale: float):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(torch.addmm(self.linear.bias, x, self.linear.weight.t()))
