"""Scaled residual add: out = x + alpha * residual, with a per-channel learned gain on the branch."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, hidden: int, alpha: float):
        super().__init__()
        self.alpha = alpha
        self.gain = nn.Parameter(1.0 + 0.1 * torch.randn(hidden))

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return x + self.alpha * (residual * self.gain)


tokens = 16384
hidden = 4096


def get_inputs():
    return [torch.randn(tokens, hidden), torch.randn(tokens, hidden)]


def get_init_inputs():
    return [hidden, 0.5]
