"""Decode context parallel (DCP): a request's KV cache dealt over `dcp_size` ranks, and the
top-k each rank's attention reads of it.

Sources (vLLM 0.33.0): vllm/v1/attention/backends/mla/sparse_utils.py
(`triton_filter_and_convert_dcp_index`, the DCP de-interleave in
`sparse_mla_index_remap_kernel`), flashmla_sparse.py (`_forward_fp8_kv_mixed_batch`: the
indexer emits request-global token positions; each rank keeps its own and maps them to its
cache slots, compact_valid_to_front=False, so the other ranks' entries stay -1 in place;
sparse_mla_attention.py's SparseMLACommonImpl.forward_mqa, the FlashAttn/FlashInfer sparse
backends' path: return_valid_counts=True with the default compaction, `compact` below).

The deal: a request's tokens go to the ranks in groups of `interleave` consecutive tokens,
round-robin (group g to rank g % dcp_size). A rank stores its tokens in order, so token p of
the request is token `local_position(p)` of its owner's shard, and the rank's block table maps
shard positions to its pages (width cdiv(max_model_len, page_size * dcp_size)).

Conventions as reference/indices.py: a negative index is invalid and every invalid entry is
-1; a slot is `page * page_size + offset`; outputs keep the index dtype.
"""

from __future__ import annotations

import torch


def check(dcp_size: int, dcp_rank: int, interleave: int, page_size: int) -> None:
    """The engine's DCP configuration rules (vLLM asserts them; VllmConfig enforces the
    interleave one: a group never straddles a page)."""
    if dcp_size < 1 or not 0 <= dcp_rank < dcp_size:
        raise ValueError(f"expected 0 <= dcp_rank < dcp_size, got rank {dcp_rank} of {dcp_size}")
    if interleave < 1 or page_size % interleave:
        raise ValueError(f"interleave {interleave} must divide page_size {page_size}")


def owner(pos: torch.Tensor, dcp_size: int, interleave: int) -> torch.Tensor:
    """The rank holding request position `pos` (pos >= 0)."""
    return torch.div(pos, interleave, rounding_mode="floor") % dcp_size


def local_position(pos: torch.Tensor, dcp_size: int, interleave: int) -> torch.Tensor:
    """Where request position `pos` (pos >= 0) sits in its owner's shard."""
    rounds = torch.div(pos, dcp_size * interleave, rounding_mode="floor")
    return rounds * interleave + pos % interleave


def shard_len(n: int, dcp_size: int, dcp_rank: int, interleave: int) -> int:
    """Tokens of an n-token request that rank `dcp_rank` holds."""
    full, rest = divmod(n, dcp_size * interleave)
    return full * interleave + min(max(rest - dcp_rank * interleave, 0), interleave)


def table_pages(max_model_len: int, page_size: int, dcp_size: int) -> int:
    """Pages of a rank's block table row (vLLM: cdiv(max_model_len, block_size * dcp_size))."""
    return -(-max_model_len // (page_size * dcp_size))


def local_slots(
    idx: torch.Tensor,
    block_table: torch.Tensor,
    page_size: int,
    dcp_size: int,
    dcp_rank: int,
    interleave: int = 1,
) -> torch.Tensor:
    """One rank's view of request-global top-k: its own entries as its cache slots, in place.

    ``idx`` is ``(b, ...)`` request positions (usually ``(b, s_q, topk)``); ``block_table`` is
    the rank's ``(b, pages)``. An entry becomes ``block_table[r, l // P] * P + l % P`` with
    ``l = local_position(i)`` when this rank owns position ``i``; -1 when ``i`` is negative,
    another rank owns it, its shard page is past the table, or the table entry is negative.
    With dcp_size 1 this is indices.to_global_slots."""
    check(dcp_size, dcp_rank, interleave, page_size)
    if block_table.dim() != 2 or idx.shape[0] != block_table.shape[0]:
        raise ValueError(
            f"block_table must be (b, pages) with b = idx.shape[0] = {idx.shape[0]}, "
            f"got {tuple(block_table.shape)}"
        )
    b, pages = block_table.shape
    flat = idx.reshape(b, -1).long()
    pos = flat.clamp_min(0)
    local = local_position(pos, dcp_size, interleave)
    block = torch.div(local, page_size, rounding_mode="floor")
    valid = (flat >= 0) & (owner(pos, dcp_size, interleave) == dcp_rank) & (block < pages)
    page = block_table.long().gather(1, torch.where(valid, block, 0))
    valid &= page >= 0
    slots = torch.where(valid, page * page_size + local % page_size, -1)
    return slots.reshape(idx.shape).to(idx.dtype)


def compact(slots: torch.Tensor) -> torch.Tensor:
    """Each row (last dim) with its valid entries moved to the front in their order and -1
    after: what vLLM's compact_valid_to_front call gives where one program holds the row (its
    exclusive prefix sum keeps the order; vLLM promises only the set)."""
    order = torch.sort((slots < 0).to(torch.int8), dim=-1, stable=True).indices
    return slots.gather(-1, order)
