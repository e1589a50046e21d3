"""Index remapping between the index sets engines build and the ones kernels read.

Conventions (docs/kernel-facts.md, index remap):
- A negative index is invalid; every function here writes invalid entries as -1.
- A "local" index is a request-local token position (0 = the request's first token).
- A "slot" is a global cache position ``page * page_size + offset``.
- Outputs keep the integer dtype of the index input.
"""

from __future__ import annotations

import torch

IntOrTensor = int | torch.Tensor


def to_global_slots(local: torch.Tensor, block_table: torch.Tensor, page_size: int) -> torch.Tensor:
    """Map request-local positions to global cache slots through a block table.

    ``local`` is ``(b, ...)`` (usually ``(b, s_q, topk)``), ``block_table`` is
    ``(b, max_blocks)``. ``slot = block_table[r, i // P] * P + i % P``. An invalid
    position, a block index ``>= max_blocks`` or a block table entry ``< 0`` gives -1.
    """
    if block_table.dim() != 2 or local.shape[0] != block_table.shape[0]:
        raise ValueError(
            f"block_table must be (b, max_blocks) with b = local.shape[0] = {local.shape[0]}, "
            f"got {tuple(block_table.shape)}"
        )
    if page_size <= 0:
        raise ValueError(f"page_size must be positive, got {page_size}")
    b, max_blocks = block_table.shape
    flat = local.reshape(b, -1).long()
    block = torch.div(flat, page_size, rounding_mode="floor")
    valid = (flat >= 0) & (block < max_blocks)
    page = block_table.long().gather(1, torch.where(valid, block, 0))
    valid &= page >= 0
    slots = torch.where(valid, page * page_size + flat % page_size, -1)
    return slots.reshape(local.shape).to(local.dtype)


def to_workspace_slots(local: torch.Tensor, workspace_start: torch.Tensor) -> torch.Tensor:
    """Prefill variant: ``workspace_start[r] + i`` into a chunk-local bf16 workspace.

    ``workspace_start`` has one entry per leading row of ``local`` (per request for
    ``(b, s_q, topk)``, per token for ``(t, topk)``).
    """
    return _offset_valid(local, workspace_start)


def ragged_to_global(
    idx: torch.Tensor, cu_seqlens_k: torch.Tensor, req_of_token: torch.Tensor
) -> torch.Tensor:
    """sglang NSA ragged top-k: add ``cu_seqlens_k[req]`` to request-relative positions.

    ``idx`` is ``(t, topk)``; ``req_of_token`` ``(t,)`` names each token's request.
    """
    return _offset_valid(idx, cu_seqlens_k.long()[req_of_token.long()])


