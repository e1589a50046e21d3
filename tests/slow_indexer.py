"""An independent, deliberately slow lightning-indexer reference: the check on reference/indexer.

It shares no code with ``reference/``: it parses the paged key cache bytes itself (a block is
``[block_size x D e4m3 | block_size x fp32 scale]``) and loops over (query, key, head) in
float64, following DeepGEMM's tests/test_attention.py definitions. Small shapes only.
"""

from __future__ import annotations

import math
import struct

import torch

from tests.slow_reference import e4m3_value

NEG_INF = -math.inf


def key_token(cache: torch.Tensor, block: int, offset: int) -> list[float]:
    """Token `offset` of cache block `block`, dequantized in float64 from its bytes."""
    _, block_size, _, width = cache.shape
    d = width - 4
    raw = cache[block].contiguous().reshape(-1).tolist()  # the block's bytes in order
    data = raw[offset * d : (offset + 1) * d]
    at = block_size * d + 4 * offset
    scale = struct.unpack("<f", bytes(raw[at : at + 4]))[0]
    return [e4m3_value(b) * scale for b in data]


def _logit(q_row: list[list[float]], w_row: list[float], k: list[float]) -> float:
    total = 0.0
    for h, qh in enumerate(q_row):
        dot = math.fsum(a * b for a, b in zip(qh, k, strict=True))
        total += max(dot, 0.0) * w_row[h]
    return total


def paged_logits(q, cache, weights, context_lens, block_table, max_model_len) -> torch.Tensor:
    """float64 (B * next_n, max_model_len)."""
    b, next_n, _, _ = q.shape
    block_size = cache.shape[1]
    qd, wd = q.double().tolist(), weights.double().tolist()
    out = torch.full((b * next_n, max_model_len), NEG_INF, dtype=torch.float64)
    for i in range(b):
        for j in range(next_n):
            if context_lens.dim() == 2:
                limit = int(context_lens[i, j])
            else:
                ctx = int(context_lens[i])
                limit = min(ctx, ctx - next_n + j + 1)
            row = i * next_n + j
            for p in range(min(limit, max_model_len)):
                blk = int(block_table[i, p // block_size])
                k = key_token(cache, blk, p % block_size)
                out[row, p] = _logit(qd[i][j], wd[row], k)
    return out


def ragged_logits(q, kv, scales, weights, ks, ke) -> torch.Tensor:
    """float64 (S, N) from e4m3 keys (N, D) as bytes and fp32 scales."""
    s_len, n = q.shape[0], kv.shape[0]
    qd, wd = q.double().tolist(), weights.double().tolist()
    raw = kv.view(torch.uint8).tolist()
    sc = scales.double().tolist()
    out = torch.full((s_len, n), NEG_INF, dtype=torch.float64)
    for i in range(s_len):
        for j in range(int(ks[i]), int(ke[i])):
            k = [e4m3_value(b) * sc[j] for b in raw[j]]
            out[i, j] = _logit(qd[i], wd[i], k)
    return out
