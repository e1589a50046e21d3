"""The project's own Triton kernels for the sparse-prefill route's helper ops: FP8 -> bf16
dequantization of a V4 or V3.2 cache ("dequant") and request-local -> global index remapping
("remap"), the parts a serving engine runs as fused kernels.

Kernels (byte layouts: reference/layouts.py; docs/kernel-facts.md, FP8 cache layouts and
index remap):
  V4 dequant   one program per BLOCK_T tokens; reads the uint8 cache from its base pointer (the
               storage offset included) with the page stride stride(0), never page_size * 584:
               out[t, :448] = e4m3 * 2^(ue8m0 - 127) per 64-value tile, out[t, 448:] = the bf16
               rope bytes as they are.
  V3.2 dequant the same over 656-byte records with strides stride(0) and stride(1): out[t, :512] =
               bf16(float32(e4m3) * fp32 scale) per 128-value tile, rope bit-exact.
  remap        slot = block_table[r, i // P] * P + i % P; a negative i, a block past the table or
               a negative table entry gives -1. int32 or int64, the dtype of local.
  page split   a V4 cache in P-token pages -> 64-token pages (FlashInfer's sm120 layout) in one
               launch, one program per new page: its 64 x 576 data bytes and 64 x 8 scale bytes
               copied as 4-byte words (every offset and stride of the layout is a multiple of
               4); the output has the engines' padded page stride (37440). sglang fused its
               split into one kernel (#29927, SM120 DeepSeek-V4 page-split).
Both dequant kernels can read a list of slots instead of every token (`slots=`: row r of the
output is the token at slots[r], as layouts.to_workspace(cache, slots)).

Exactness: e4m3 is decoded and fp32 is rounded to bf16 (round to nearest even, as torch does)
with integer arithmetic in the kernels, so the GPU and Triton's CPU interpreter compute the same
bits, and the output equals layouts.to_workspace(cache).squeeze(1) bit for bit (NaN payloads
aside; a correct writer stores no NaN). V4 values are exact in bf16; V3.2 values are the fp32
product rounded once, as the oracle does it; scales are read exactly (v32_scale_reading None).

The kernels' sources are in kernels/cache.py; jit.py builds them (compiled for CUDA
tensors whatever TRITON_INTERPRET says, interpreted for CPU tensors) and imports Triton only
then: this module imports without it. The layout is a value the caller passes (case.layout),
checked against the cache's shape, never inferred from it.
"""

from __future__ import annotations

from dsv4bench.backends.triton import jit
from dsv4bench.backends.triton.attention import cache_bytes
from reference.layout_table import LAYOUTS

# launch shapes (not tuned on a GPU yet)
DEQUANT_BLOCK_T = 16  # tokens per program
DEQUANT_WARPS = 8
REMAP_BLOCK = 1024  # indices per program
REMAP_WARPS = 4
SPLIT_BLOCK = 1024  # words per step: 9 steps copy a 64-token page's 9216 data words
SPLIT_WARPS = 4


def _launch(name: str, device, grid, args, meta, num_warps: int):
    """launch() of the cache kernel `name` (compiled, or interpreted on CPU tensors)."""
    kernel = jit.kernel("cache", name, device)
    opts = {} if device.type == "cpu" else {"num_warps": num_warps}

    def launch():
        kernel[grid](*args, **meta, **opts)

    return launch


# ---- host side: checks, allocation and launches --------------------------------------------


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _rows(cache, slots, device):
    """Output rows, and the slots handed to the kernel (None: every slot in order)."""
    import torch

    num_slots = cache.shape[0] * cache.shape[1]
    if slots is None:
        return num_slots, None
    if not isinstance(slots, torch.Tensor) or slots.dim() != 1 or slots.is_floating_point():
        raise ValueError("slots must be a 1-D integer tensor")
    if slots.numel() and (int(slots.min()) < 0 or int(slots.max()) >= num_slots):
        raise ValueError(f"slots must lie in [0, {num_slots}), got [{slots.min()}, {slots.max()}]")
    return slots.numel(), slots.to(device).contiguous()


def _out(out, rows: int, d: int, device):
    import torch

    if out is None:
        return torch.empty(rows, d, dtype=torch.bfloat16, device=device)
    if out.shape != (rows, d) or out.dtype != torch.bfloat16 or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous bf16 ({rows}, {d}) tensor")
    return out


def dequant_launcher(cache, layout: str, slots=None, out=None):
    """(launch, out): launch() dequantizes a `layout` cache ("v4" or "v32") into out, a bf16
    (rows, d_qk) tensor (allocated here unless given), and returns out. All checks and
    allocations happen here; launch() is only the kernel launch."""
    if layout not in ("v4", "v32"):
        raise ValueError(f"dequant reads the v4 or v32 cache, not {layout!r}")
    u8 = cache_bytes(cache, layout)
    rows, slot_t = _rows(u8, slots, u8.device)
    out = _out(out, rows, LAYOUTS[layout].d_qk, u8.device)
    if rows == 0:
        return (lambda: out), out
    has_slots = slot_t is not None
    slot_arg = slot_t if has_slots else out  # never read without HAS_SLOTS
    strides = (u8.stride(0),) if layout == "v4" else (u8.stride(0), u8.stride(1))
    args = (u8, slot_arg, out, rows, *strides)
    meta = {"P": u8.shape[1], "HAS_SLOTS": has_slots, "BLOCK_T": DEQUANT_BLOCK_T}
    grid = (_cdiv(rows, DEQUANT_BLOCK_T),)
    run = _launch(f"dequant_{layout}", u8.device, grid, args, meta, DEQUANT_WARPS)

    def launch():
        run()
        return out

    return launch, out


