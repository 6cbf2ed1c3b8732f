"""Group-wise integer quantisation of a gradient with power-of-two (shift) scales, dequantised.

Definition. The gradient (rows, cols) is cut into groups of `group_size` consecutive elements of
a row. Per group, with amax = max |g| and amax = m * 2**e (m in [0.5, 1), `torch.frexp`):

    shift = e - (bits - 1);  scale = 2**shift            (so |g| / scale < 2**(bits - 1))
    q     = clamp(round_half_to_even(g / scale), -2**(bits-1), 2**(bits-1) - 1)
    out   = q * scale

The output is the dequantised gradient, the value that a shift-scaled int8 all-reduce would
deliver. A group of zeros gives zeros.

Why correctness checking is meaningful here: every step above is exact in float32. The exponent
comes from frexp (integer arithmetic, no log2 rounding), and dividing or multiplying by a power
of two is exact, so a correct kernel reproduces the output bit for bit, whatever its reduction
order (max is order independent). The one trap is rounding ties: g / scale lands exactly on
k + 0.5 for about one element in 5 * 10^5 with these float32 inputs (measured: one per small-size
input set), and there round-half-to-even (`torch.round`, C `rintf`/`nearbyintf`, CUDA
`__float2int_rn`/`rintf`) and round-half-away (`roundf`) differ by one quantisation step (about
amax / 100) when the even neighbour is the lower one. The task defines half-to-even; a kernel
using `roundf` is wrong by the definition but is caught only on about 40 % of small input sets
(about 90 % of five-set evaluations, more at the full size). Gradients
are drawn with magnitude O(1) (per-row scales in [0.25, 2]) rather than the 1e-3 of real
gradients so that an absolute tolerance of 1e-4 stays far below one quantisation step; the
quantiser commutes with power-of-two rescaling, so nothing is lost by this choice.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, group_size: int, bits: int):
        super().__init__()
        self.group_size = group_size
        self.bits = bits

    def forward(self, grad: torch.Tensor) -> torch.Tensor:
        rows, cols = grad.shape
        g = grad.reshape(rows, cols // self.group_size, self.group_size)
        amax = g.abs().amax(dim=-1, keepdim=True)
        _, exponent = torch.frexp(amax)
        scale = torch.ldexp(torch.ones_like(amax), exponent - (self.bits - 1))
        qmax = 2 ** (self.bits - 1) - 1
        q = torch.clamp(torch.round(g / scale), -qmax - 1, qmax)
        return (q * scale).reshape(rows, cols)


rows = 8192
cols = 8192
group_size = 128
bits = 8


def get_inputs():
    row_scale = 0.25 + 1.75 * torch.rand(rows, 1)
    return [torch.randn(rows, cols) * row_scale]


def get_init_inputs():
    return [group_size, bits]
