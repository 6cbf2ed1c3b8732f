"""Sum over the middle dimension of a 3-D tensor: out[b, n] = sum_r x[b, r, n]. Strided reduction."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x, dim=self.dim)


batch_size = 64
reduce_len = 4096
inner = 1024


def get_inputs():
    return [torch.randn(batch_size, reduce_len, inner)]


def get_init_inputs():
    return [1]