def _offset_valid(idx: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    if start.dim() != 1 or start.shape[0] != idx.shape[0]:
        raise ValueError(
            f"offsets must be 1-D with {idx.shape[0]} entries (one per leading row), "
            f"got {tuple(start.shape)}"
        )
    start = start.long().reshape((-1,) + (1,) * (idx.dim() - 1))
    out = torch.where(idx >= 0, idx.long() + start, -1)
    return out.to(idx.dtype)


def pad_width(idx: torch.Tensor, multiple: int, fill: int = -1) -> torch.Tensor:
    """Pad the last dim with ``fill`` up to a multiple of ``multiple`` (4, 64, 128...)."""
    if multiple <= 0:
        raise ValueError(f"multiple must be positive, got {multiple}")
    return pad_to(idx, -(-idx.shape[-1] // multiple) * multiple, fill)


def pad_to(idx: torch.Tensor, width: int, fill: int = -1) -> torch.Tensor:
    """Pad the last dim with ``fill`` up to exactly ``width`` (at least its width)."""
    have = idx.shape[-1]
    if width < have:
        raise ValueError(f"cannot pad index width {have} down to {width}")
    if width == have:
        return idx
    pad = idx.new_full((*idx.shape[:-1], width - have), fill)
    return torch.cat([idx, pad], dim=-1)


def merge_window_extra(
    window_idx: torch.Tensor,
    window_len: IntOrTensor,
    extra_idx: torch.Tensor,
    extra_len: IntOrTensor,
    s_kv_window: int,
    *,
    pad_to: int = 128,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge window and extra indices into one index set over ``[window_kv; extra_kv]``.

    Per token: the first ``window_len`` window entries, then the first ``extra_len``
    extra entries shifted by ``s_kv_window``, then -1 up to a width that is a multiple
    of ``pad_to``. Entries past a part's length are dropped; -1 stays -1.
    Returns ``(idx (t, width), lengths (t,) = window_len + extra_len)``.
    """
    if window_idx.dim() != 2 or extra_idx.dim() != 2 or window_idx.shape[0] != extra_idx.shape[0]:
        raise ValueError(
            "window_idx and extra_idx must be (t, k) with the same t, got "
            f"{tuple(window_idx.shape)} and {tuple(extra_idx.shape)}"
        )
    t, kw = window_idx.shape
    ke = extra_idx.shape[1]
    device = window_idx.device
    wl = _lengths(window_len, t, kw, "window_len", device)
    el = _lengths(extra_len, t, ke, "extra_len", device)

    width = -(-(kw + ke) // pad_to) * pad_to
    # One spare column at the end takes every dropped entry, then is cut off.
    out = torch.full((t, width + 1), -1, dtype=torch.long, device=device)
    cols_w = torch.arange(kw, device=device).expand(t, kw)
    keep_w = cols_w < wl[:, None]
    out.scatter_(1, torch.where(keep_w, cols_w, width), window_idx.long())
    cols_e = torch.arange(ke, device=device).expand(t, ke)
    keep_e = cols_e < el[:, None]
    shifted = torch.where(extra_idx >= 0, extra_idx.long() + s_kv_window, -1)
    out.scatter_(1, torch.where(keep_e, wl[:, None] + cols_e, width), shifted)
    out = out[:, :width]
    out = torch.where(out >= 0, out, -1)
    return out.to(window_idx.dtype), wl + el


def _lengths(
    length: IntOrTensor, t: int, width: int, name: str, device: torch.device
) -> torch.Tensor:
    length = torch.as_tensor(length, device=device).long().expand(t)
    if length.numel() and (int(length.min()) < 0 or int(length.max()) > width):
        raise ValueError(f"{name} must lie in [0, {width}] (the index width)")
    return length


def window_visible(pos: IntOrTensor, window: int = 128) -> IntOrTensor:
    """Window tokens a query at position ``pos`` sees: ``min(pos + 1, window)``."""
    return _minimum(pos + 1, window)


def c4_visible(pos: IntOrTensor, topk: int, ratio: int = 4) -> IntOrTensor:
    """C4 entries a query sees after the indexer: ``min((pos + 1) // ratio, topk)``."""
    return _minimum((pos + 1) // ratio, topk)


def c128_visible(pos: IntOrTensor, ratio: int = 128) -> IntOrTensor:
    """C128 entries a query sees (all of them, no indexer): ``(pos + 1) // ratio``."""
    return (pos + 1) // ratio


def _minimum(a: IntOrTensor, b: int) -> IntOrTensor:
    if isinstance(a, torch.Tensor):
        return torch.clamp(a, max=b)
    return min(a, b)


def window_indices(pos: IntOrTensor, window: int = 128) -> torch.Tensor:
    """Request-local positions of the last ``window`` tokens for each query position.

    ``pos`` is ``(t,)`` (or an int). Row ``r`` holds ``pos - v + 1, ..., pos`` in
    ascending order in its first ``v = window_visible(pos, window)`` columns and -1 after,
    so the valid part is a prefix whose length is ``window_visible``. Page mapping is
    left to ``to_global_slots``.
    """
    pos = torch.as_tensor(pos).long().reshape(-1)
    visible = window_visible(pos, window)
    cols = torch.arange(window, device=pos.device)
    local = (pos - visible + 1)[:, None] + cols
    return torch.where(cols < visible[:, None], local, -1)
