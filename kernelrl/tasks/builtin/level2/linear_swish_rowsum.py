"""Linear, SiLU (swish), then a scaled row sum: out[b] = 0.5 * sum_j silu(x @ W.T + b)[b, j].

The reduction over output features lets a kernel avoid materialising the activation matrix.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * F.silu(self.linear(x)).sum(dim=1)


batch_size = 16384
in_features = 2048
out_features = 2048


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
