"""FlashInfer's input forms, built outside the timed call: index tables (valid first, -1
padded, aligned), plain rows of an FP8 cache (bf16 or per-tensor e4m3), caches re-paged into
the sm120 kernels' 64-token pages, and the sm120 lse back in the oracle's convention."""

from __future__ import annotations

import math

from dsv4bench.backends.paged_rows import CONVERT_CHUNK, KV_DTYPES

SWA_WIDTH = 128  # trtllm-gen DSv4: the first 128 index columns are the window (SWA) pool
INDEX_ALIGN = 4  # trtllm-gen loads indices 16 bytes at a time
SM120_PAGE = 64  # the sm120 decode kernels read 64-token pages
# what FlashInfer's tests recommend and vLLM allocates (_WORKSPACE_BYTES), zeroed
WORKSPACE_BYTES = 128 << 20


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def pad_indices(idx, width: int):
    """Pad the last dim of idx with -1 up to exactly `width` (>= its width); int32, contiguous."""
    import torch

    from reference.indices import pad_to

    return pad_to(idx, width).to(torch.int32).contiguous()


def valid_first(idx):
    """Each row's valid (!= -1) indices first, in their order, then -1; and the valid counts.

    Attention is a sum over the key set, so reordering a row keeps the problem; kernels that
    take a length per row then see exactly the valid entries.
    """
    import torch

    invalid = idx == -1
    order = torch.sort(invalid.to(torch.int8), dim=-1, stable=True).indices
    out = idx.gather(-1, order).masked_fill(invalid.gather(-1, order), -1)
    return out.to(torch.int32).contiguous(), (~invalid).sum(-1).to(torch.int32)


def apply_length(idx, length):
    """Indices (b, s_q, k) with entries at or past length[b] (per request) set to -1."""
    if length is None:
        return idx
    import torch

    cols = torch.arange(idx.shape[-1], device=idx.device)
    return idx.masked_fill(cols >= length.to(idx.device).view(-1, 1, 1), -1)


def cache_scale(cache, chunk: int = CONVERT_CHUNK, layout: str | None = None):
    """The per-tensor e4m3 scale of a cache's plain rows (all of d_qk)."""
    from reference import layouts

    width = layouts.head_dim_of(cache, layout)
    return layouts.plain_rows_scale(cache, width=width, chunk=chunk, layout=layout)


def plain_rows(cache, *, dtype: str = "bf16", scale=None, chunk: int = CONVERT_CHUNK, layout=None):
    """FP8 cache -> plain rows [pages, 1, P, d_qk] (all of d_qk: 576 for V3.2, 512 for V4) and
    the e4m3 scale (None for bf16): reference.layouts.to_plain_rows at the full width."""
    from reference import layouts

    if dtype not in KV_DTYPES:
        raise ValueError(f"dtype must be one of {KV_DTYPES}, got {dtype!r}")
    width = layouts.head_dim_of(cache, layout)
    return layouts.to_plain_rows(
        cache, dtype=dtype, width=width, scale=scale, chunk=chunk, layout=layout
    )


def repage_v4(cache, page_size: int = SM120_PAGE):
    """V4 cache in `page_size`-token pages (split_pages_v4); slots and bytes unchanged."""
    from reference import layouts

    if cache.shape[1] == page_size:
        return cache
    return layouts.split_pages_v4(cache, page_size)


def repage_v32(cache, page_size: int = SM120_PAGE):
    """V3.2 cache (token-major 656 B records) viewed in `page_size`-token pages: slot s stays
    slot s; zero records pad the tail to whole pages."""
    import torch

    if cache.shape[1] == page_size:
        return cache
    records = cache.reshape(-1, cache.shape[-1])  # copies only if cache is not contiguous
    tail = round_up(records.shape[0], page_size) - records.shape[0]
    if tail:
        records = torch.cat([records, records.new_zeros(tail, records.shape[1])])
    return records.view(-1, page_size, 1, cache.shape[-1])


def sm120_page_layout(kv) -> tuple[int, int]:
    """(page_block_size, page stride in bytes) as FlashInfer's sm120 binding reads a 4-D NHD
    cache [pages, P, 1, bytes_per_token]: size(1) and stride(0) * element size."""
    if kv.dim() != 4 or kv.shape[2] != 1:
        raise ValueError(f"sm120 caches are [pages, P, 1, bytes], got {tuple(kv.shape)}")
    return int(kv.shape[1]), int(kv.stride(0)) * kv.element_size()


def trtllm_dsv4_indices(window, extra=None):
    """trtllm-gen DSv4 index table from window (T, kw <= 128) and extra (T, ke) slots.

    Returns sparse_indices (T, W): 128 window columns (valid first, -1 padded) then the extra
    entries (valid first), W padded to a multiple of 4; sparse_topk_lens = 128 + extra count;
    seq_lens = window count (the kernel's valid SWA prefix with one query per row).
    """
    import torch

    if window.shape[-1] > SWA_WIDTH:
        raise ValueError(f"the window part has {window.shape[-1]} columns, more than {SWA_WIDTH}")
    w_idx, w_len = valid_first(window)
    if extra is None:
        extra = window.new_empty((window.shape[0], 0))
    e_idx, e_len = valid_first(extra)
    both = torch.cat([pad_indices(w_idx, SWA_WIDTH), e_idx], dim=-1)
    table = pad_indices(both, round_up(both.shape[-1], INDEX_ALIGN))
    return table, (SWA_WIDTH + e_len).to(torch.int32), w_len


def sm120_lse_to_natural(lse2, sink):
    """Kernel lse (base 2, sink merged: log2(sum exp + exp(sink))) -> natural-log lse of the
    keys alone; +inf where no key is valid (the oracle's convention)."""
    import torch

    lse = lse2.float() * math.log(2.0)
    if sink is not None:
        d = sink.float().to(lse.device) - lse  # log(exp(sink) / (sum exp + exp(sink))) < 0
        keys = lse + torch.log(-torch.expm1(d.clamp(max=0)))
        lse = torch.where(d < 0, keys, torch.full_like(lse, math.inf))
    return lse.masked_fill(torch.isneginf(lse) | torch.isnan(lse), math.inf)
