"""RMSNorm as one Triton program per row: the row is loaded once into registers, reduced, scaled
by rsqrt(mean square + eps) and the weight, and stored (one read and one write of the data)."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_row(x_ptr, w_ptr, y_ptr, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * n_cols + offs, mask=mask, other=0.0).to(tl.float32)
    mean_sq = tl.sum(x * x, axis=0) / n_cols
    inv = 1.0 / tl.sqrt(mean_sq + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    tl.store(y_ptr + row * n_cols + offs, x * inv * w, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(1.0 + 0.2 * torch.randn(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xc = x.contiguous()
        cols = xc.shape[-1]
        rows = xc.numel() // cols
        y = torch.empty_like(xc)
        block = triton.next_power_of_2(cols)
        warps = 4 if block <= 1024 else (8 if block <= 4096 else 16)
        _rmsnorm_row[(rows,)](xc, self.weight, y, cols, self.eps, BLOCK=block, num_warps=warps)
        return y
