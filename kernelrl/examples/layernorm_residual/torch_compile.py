"""torch.compile rewrite: the residual add and the layer norm compile into one fused kernel
(one read of each input, one write), instead of materialising x + branch first."""

import torch
import torch.nn as nn
import torch.nn.functional as F


def _add_norm(x, branch, weight, bias, eps: float):
    return F.layer_norm(x + branch, weight.shape, weight, bias, eps)


_compiled = torch.compile(_add_norm, dynamic=False)


class ModelNew(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        with torch.no_grad():
            self.norm.weight.copy_(1.0 + 0.2 * torch.randn(hidden))
            self.norm.bias.copy_(0.1 * torch.randn(hidden))

    def forward(self, x: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
        return _compiled(x, branch, self.norm.weight, self.norm.bias, self.norm.eps)
