"""Explicit heat-equation steps with a 7-point 3-D Laplacian stencil and zero (Dirichlet) boundary.

Definition, for `steps` steps on a (B, X, Y, Z) grid, values outside the grid being 0:

    lap(u)[i,j,k] = u[i-1,j,k] + u[i+1,j,k] + u[i,j-1,k] + u[i,j+1,k] + u[i,j,k-1] + u[i,j,k+1] - 6 u[i,j,k]
    u <- u + alpha * lap(u)

alpha = 0.1 < 1/6 keeps the scheme stable. Several steps make temporal blocking (fusing steps
in on-chip memory) worthwhile; each step is memory bound on its own.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, steps: int, alpha: float):
        super().__init__()
        self.steps = steps
        self.alpha = alpha

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        for _ in range(self.steps):
            p = F.pad(u, (1, 1, 1, 1, 1, 1))
            lap = (p[:, :-2, 1:-1, 1:-1] + p[:, 2:, 1:-1, 1:-1]
                   + p[:, 1:-1, :-2, 1:-1] + p[:, 1:-1, 2:, 1:-1]
                   + p[:, 1:-1, 1:-1, :-2] + p[:, 1:-1, 1:-1, 2:]
                   - 6.0 * u)
            u = u + self.alpha * lap
        return u


batch_size = 4
size_x = 256
size_y = 256
size_z = 256
steps = 4


def get_inputs():
    return [torch.randn(batch_size, size_x, size_y, size_z)]


def get_init_inputs():
    return [steps, 0.1]
