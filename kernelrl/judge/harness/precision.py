"""The judge's fp32 precision: one setting for every worker of an evaluation, set before any code runs;
and the global settings a worker reports (`global_state`).

`set_precision(allow_tf32)` runs in each worker before the task's or the program's code (the task's
reference, its timed copy, the compiled reference and every candidate alike), from
`EvalConfig.allow_tf32`. Default: exact fp32 (cuBLAS matmuls and cuDNN convolutions without TF32,
`float32_matmul_precision` "highest"); allowed: TF32 in both, precision "high". torch's own defaults
differ between the two (cuDNN convolutions default to TF32): left to them, an exact-fp32 custom
convolution would be compared with a TF32 reference and judged wrong, and a candidate's layout
rewrite would change which precision it gets. `PRECISION_FLAGS` are the `global_state` keys
recorded in every result (`MachineRecord.precision`, as the reference's worker had them).

Guarantees: the flags are the same in the reference's and every candidate's worker when their code
starts. Not guaranteed: a program may change them afterwards in its own process; that is seen and
reported (`checks.dynamic.global_state_changed`), not prevented. Machine peaks (roofline floors) are
measured at exact fp32 whatever the evaluation allows.
"""

from __future__ import annotations

import torch

from kernelrl.judge.harness.protocol import Setting

__all__ = ["PRECISION_FLAGS", "global_state", "set_precision"]

PRECISION_FLAGS = ("cuda_matmul_allow_tf32", "cudnn_allow_tf32", "float32_matmul_precision")


def set_precision(allow_tf32: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    torch.backends.cudnn.allow_tf32 = allow_tf32
    torch.set_float32_matmul_precision("high" if allow_tf32 else "highest")


def global_state() -> dict[str, Setting]:
    """Settings a program could flip to change precision or parallelism (read in a worker before and
    after a program's code runs; `checks.dynamic.global_state_changed` compares them)."""
    return {
        "num_threads": torch.get_num_threads(),
        "num_interop_threads": torch.get_num_interop_threads(),
        "default_dtype": str(torch.get_default_dtype()),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "grad_enabled": torch.is_grad_enabled(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "mkldnn_enabled": torch.backends.mkldnn.enabled,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cuda_matmul_allow_fp16_reduced_precision": torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "cuda_matmul_allow_bf16_reduced_precision": torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
    }
