"""The V4.1 records in the block-split arrangement FlashMLA read before its 2026.09.30 release.

The same token bytes as "v41" / "v41-fp4" (reference/layouts_v41.py), placed differently in a
page of P tokens:

  "v41" / "v41-fp4" (interleaved, FlashMLA 2026.09.30, vLLM 0.33.0's writer): token t at
      t * W, its data then its own scales (W = 528 or 288), page stride P * W.
  "v41-blocks" / "v41-fp4-blocks" (block-split, before 2026.09.30): the page's P data rows
      first (token t's data at t * D), then its P scale rows (token t's scales at P * D + t * S),
      the page stride padded up to a multiple of D (D = 512, S = 16; or D = 256, S = 32).

Both arrangements take P * W bytes of data, so a cache written in one and read in the other
has the right size and reads wrongly without an error (KERNEL_FACTS.md section 11). Source:
sglang 0.5.23 sglang/kernels/ops/attention/dsv4/kv_layout.py (KVLayout.V41 / V41_NEW,
`row_addressing`, `page_align`), which mirrors sgl_kernel/deepseek_v4/kv_layout.cuh.

The kernels get a logical view (num_pages, P, 1, W) with stride(1) == W, as for V4's 584-byte
pages; the page stride is stride(0).
"""

from __future__ import annotations

import torch

from reference import layouts_v41 as interleaved
from reference.layouts import _cache_bytes, _check_layout, _check_page_size, _check_slots

# layout -> (its interleaved twin, data bytes D, scale bytes S)
SPLITS = {"v41-blocks": ("v41", 512, 16), "v41-fp4-blocks": ("v41-fp4", 256, 32)}
_WRITERS = {"v41": interleaved.quantize_v41, "v41-fp4": interleaved.quantize_v41_fp4}
_DECODERS = {"v41": interleaved._decode_v41, "v41-fp4": interleaved._decode_v41_fp4}


def page_stride(layout: str, page_size: int) -> int:
    """Bytes per page: P * (D + S) rounded up to a multiple of D (the reader's row stride)."""
    _, data, scale = SPLITS[layout]
    return -(-page_size * (data + scale) // data) * data


def _empty(layout: str, num_pages: int, page_size: int, device) -> torch.Tensor:
    _, data, scale = SPLITS[layout]
    stride = page_stride(layout, page_size)
    buffer = torch.zeros(num_pages * stride, dtype=torch.uint8, device=device)
    width = data + scale
    return torch.as_strided(buffer, (num_pages, page_size, 1, width), (stride, width, width, 1))


def record_views(cache: torch.Tensor, layout: str) -> list[torch.Tensor]:
    """[data (num_pages, P, D), scales (num_pages, P, S)]: views of every token's two parts."""
    _, data, scale = SPLITS[layout]
    return split_views(cache, layout, data, scale)


def split_views(cache: torch.Tensor, layout: str, data: int, scale: int) -> list[torch.Tensor]:
    """[data (num_pages, P, data), scales (num_pages, P, scale)] of a page holding its P data
    rows first, then its P scale rows, through the page stride stride(0)."""
    cache_bytes = _cache_bytes(cache)
    num_pages, page_size = cache_bytes.shape[:2]
    stride, base = cache_bytes.stride(0), cache_bytes.storage_offset()
    if num_pages > 1 and stride < page_size * (data + scale):
        raise ValueError(f"{layout} page stride {stride} < page_size * {data + scale}")
    shape = (num_pages, page_size)
    return [
        torch.as_strided(cache_bytes, (*shape, data), (stride, data, 1), base),
        torch.as_strided(cache_bytes, (*shape, scale), (stride, scale, 1), base + page_size * data),
    ]


def _quantize(layout: str, kv: torch.Tensor, page_size: int, convention: str) -> torch.Tensor:
    twin, data, _ = SPLITS[layout]
    _check_page_size(page_size)
    records = _WRITERS[twin](kv, 1, convention).view(-1, data + SPLITS[layout][2])
    num_pages = -(-len(kv) // page_size)
    cache = _empty(layout, num_pages, page_size, kv.device)
    data_rows, scale_rows = record_views(cache, layout)
    slots = torch.arange(len(kv), device=kv.device)
    data_rows[slots // page_size, slots % page_size] = records[:, :data]
    scale_rows[slots // page_size, slots % page_size] = records[:, data:]
    return cache


def _gather(layout: str, cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    twin = SPLITS[layout][0]
    data_rows, scale_rows = record_views(cache, layout)
    num_pages, page_size = cache.shape[:2]
    slots = _check_slots(slots, num_pages * page_size, cache.device)
    page, offset = slots // page_size, slots % page_size
    return _DECODERS[twin](torch.cat([data_rows[page, offset], scale_rows[page, offset]], -1))


def quantize_v41_blocks(kv: torch.Tensor, page_size: int, convention: str = "vllm"):
    """kv [N, 512] -> block-split V4.1 cache (ceil(N / P), P, 1, 528), padded page stride."""
    return _quantize("v41-blocks", kv, page_size, convention)


def gather_v41_blocks(cache, slots, scale_rounding: str | None = None) -> torch.Tensor:
    return _gather("v41-blocks", cache, slots)


def dequantize_v41_blocks(cache, *, scale_rounding: str | None = None) -> torch.Tensor:
    _check_layout(cache, "v41-blocks", "dequantize_v41_blocks")
    return gather_v41_blocks(cache, torch.arange(cache.shape[0] * cache.shape[1]))


def quantize_v41_fp4_blocks(kv: torch.Tensor, page_size: int, convention: str = "vllm"):
    """kv [N, 512] -> block-split V4.1 FP4 cache (ceil(N / P), P, 1, 288), padded page stride."""
    return _quantize("v41-fp4-blocks", kv, page_size, convention)


def gather_v41_fp4_blocks(cache, slots, scale_rounding: str | None = None) -> torch.Tensor:
    return _gather("v41-fp4-blocks", cache, slots)


def dequantize_v41_fp4_blocks(cache, *, scale_rounding: str | None = None) -> torch.Tensor:
    _check_layout(cache, "v41-fp4-blocks", "dequantize_v41_fp4_blocks")
    return gather_v41_fp4_blocks(cache, torch.arange(cache.shape[0] * cache.shape[1]))
