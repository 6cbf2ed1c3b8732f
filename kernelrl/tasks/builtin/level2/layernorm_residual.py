"""Post-norm residual: out = LayerNorm(x + dropout_free(branch)), the tail of a transformer sublayer."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        with torch.no_grad():
            self.norm.weight.copy_(1.0 + 0.2 * torch.randn(hidden))
            self.norm.bias.copy_(0.1 * torch.randn(hidden))

    def forward(self, x: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
        return self.norm(x + branch)


batch_size = 16
seq_len = 2048
hidden = 2048


def get_inputs():
    return [torch.randn(batch_size, seq_len, hidden), torch.randn(batch_size, seq_len, hidden)]


def get_init_inputs():
    return [hidden]
