"""The indexer's top-k as an op of its own, the oracle: per query row, the k highest logits of
the row's window, in the three forms engines call it (FlashInfer's flashinfer/topk.py names).

Inputs (as the lightning indexer leaves them, reference/indexer.py):
    logits      (rows, width) fp32; row i's keys are columns [row_starts[i], row_starts[i] +
                lengths[i]); whatever lies outside that window is never picked (the indexer
                writes -inf there)
    lengths     (rows,) the keys row i sees
    row_starts  (rows,) where row i's window starts (None: 0), DeepGEMM's ks

The selection ("local" indices, relative to the row's start): the k highest logits of the
window, descending, -1 where the window holds fewer than k finite logits. A -inf logit inside
the window is never picked. Ties are broken arbitrarily (torch.topk): judge by the scores the
picks select (dsv4bench/measure/topk.py), never by index sets.

Forms (what the op returns, (rows, k) int32, -1 padded):
    plain       column indices into the logits row: local + row_starts (FlashInfer `top_k`,
                torch.topk; what the indexer op itself returns)
    page_table  global cache slots: position p = local of the row's request (row_to_batch[i])
                goes to block_table[req, p // page_size] * page_size + p % page_size
                (FlashInfer `top_k_page_table_transform`, page_table_row_starts 0)
    ragged      local + offsets[i]: positions in a ragged key buffer where the row's request
                starts at offsets[i] (FlashInfer `top_k_ragged_transform`, sglang NSA prefill)
"""

from __future__ import annotations

import torch

from reference.indexer import topk_indices
from reference.indices import to_global_slots

FORMS = ("plain", "page_table", "ragged")
BLOCK_BYTES = 256 * 2**20  # fp32 working set of one block of masked rows


def local_topk(
    logits: torch.Tensor,
    lengths: torch.Tensor,
    k: int,
    row_starts: torch.Tensor | None = None,
    *,
    block_bytes: int = BLOCK_BYTES,
) -> torch.Tensor:
    """(rows, k) int32 indices relative to each row's start, descending by logit, -1 padded."""
    rows, width = logits.shape
    if lengths.shape != (rows,):
        raise ValueError(f"lengths must be ({rows},), got {tuple(lengths.shape)}")
    starts = torch.zeros_like(lengths) if row_starts is None else row_starts
    if starts.shape != (rows,):
        raise ValueError(f"row_starts must be ({rows},), got {tuple(starts.shape)}")
    out = torch.full((rows, k), -1, dtype=torch.int32, device=logits.device)
    cols = torch.arange(width, device=logits.device)
    step = max(1, block_bytes // max(1, 4 * width))
    for r in range(0, rows, step):
        lo = starts[r : r + step].long()[:, None]
        hi = lo + lengths[r : r + step].long()[:, None]
        block = logits[r : r + step].float()
        inside = (cols[None, :] >= lo) & (cols[None, :] < hi)
        picks = topk_indices(block.masked_fill(~inside, float("-inf")), k).long()
        out[r : r + step] = torch.where(picks >= 0, picks - lo, -1).to(torch.int32)
    return out


def plain(local: torch.Tensor, row_starts: torch.Tensor | None = None) -> torch.Tensor:
    """Column indices of the logits rows."""
    if row_starts is None:
        return local
    return _offset(local, row_starts)


def page_table(
    local: torch.Tensor, block_table: torch.Tensor, page_size: int, row_to_batch: torch.Tensor
) -> torch.Tensor:
    """Global cache slots through the block table of each row's request."""
    table = block_table[row_to_batch.long()]
    return to_global_slots(local[:, None, :], table, page_size)[:, 0]


def ragged(local: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Positions in a ragged key buffer: local + offsets[row]."""
    return _offset(local, offsets)


def _offset(local: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    shifted = local.long() + start.long()[:, None]
    return torch.where(local >= 0, shifted, -1).to(local.dtype)


def select(x: dict, k: int, form: str, page_size: int = 1) -> torch.Tensor:
    """The op's answer for inputs `x` (dsv4bench/cases/topk_case.py names them): logits,
    lengths, row_starts; block_table and row_to_batch (page_table); offsets (ragged)."""
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    local = local_topk(x["logits"], x["lengths"], k, x.get("row_starts"))
    if form == "plain":
        return plain(local, x.get("row_starts"))
    if form == "page_table":
        return page_table(local, x["block_table"], page_size, x["row_to_batch"])
    return ragged(local, x["offsets"])
