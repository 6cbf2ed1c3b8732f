"""L1-norm batch normalisation (training-mode statistics) for NCHW activations.

Definition, per channel c over the batch and spatial positions (N, H, W):

    mu_c  = mean(x[:, c])
    d_c   = mean(|x[:, c] - mu_c|)                 (mean absolute deviation, the L1 "norm")
    y     = weight_c * (x - mu_c) / (sqrt(pi / 2) * d_c + eps) + bias_c

sqrt(pi/2) * d equals the standard deviation for Gaussian data, so the layer is a drop-in for
batch norm that needs no squares or square roots of sums, which is why it suits low-precision
training. Statistics come from the current batch (no running averages), so the output is a
deterministic function of the input. Two reductions over N*H*W per channel; the second depends
on the first.
"""

import math

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, channels: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(1.0 + 0.2 * torch.randn(channels))
        self.bias = nn.Parameter(0.1 * torch.randn(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mu = x.mean(dim=(0, 2, 3), keepdim=True)
        centred = x - mu
        mad = centred.abs().mean(dim=(0, 2, 3), keepdim=True)
        y = centred / (math.sqrt(math.pi / 2) * mad + self.eps)
        return y * self.weight.view(1, -1, 1, 1) + self.bias.view(1, -1, 1, 1)


batch_size = 64
channels = 256
height = 56
width = 56


def get_inputs():
    # Per-channel offsets and spreads, as in real activations.
    shift = torch.randn(1, channels, 1, 1)
    spread = 0.5 + torch.rand(1, channels, 1, 1)
    return [torch.randn(batch_size, channels, height, width) * spread + shift]


def get_init_inputs():
    return [channels, 1e-5]
