"""The machine's peaks, measured in a worker: the triad bandwidth and large matmuls' rates.

What the roofline and the prompts' facts divide by (`kernelrl.judge.harness.device.DevicePeaks`). Best of
a few runs each, synchronised and clocked by the worker's own bound functions. Does not model
caches or clocks: a measured best, not a datasheet's figure.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from kernelrl.judge.harness import protocol as P

__all__ = ["machine_peaks"]


def machine_peaks(device: str, sync: Callable[[], None], clock: Callable[[], int]) -> P.Peaks:
    """Best of a few runs: triad bandwidth (a = b + s * c) and large matmuls (fp32, bf16)."""
    n = (64 << 20) // 4 if device == "cpu" else (512 << 20) // 4
    b = torch.rand(n, device=device)
    c = torch.rand(n, device=device)
    a = torch.empty_like(b)
    best = math.inf
    for _ in range(7):
        sync()
        t0 = clock()
        torch.add(b, c, alpha=1.5, out=a)
        sync()
        best = min(best, (clock() - t0) / 1e9)
    bandwidth = 3 * n * 4 / best / 1e9
    del a, b, c

    def matmul_rate(dtype: torch.dtype) -> float | None:
        # bf16 on a CPU without bf16 units runs far slower than fp32: a smaller problem.
        m = (2048 if dtype == torch.float32 else 512) if device == "cpu" else 8192
        try:
            x = torch.randn(m, m, device=device, dtype=dtype)
            y = torch.randn(m, m, device=device, dtype=dtype)
            torch.mm(x, y)  # first call: library setup
            fastest = math.inf
            for _ in range(3):
                sync()
                t0 = clock()
                torch.mm(x, y)
                sync()
                fastest = min(fastest, (clock() - t0) / 1e9)
            return 2 * m ** 3 / fastest / 1e12
        except (RuntimeError, TypeError):
            return None

    fp32 = matmul_rate(torch.float32)
    return P.Peaks(bandwidth_gbs=bandwidth, fp32_tflops=fp32 or 0.0, bf16_tflops=matmul_rate(torch.bfloat16))
