"""Row softmax over the last dimension of a (rows, cols) matrix, numerically stable form."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)


rows = 8192
cols = 8192


def get_inputs():
    # A spread wider than N(0, 1) keeps the softmax far from uniform.
    return [3.0 * torch.randn(rows, cols)]


def get_init_inputs():
    return []