def dequant(cache, layout: str, slots=None, out=None):
    """bf16 (rows, d_qk) of a `layout` cache: every slot in order, or the given slots."""
    launch, _ = dequant_launcher(cache, layout, slots, out)
    return launch()


def dequant_v4(cache, slots=None, out=None):
    """V4 cache (pages, P, 1, 584) -> bf16 (rows, 512) = layouts.to_workspace(...).squeeze(1)."""
    return dequant(cache, "v4", slots, out)


def dequant_v32(cache, slots=None, out=None):
    """V3.2 cache (blocks, P, 1, 656) -> bf16 (rows, 576) = layouts.to_workspace(...).squeeze(1)."""
    return dequant(cache, "v32", slots, out)


def remap_launcher(local, block_table, page_size: int, out=None):
    """(launch, out): launch() writes indices.to_global_slots(local, block_table, page_size)
    into out (same shape and dtype as local) and returns it."""
    import torch

    if block_table.dim() != 2 or local.dim() < 1 or local.shape[0] != block_table.shape[0]:
        raise ValueError(
            f"block_table must be (b, max_blocks) with b = local.shape[0], got "
            f"{tuple(block_table.shape)} for local {tuple(local.shape)}"
        )
    if not isinstance(page_size, int) or page_size <= 0:
        raise ValueError(f"page_size must be a positive int, got {page_size!r}")
    if local.is_floating_point() or block_table.is_floating_point():
        raise ValueError("local and block_table must be integer tensors")
    local_c = local.contiguous()
    table = block_table.to(local.device)
    if out is None:
        out = torch.empty_like(local_c, memory_format=torch.contiguous_format)
    elif out.shape != local.shape or out.dtype != local.dtype or not out.is_contiguous():
        raise ValueError("out must be a contiguous tensor of local's shape and dtype")
    n_total = local_c.numel()
    if n_total == 0:
        return (lambda: out), out
    per_req = n_total // local_c.shape[0]
    grid = (_cdiv(n_total, REMAP_BLOCK),)
    args = (local_c, table, out, n_total, per_req, table.stride(0), table.stride(1), table.shape[1])
    meta = {"P": page_size, "BLOCK": REMAP_BLOCK}
    run = _launch("remap", local_c.device, grid, args, meta, REMAP_WARPS)

    def launch():
        run()
        return out

    return launch, out


def remap(local, block_table, page_size: int, out=None):
    """Global slots of request-local positions (reference.indices.to_global_slots)."""
    launch, _ = remap_launcher(local, block_table, page_size, out)
    return launch()


def page_split_launcher(cache, page_size: int = 64, out=None):
    """(launch, out): launch() writes layouts.split_pages_v4(cache, page_size) into out (a V4
    cache of page_size-token pages at the padded page stride, allocated here unless given)."""
    import torch

    from reference import layouts

    if page_size != 64:
        raise ValueError(f"the kernel splits into 64-token pages, got page_size {page_size}")
    u8 = cache_bytes(cache, "v4")
    num_pages, P = u8.shape[:2]
    if P % 64 or P < 64:
        raise ValueError(f"source pages of {P} tokens do not split into 64-token pages")
    if u8.stride(0) % 4 or u8.storage_offset() % 4:
        raise ValueError("the page stride and the storage offset must be multiples of 4 bytes")
    n_new = num_pages * (P // 64)
    if out is None:
        out = layouts.split_pages_v4(u8[:0], 64) if n_new == 0 else _empty_v4(n_new, u8.device)
    if out.shape != (n_new, 64, 1, 584) or out.stride(0) % 4 or out.storage_offset() % 4:
        raise ValueError(f"out must be a V4 cache ({n_new}, 64, 1, 584), 4-byte aligned")
    if n_new == 0:
        return (lambda: out), out
    src = _words(u8)
    dst = _words(out.view(torch.uint8))
    args = (src, dst, u8.stride(0) // 4, out.stride(0) // 4)
    meta = {"P": P, "BLOCK": SPLIT_BLOCK}
    run = _launch("page_split_v4", u8.device, (n_new,), args, meta, SPLIT_WARPS)

    def launch():
        run()
        return out

    return launch, out


def _empty_v4(num_pages: int, device):
    """An uninitialized V4 cache of 64-token pages at the engines' padded stride."""
    import torch

    from reference import layouts

    stride = layouts.v4_page_stride(64)
    buf = torch.empty(num_pages * stride, dtype=torch.uint8, device=device)
    return buf.as_strided((num_pages, 64, 1, 584), (stride, 584, 584, 1))


def _words(u8):
    """int32 words from the tensor's first byte to the end of its storage (a flat view)."""
    import torch

    n = (u8.untyped_storage().nbytes() - u8.storage_offset()) // 4 * 4
    return torch.as_strided(u8, (n,), (1,), u8.storage_offset()).view(torch.int32)


def page_split(cache, page_size: int = 64, out=None):
    """layouts.split_pages_v4(cache, page_size) by one kernel launch."""
    launch, _ = page_split_launcher(cache, page_size, out)
    return launch()
