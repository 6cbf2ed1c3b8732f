"""Block-sparse attention decoding driven by a per-block gating score (top-k blocks).

Definition. For one decode query per head, the key/value cache (T tokens) is cut into blocks of
`block_size` tokens. Each block gets a gating score, the dot product of the query with the
block's mean key; the `top_k` highest-scoring blocks are selected, and exact softmax attention
runs over the tokens of those blocks only:

    gate[b, h, j] = q[b, h] . mean_t k[b, h, j*block_size + t]
    S = top_k(gate[b, h])
    out[b, h] = softmax over tokens t in blocks S of (q . k_t / sqrt(D)) applied to v_t

The order of the selected blocks does not matter (softmax is permutation invariant).

Tolerance note: the selection is discrete. A kernel computing the gate in another summation
order can swap the k-th and (k+1)-th blocks when their scores are within float32 rounding
(~1e-6 relative). With 16 blocks and gate gaps of order 0.1 this happens about once in 10^5
heads, so a correct kernel is rejected well under 1 % of the time at the small size; the
full size (256 blocks per head, 4096 heads) carries a larger, still small, risk.
"""

import math

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, block_size: int, top_k: int):
        super().__init__()
        self.block_size = block_size
        self.top_k = top_k

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, h, t, d = k.shape
        nb = t // self.block_size
        kb = k.reshape(b, h, nb, self.block_size, d)
        vb = v.reshape(b, h, nb, self.block_size, d)
        gate = torch.einsum("bhd,bhnd->bhn", q, kb.mean(dim=3))
        idx = torch.topk(gate, self.top_k, dim=-1).indices
        gather_idx = idx[..., None, None].expand(b, h, self.top_k, self.block_size, d)
        ks = torch.gather(kb, 2, gather_idx).reshape(b, h, self.top_k * self.block_size, d)
        vs = torch.gather(vb, 2, gather_idx).reshape(b, h, self.top_k * self.block_size, d)
        scores = torch.einsum("bhd,bhtd->bht", q, ks) / math.sqrt(d)
        return torch.einsum("bht,bhtd->bhd", torch.softmax(scores, dim=-1), vs)


batch_size = 8
num_heads = 32
cache_len = 16384
head_dim = 128
block_size = 64
top_k = 16


def get_inputs():
    q = torch.randn(batch_size, num_heads, head_dim)
    k = torch.randn(batch_size, num_heads, cache_len, head_dim)
    v = torch.randn(batch_size, num_heads, cache_len, head_dim)
    return [q, k, v]


def get_init_inputs():
    return [block_size, top_k]
