"""The cache writers' op: bf16 latent + rope rows in, each token's record bytes written at its
slot of a paged FP8 cache (vLLM's `concat_and_cache_mla` with kv_cache_dtype "fp8_ds_mla",
V4's and V4.1's Triton writers, sglang's set_mla_kv_buffer).

`cache_write(kv, slot_mapping, cache, layout=...)` returns a new cache with the given tokens'
records written and every other byte as it was; a slot of -1 is skipped (vLLM's writers return
early on it). The bytes of one token are the layout's own writer's (reference/layouts.py,
layouts_v41.py, layouts_blocks.py) with the scale convention the case names, so a writer and
the readers can never disagree on a record. Where a token's record lies in a page is
`record_views`: one view per part of the record (the token-major layouts: one; V4's
data/scale halves, V4.1's block-split arrangement and the indexer's keys: two).
"""

from __future__ import annotations

import torch

from reference import layouts_blocks, layouts_indexer
from reference.layout_table import layout as layout_entry
from reference.layouts import _cache_bytes, _check_kv, _check_slots, _v4_token_views


def record_views(cache: torch.Tensor, layout: str) -> list[torch.Tensor]:
    """Views (num_pages, page_size, part bytes) of each part of every token's record, in the
    order the layout's record lists them (a token's record is their concatenation)."""
    entry = layout_entry(layout)
    if not entry.fp8:
        raise ValueError(f"layout {layout} has no byte records (a bf16 workspace)")
    if cache.dim() != 4 or cache.shape[-1] != entry.token_bytes:
        raise ValueError(
            f"a {layout} cache is (num_pages, page_size, 1, {entry.token_bytes}), "
            f"got {tuple(cache.shape)}"
        )
    if layout in layouts_blocks.SPLITS:
        return layouts_blocks.record_views(cache, layout)
    if layout == layouts_indexer.LAYOUT:
        return layouts_indexer.record_views(cache)
    if layout == "v4":
        return list(_v4_token_views(_cache_bytes(cache)))
    return [_cache_bytes(cache)[:, :, 0]]


def token_records(cache: torch.Tensor, layout: str) -> torch.Tensor:
    """Every slot's record bytes [num_pages * page_size, token_bytes], in slot order."""
    parts = [v.reshape(-1, v.shape[-1]) for v in record_views(cache, layout)]
    return torch.cat(parts, dim=-1)


def clone_cache(cache: torch.Tensor) -> torch.Tensor:
    """A copy with the same shape, strides and padding bytes (a V4 page's tail included)."""
    storage = cache.untyped_storage()
    flat = torch.empty(0, dtype=cache.dtype, device=cache.device).set_(
        storage, 0, (storage.nbytes() // cache.element_size(),), (1,)
    )
    return torch.as_strided(flat.clone(), cache.shape, cache.stride(), cache.storage_offset())


def encode(kv: torch.Tensor, layout: str, convention: str = "") -> torch.Tensor:
    """The record bytes [N, token_bytes] the layout's writer gives each row of kv [N, d_qk]."""
    entry = layout_entry(layout)
    if not entry.complete or not entry.fp8:
        raise ValueError(f"layout {layout} has no FP8 writer")
    _check_kv(kv, entry.d_qk, f"{layout}: latent then rope")
    one_per_page = entry.writer()(kv, 1, convention or entry.default_convention)
    return token_records(one_per_page, layout)


def cache_write(
    kv: torch.Tensor,
    slot_mapping: torch.Tensor,
    cache: torch.Tensor,
    *,
    layout: str,
    convention: str = "",
) -> torch.Tensor:
    """A copy of `cache` with row i of kv [N, d_qk] written at slot_mapping[i] (-1: skipped).

    kv is the latent then the rope (vLLM's kv_c and k_pe side by side), any float dtype; a slot
    may appear once only (two writes of one slot race in every engine's writer)."""
    if slot_mapping.dim() != 1 or slot_mapping.shape[0] != kv.shape[0]:
        raise ValueError(
            f"slot_mapping must be ({kv.shape[0]},) (one slot per kv row), "
            f"got {tuple(slot_mapping.shape)}"
        )
    out = clone_cache(cache)
    views = record_views(out, layout)
    keep = slot_mapping >= 0
    num_pages, page_size = cache.shape[:2]
    slots = _check_slots(slot_mapping[keep], num_pages * page_size, cache.device)
    if slots.unique().numel() != slots.numel():
        raise ValueError("slot_mapping names a slot twice")
    if not slots.numel():
        return out
    records = encode(kv[keep.to(kv.device)], layout, convention).to(cache.device)
    page, offset = slots // page_size, slots % page_size
    start = 0
    for view in views:
        width = view.shape[-1]
        view[page, offset] = records[:, start : start + width]
        start += width
    return out
