"""Elementwise GELU (exact, erf form) over a large activation tensor: memory bound."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x)


batch_size = 4096
hidden = 16384


def get_inputs():
    return [torch.randn(batch_size, hidden)]


def get_init_inputs():
    return []
