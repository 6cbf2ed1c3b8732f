"""Inclusive prefix sum along the last dimension (a scan: sequential dependence per row)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x, dim=-1)


rows = 8192
length = 16384


def get_inputs():
    return [torch.randn(rows, length)]


def get_init_inputs():
    return []
