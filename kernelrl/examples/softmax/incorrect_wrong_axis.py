"""A plausible bug: softmax over dim 0 instead of the last dimension (same shape, wrong values)."""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=0)
