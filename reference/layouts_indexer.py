"""The lightning indexer's paged FP8 key cache as a cache layout ("indexer-fp8"), so the cache
writer and gather ops can be judged on it like the attention caches.

It is the DeepGEMM paged layout reference/indexer.py already reads (`quantize_key_cache`,
`read_blocks`), the one vLLM 0.33.0 allocates for its indexer (kv_cache (num_blocks, 64,
head_dim + 4) uint8) and writes with `_C_cache_ops.indexer_k_quant_and_cache` (csrc
cache_kernels.cu: value at block * stride(0) + offset * head_dim, scale at block * stride(0) +
block_size * head_dim + offset * 4): a page of P tokens holds the P keys' 128 e4m3 bytes
first, then their P fp32 scales; one scale per token (quant_block_size 128 = head_dim).

Scale conventions: "ue8m0" (vLLM on sm90: DeepSeek V3.2's scale_fmt, s = 2 ** ceil(log2(
max(amax, 1e-4) / 448)), stored as fp32) and "raw" (DeepGEMM's kv_cache_cast_to_fp8:
s = max(amax, 1e-4) / 448). A token's record is its 128 data bytes then its 4 scale bytes (the
order cp_gather_indexer_k_quant_cache returns them in: dst_k (T, 128), dst_scale (T, 4)).
"""

from __future__ import annotations

import torch

from reference import indexer, layouts_blocks
from reference.layouts import _check_layout, _check_slots

LAYOUT = "indexer-fp8"
HEAD_DIM = 128
SCALE = indexer.SCALE_BYTES


def quantize_indexer(kv: torch.Tensor, page_size: int, convention: str = "ue8m0"):
    """Keys [N, 128] -> (ceil(N / P), P, 1, 132) uint8 in the indexer's paged layout."""
    if kv.dim() != 2 or kv.shape[1] != HEAD_DIM:
        raise ValueError(f"indexer keys must be [N, {HEAD_DIM}], got {tuple(kv.shape)}")
    return indexer.quantize_key_cache(kv, page_size, convention)


def record_views(cache: torch.Tensor) -> list[torch.Tensor]:
    """[data (num_pages, P, 128), scales (num_pages, P, 4)]: every token's two parts, through the
    page stride stride(0) (the block-split arrangement of layouts_blocks)."""
    return layouts_blocks.split_views(cache, LAYOUT, HEAD_DIM, SCALE)


def records(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """The record bytes [len(slots), 132] (data then scale) of the given slots."""
    num_pages, page_size = cache.shape[:2]
    slots = _check_slots(slots, num_pages * page_size, cache.device)
    data, scales = record_views(cache)
    page, offset = slots // page_size, slots % page_size
    return torch.cat([data[page, offset], scales[page, offset]], -1)


def _decode(rec: torch.Tensor) -> torch.Tensor:
    k = rec[:, :HEAD_DIM].contiguous().view(torch.float8_e4m3fn).float()
    return k * rec[:, HEAD_DIM:].contiguous().view(torch.float32)


def gather_indexer(cache, slots, scale_rounding: str | None = None) -> torch.Tensor:
    """fp32 keys [len(slots), 128] (e4m3 value times its fp32 scale)."""
    return _decode(records(cache, slots))


def dequantize_indexer(cache, *, scale_rounding: str | None = None) -> torch.Tensor:
    _check_layout(cache, LAYOUT, "dequantize_indexer")
    return gather_indexer(cache, torch.arange(cache.shape[0] * cache.shape[1]))


def request_slots(block_table: torch.Tensor, seq_lens: list[int], page_size: int):
    """Slots of positions 0..seq_lens[r]-1 of every request r, requests in order."""
    parts = []
    for r, n in enumerate(seq_lens):
        pos = torch.arange(n, device=block_table.device)
        parts.append(block_table[r].long()[pos // page_size] * page_size + pos % page_size)
    if not parts:
        return torch.zeros(0, dtype=torch.long, device=block_table.device)
    return torch.cat(parts)


def gather_requests(cache, block_table: torch.Tensor, seq_lens: list[int]) -> torch.Tensor:
    """cp_gather_indexer_k_quant_cache's answer: the record bytes [sum(seq_lens), 132] of every
    request's context, request after request (dst_k | dst_scale side by side)."""
    slots = request_slots(block_table, seq_lens, cache.shape[1]).to(cache.device)
    return records(cache, slots)
