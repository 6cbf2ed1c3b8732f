"""Linear layer with a sparse fine-tuning delta: y = x @ (W + Delta)^T + b.

Definition. W (out, in) is the frozen pretrained weight; Delta is zero except at `nnz` fixed
positions (flat indices into W, chosen once at construction), where it holds trainable values.
This is the forward of sparse fine-tuning methods that update a small subset of weights.
Densifying Delta on every call is the obvious implementation; a fast one computes
x @ W^T and adds the sparse contribution, or merges in place of a copy.

The indices are a buffer built from the construction-time random generator, so a candidate
constructed under the same seed sees the same positions.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int, nnz: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(out_features, in_features) / in_features ** 0.5)
        self.bias = nn.Parameter(0.1 * torch.randn(out_features))
        self.register_buffer("delta_index", torch.randperm(out_features * in_features)[:nnz])
        self.delta_value = nn.Parameter(0.1 * torch.randn(nnz))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight.reshape(-1).index_add(0, self.delta_index, self.delta_value)
        return F.linear(x, w.view_as(self.weight), self.bias)


batch_size = 8192
in_features = 4096
out_features = 4096
nnz = 167772


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, nnz]
