"""Byte layouts of the FP8 sparse-MLA KV caches, written and read in plain PyTorch.

V3.2 "656", token-major, cache ``(num_blocks, block_size, 1, 656)``; per token:
    [0, 512)    512 x e4m3 latent, 4 tiles of 128
    [512, 528)  4 x fp32 scale, one per tile (value = e4m3 * scale)
    [528, 656)  64 x bf16 rope

V4 "584" (FlashMLA's MODEL1), structure-of-arrays per page of P tokens:
    [0, P*576)             token t at t*576: 448 x e4m3 nope (7 tiles of 64), 64 x bf16 rope
    [P*576, P*584)         token t at P*576 + t*8: 7 x ue8m0 (byte b = 2^(b-127)), 1 zero pad byte
    [P*584, page stride)   zero padding; writers pad the page stride to a multiple of 576
The kernels get a logical view ``(num_pages, P, 1, 584)`` with ``stride(1) == 584``; the page
stride is ``stride(0)``, and every reader here takes it from there.

Multi-byte values are little endian. A slot (global token index) is ``page * P + offset``.
Caches may be uint8 or any other 1-byte dtype (FlashMLA's test writer returns e4m3).
Dequantized values are float32; for power-of-two scales they are exact.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from reference.layout_table import LAYOUTS, of_cache

E4M3_MAX = 448.0
FLT_MIN = torch.finfo(torch.float32).tiny
D_ROPE = 64

_V32, _V4 = LAYOUTS["v32"], LAYOUTS["v4"]
V32_TOKEN_BYTES, V32_D_QK, V32_D_NOPE, V32_TILE = (
    _V32.token_bytes,
    _V32.d_qk,
    _V32.d_nope,
    _V32.tile,
)
V4_TOKEN_BYTES, V4_D_QK, V4_D_NOPE, V4_TILE = _V4.token_bytes, _V4.d_qk, _V4.d_nope, _V4.tile
V4_DATA_BYTES, V4_SCALE_BYTES = 576, 8  # per token, in the two halves of a page
V4_PAGE_ALIGN = 576
PLAIN_ROW_WIDTH = 512
PLAIN_ROW_CHUNK = 1 << 16  # tokens dequantized at a time into plain rows
# tokens a writer encodes at a time: its fp32 temporaries stay ~1 GiB however long the cache
# (a V3.2 batch of 128 x 64K tokens at once asked 16 GiB for the latent alone)
ENCODE_CHUNK = 1 << 19

Layout = str  # a name in reference.layout_table.LAYOUTS


def _over_e4m3_max(x: torch.Tensor) -> torch.Tensor:
    """x / 448, correctly rounded on every device: CUDA turns division by a Python scalar into
    multiplication by its reciprocal, which can be one ulp off (and flip a ceil(log2))."""
    return x / torch.full((), E4M3_MAX, dtype=x.dtype, device=x.device)


# Tile amax -> scale before rounding up to a power of two (the writers differ only in the floor).
_V4_SCALE_RULES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "flashmla": lambda amax: _over_e4m3_max(amax).clamp_min(1e-4),
    "vllm": lambda amax: _over_e4m3_max(amax.clamp_min(1e-4)),
    "sglang": lambda amax: _over_e4m3_max(amax.clamp_min(1e-8)),
}
_SCALE_ROUNDINGS = (None, "bf16", "bf16-product", "e8m0")


# ---- small numeric helpers ---------------------------------------------------------------


def _ceil_log2(x: torch.Tensor) -> torch.Tensor:
    """Exact ceil(log2(x)) for x > 0; a float log2 can land on the wrong side of a power of two."""
    mantissa, exponent = torch.frexp(x)  # x = mantissa * 2^exponent, mantissa in [0.5, 1)
    return exponent - (mantissa == 0.5).to(exponent.dtype)


def _floor_pow2(x: torch.Tensor) -> torch.Tensor:
    """2^floor(log2(x)) for normal x: clear the 23 mantissa bits (an e8m0 truncation)."""
    return (x.contiguous().view(torch.int32) & ~0x7FFFFF).view(torch.float32)


# "raw": amax / 448 as it is. "pow2": FlashMLA's test writer (its V4 rule for V3.2 too); vLLM
# 0.33.0's writer matched it byte for byte on an H100 (results/sm90/studies/dsa-helpers).
_V32_SCALE_RULES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "raw": lambda amax: _over_e4m3_max(amax).clamp_min(FLT_MIN),
    "pow2": lambda amax: torch.exp2(_ceil_log2(_V4_SCALE_RULES["flashmla"](amax)).float()),
}


def _to_e4m3(x: torch.Tensor) -> torch.Tensor:
    # Saturate explicitly: a plain cast is not guaranteed to saturate on every device.
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def _tile_amax(x: torch.Tensor, tile: int) -> torch.Tensor:
    return x.unflatten(-1, (-1, tile)).abs().amax(-1)


def _quantize_tiles(x: torch.Tensor, tile: int, scale: torch.Tensor) -> torch.Tensor:
    """e4m3 bytes of x [n, k*tile], tile j divided by scale[:, j]."""
    return _to_e4m3(x.unflatten(-1, (-1, tile)) / scale.unsqueeze(-1)).flatten(-2).view(torch.uint8)


def _e4m3_tiles(q: torch.Tensor, tile: int) -> torch.Tensor:
    return q.view(torch.float8_e4m3fn).float().unflatten(-1, (-1, tile))


def _bytes_of(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.uint8)


def _round_scale(scale: torch.Tensor, scale_rounding: str | None) -> torch.Tensor:
    if scale_rounding == "bf16":  # sm90 FlashMLA: round to nearest even
        return scale.to(torch.bfloat16).float()
    if scale_rounding == "e8m0":  # sm100 FlashMLA: truncate to the exponent
        return _floor_pow2(scale)
    return scale


# ---- checks ------------------------------------------------------------------------------


def _check_kv(kv: torch.Tensor, d: int, parts: str) -> None:
    if not (isinstance(kv, torch.Tensor) and kv.dim() == 2 and kv.shape[1] == d):
        shape = tuple(kv.shape) if isinstance(kv, torch.Tensor) else type(kv).__name__
        raise ValueError(f"kv must be [N, {d}] ({parts}), got {shape}")
    if not kv.is_floating_point():
        raise ValueError(f"kv must be a floating-point tensor, got {kv.dtype}")
    if not bool(torch.isfinite(kv).all()):
        raise ValueError("kv must be finite")


def _check_choice(name: str, value: object, choices: Iterable[object]) -> None:
    if value not in list(choices):
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")


def _check_page_size(page_size: int, name: str = "page_size") -> None:
    if not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"{name} must be an int >= 1, got {page_size!r}")


def _cache_bytes(cache: torch.Tensor) -> torch.Tensor:
    if cache.dim() != 4 or cache.shape[2] != 1 or cache.element_size() != 1:
        raise ValueError(
            "cache must be a 1-byte tensor (num_pages, page_size, 1, token bytes), "
            f"got {cache.dtype} {tuple(cache.shape)}"
        )
    return cache.view(torch.uint8)


def _check_layout(cache: torch.Tensor, layout: Layout, caller: str) -> None:
    width = LAYOUTS[layout].token_bytes
    if not cache.dim() or cache.shape[-1] != width:
        raise ValueError(f"{caller} needs a {width}-byte cache, got {tuple(cache.shape)}")


def _check_slots(slots: torch.Tensor, num_slots: int, device: torch.device) -> torch.Tensor:
    if not isinstance(slots, torch.Tensor) or slots.dim() != 1 or slots.is_floating_point():
        raise ValueError("slots must be a 1-D integer tensor")
    if slots.numel() and (int(slots.min()) < 0 or int(slots.max()) >= num_slots):
        raise ValueError(f"slots must lie in [0, {num_slots}), got [{slots.min()}, {slots.max()}]")
    return slots.to(device=device, dtype=torch.long)


# ---- layout queries ----------------------------------------------------------------------


def layout_of(cache: torch.Tensor) -> Layout:
    """A cache handed in without its layout name: the one layout of its width ("v32": 656-byte
    records, "v4": 584). Callers that know the name pass it (`layout=`) instead."""
    return of_cache(cache).name


def head_dim_of(cache: torch.Tensor, layout: str | None = None) -> int:
    """d_qk of the tokens in the cache: 576 (V3.2) or 512 (V4)."""
    return of_cache(cache, layout).d_qk


def v4_page_stride(page_size: int) -> int:
    """Bytes per V4 page as engines allocate it: page_size * 584 rounded up to a multiple of 576."""
    return -(-page_size * V4_TOKEN_BYTES // V4_PAGE_ALIGN) * V4_PAGE_ALIGN


# ---- V4 "584" ----------------------------------------------------------------------------


def _zeros_v4(num_pages: int, page_size: int, device: torch.device) -> torch.Tensor:
    page_stride = v4_page_stride(page_size)
    buffer = torch.zeros(num_pages * page_stride, dtype=torch.uint8, device=device)
    shape = (num_pages, page_size, 1, V4_TOKEN_BYTES)
    return torch.as_strided(buffer, shape, (page_stride, V4_TOKEN_BYTES, V4_TOKEN_BYTES, 1))


def _v4_token_views(cache_bytes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Views (num_pages, page_size, 576) of token data and (num_pages, page_size, 8) of scales."""
    num_pages, page_size = cache_bytes.shape[:2]
    page_stride, base = cache_bytes.stride(0), cache_bytes.storage_offset()
    if page_size > 1 and cache_bytes.stride(1) != V4_TOKEN_BYTES:
        raise ValueError(f"V4 cache must have stride(1) == 584, got {cache_bytes.stride(1)}")
    if num_pages > 1 and page_stride < page_size * V4_TOKEN_BYTES:
        raise ValueError(f"V4 page stride {page_stride} < page_size * 584: pages overlap")
    data = torch.as_strided(
        cache_bytes, (num_pages, page_size, V4_DATA_BYTES), (page_stride, V4_DATA_BYTES, 1), base
    )
    scales = torch.as_strided(
        cache_bytes,
        (num_pages, page_size, V4_SCALE_BYTES),
        (page_stride, V4_SCALE_BYTES, 1),
        base + page_size * V4_DATA_BYTES,
    )
    return data, scales


def _encode_v4(kv: torch.Tensor, convention: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Token data [N, 576] and scale records [N, 8] of kv [N, 512]."""
    nope, rope = kv[:, :V4_D_NOPE].float(), kv[:, V4_D_NOPE:]
    exponent = _ceil_log2(_V4_SCALE_RULES[convention](_tile_amax(nope, V4_TILE)))
    nope_bytes = _quantize_tiles(nope, V4_TILE, torch.exp2(exponent.float()))
    data = torch.cat([nope_bytes, _bytes_of(rope.to(torch.bfloat16))], dim=-1)
    pad = torch.zeros_like(exponent[:, :1], dtype=torch.uint8)
    return data, torch.cat([(exponent + 127).to(torch.uint8), pad], dim=-1)


def _decode_v4(data: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    num_tiles = V4_D_NOPE // V4_TILE
    scale = torch.exp2(scales[:, :num_tiles].float() - 127)
    nope = _e4m3_tiles(data[:, :V4_D_NOPE], V4_TILE) * scale.unsqueeze(-1)
    rope = data[:, V4_D_NOPE:].view(torch.bfloat16).float()
    return torch.cat([nope.flatten(-2), rope], dim=-1)


def quantize_v4(kv: torch.Tensor, page_size: int, convention: str = "flashmla") -> torch.Tensor:
    """kv [N, 512] -> V4 cache view (ceil(N / page_size), page_size, 1, 584), padded page stride.

    convention picks the writer's scale floor: "flashmla" (amax/448 >= 1e-4), "vllm"
    (amax >= 1e-4), "sglang" (amax >= 1e-8). Slots past N stay zero bytes.
    """
    _check_kv(kv, V4_D_QK, "448 nope + 64 rope")
    _check_choice("convention", convention, _V4_SCALE_RULES)
    _check_page_size(page_size)
    num_tokens = kv.shape[0]
    cache = _zeros_v4(-(-num_tokens // page_size), page_size, kv.device)
    data, scales = _v4_token_views(cache)
    for start in range(0, num_tokens, ENCODE_CHUNK):
        slots = torch.arange(start, min(start + ENCODE_CHUNK, num_tokens), device=kv.device)
        token_data, token_scales = _encode_v4(kv[start : start + ENCODE_CHUNK], convention)
        data[slots // page_size, slots % page_size] = token_data
        scales[slots // page_size, slots % page_size] = token_scales
    return cache


def dequantize_v4(cache: torch.Tensor, *, scale_rounding: str | None = None) -> torch.Tensor:
    """V4 cache -> float32 [num_pages * page_size, 512]; the page stride is cache.stride(0).

    ue8m0 scales are powers of two, which every scale_rounding keeps: it has no effect."""
    _check_layout(cache, "v4", "dequantize_v4")
    return gather_v4(cache, _all_slots(cache), scale_rounding)


def split_pages_v4(cache: torch.Tensor, new_page_size: int = 64) -> torch.Tensor:
    """Re-page a V4 cache (e.g. 256 -> 64 tokens per page); slots and token bytes unchanged."""
    _check_layout(cache, "v4", "split_pages_v4")
    _check_page_size(new_page_size, "new_page_size")
    num_pages, page_size = cache.shape[:2]
    if page_size % new_page_size:
        raise ValueError(f"new_page_size {new_page_size} must divide page_size {page_size}")
    data, scales = _v4_token_views(_cache_bytes(cache))
    num_new_pages = num_pages * (page_size // new_page_size)
    out = _zeros_v4(num_new_pages, new_page_size, cache.device)
    new_data, new_scales = _v4_token_views(out)
    new_data.copy_(data.reshape(num_new_pages, new_page_size, V4_DATA_BYTES))
    new_scales.copy_(scales.reshape(num_new_pages, new_page_size, V4_SCALE_BYTES))
    return out


# ---- V3.2 "656" --------------------------------------------------------------------------


def _encode_v32(kv: torch.Tensor, scale: str) -> torch.Tensor:
    """656-byte records [N, 656] of kv [N, 576]."""
    latent, rope = kv[:, :V32_D_NOPE].float(), kv[:, V32_D_NOPE:]
    tile_scale = _V32_SCALE_RULES[scale](_tile_amax(latent, V32_TILE))
    latent_bytes = _quantize_tiles(latent, V32_TILE, tile_scale)
    return torch.cat([latent_bytes, _bytes_of(tile_scale), _bytes_of(rope.to(torch.bfloat16))], -1)


def _decode_v32(records: torch.Tensor, scale_rounding: str | None) -> torch.Tensor:
    num_tiles = V32_D_NOPE // V32_TILE
    scale_bytes = records[:, V32_D_NOPE : V32_D_NOPE + 4 * num_tiles]
    scale = _round_scale(scale_bytes.view(torch.float32), scale_rounding)
    latent = _e4m3_tiles(records[:, :V32_D_NOPE], V32_TILE) * scale.unsqueeze(-1)
    if scale_rounding in ("bf16", "bf16-product"):
        # sm90 FlashMLA also forms the product in bf16 (e4m3 -> bf16, times the bf16 scale).
        # The fp32 product of 4 and 8 significant bits is exact, so rounding it once to bf16
        # is that product. "bf16-product" (FlashInfer's sm90 FA3 MLA, mla_hopper.cuh
        # repack_fp8_kv_to_bf16): the fp32 scale unrounded, e4m3 * scale in fp32 rounded once.
        latent = latent.to(torch.bfloat16).float()
    rope = records[:, V32_D_NOPE + 4 * num_tiles :].view(torch.bfloat16).float()
    return torch.cat([latent.flatten(-2), rope], dim=-1)


def quantize_v32(kv: torch.Tensor, block_size: int, scale: str = "pow2") -> torch.Tensor:
    """kv [N, 576] -> contiguous V3.2 cache (ceil(N / block_size), block_size, 1, 656) uint8.

    scale "raw": amax/448 floored at FLT_MIN; "pow2": amax/448 floored at 1e-4
    and rounded up to a power of two (FlashMLA's test writer). Slots past N stay zero bytes.
    """
    _check_kv(kv, V32_D_QK, "512 latent + 64 rope")
    _check_choice("scale", scale, _V32_SCALE_RULES)
    _check_page_size(block_size, "block_size")
    num_tokens = kv.shape[0]
    num_blocks = -(-num_tokens // block_size)
    records = torch.zeros(
        num_blocks * block_size, V32_TOKEN_BYTES, dtype=torch.uint8, device=kv.device
    )
    for start in range(0, num_tokens, ENCODE_CHUNK):
        stop = min(start + ENCODE_CHUNK, num_tokens)
        records[start:stop] = _encode_v32(kv[start:stop], scale)
    return records.view(num_blocks, block_size, 1, V32_TOKEN_BYTES)


def dequantize_v32(cache: torch.Tensor, *, scale_rounding: str | None = None) -> torch.Tensor:
    """V3.2 cache -> float32 [num_blocks * block_size, 576].

    scale_rounding emulates how a kernel reads the fp32 scale: None exactly; "bf16" as sm90
    FlashMLA does, the scale and then the value times the scale rounded to bf16 (nearest
    even); "bf16-product" the fp32 scale as it is and only the product rounded to bf16
    (FlashInfer's sm90 FA3 MLA); "e8m0" truncated to a power of two (sm100 FlashMLA).
    """
    _check_layout(cache, "v32", "dequantize_v32")
    return gather_v32(cache, _all_slots(cache), scale_rounding)


# ---- readers and converters for either layout --------------------------------------------


def _all_slots(cache: torch.Tensor) -> torch.Tensor:
    return torch.arange(cache.shape[0] * cache.shape[1], device=cache.device)


def _slot_address(
    cache: torch.Tensor, slots: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The cache's bytes and the (page, offset) of each checked global slot."""
    cache_bytes = _cache_bytes(cache)
    num_pages, page_size = cache.shape[:2]
    slots = _check_slots(slots, num_pages * page_size, cache.device)
    return cache_bytes, slots // page_size, slots % page_size


def gather_v4(
    cache: torch.Tensor, slots: torch.Tensor, scale_rounding: str | None = None
) -> torch.Tensor:
    """The V4 tokens at the given slots, float32 [len(slots), 512] (the table's `gather`)."""
    cache_bytes, page, offset = _slot_address(cache, slots)
    data, scales = _v4_token_views(cache_bytes)
    return _decode_v4(data[page, offset], scales[page, offset])


def gather_v32(
    cache: torch.Tensor, slots: torch.Tensor, scale_rounding: str | None = None
) -> torch.Tensor:
    """The V3.2 tokens at the given slots, float32 [len(slots), 576] (the table's `gather`)."""
    _check_choice("scale_rounding", scale_rounding, _SCALE_ROUNDINGS)
    cache_bytes, page, offset = _slot_address(cache, slots)
    return _decode_v32(cache_bytes[:, :, 0][page, offset], scale_rounding)


def gather_tokens(
    cache: torch.Tensor,
    slots: torch.Tensor,
    *,
    scale_rounding: str | None = None,
    layout: str | None = None,
) -> torch.Tensor:
    """float32 [len(slots), d_qk] of the tokens at the given slots, reading only those tokens.

    layout: the cache's layout name (the table entry's gather, or its reader); None only for
    a cache handed in without one (the one layout of its width). scale_rounding is as in
    dequantize_v32; V4 scales are powers of two, which every rounding keeps.
    """
    _check_choice("scale_rounding", scale_rounding, _SCALE_ROUNDINGS)
    entry = of_cache(cache, layout)
    gather = entry.gatherer()
    if gather is not None:
        return gather(cache, slots, scale_rounding)
    slots = _check_slots(slots, cache.shape[0] * cache.shape[1], cache.device)
    return entry.reader()(cache, scale_rounding=scale_rounding)[slots]


def _nan_record(d_nope: int, scale_bytes: bytes, device: torch.device) -> torch.Tensor:
    """Bytes of one token whose every value reads as NaN: e4m3 0x7F, the scales, bf16 NaN rope."""
    rope = torch.full((64,), float("nan"), dtype=torch.bfloat16).view(torch.uint8)
    nope = torch.full((d_nope,), 0x7F, dtype=torch.uint8)
    scales = torch.tensor(list(scale_bytes), dtype=torch.uint8)
    return torch.cat([nope, scales, rope]).to(device)


def poison_tokens(cache: torch.Tensor, slots: torch.Tensor, *, layout: str | None = None) -> None:
    """Overwrite the tokens at `slots` in place with NaN encodings (values, scales and rope), as
    FlashMLA's tests fill unused cache rows: a kernel reading outside its indices then fails.
    A layout without a `poison` function keeps its values."""
    poison = of_cache(cache, layout).poisoner()
    if poison is not None:
        poison(cache, slots)


def poison_v4(cache: torch.Tensor, slots: torch.Tensor) -> None:
    cache_bytes, page, offset = _slot_address(cache, slots)
    data, scales = _v4_token_views(cache_bytes)
    data[page, offset] = _nan_record(V4_D_NOPE, b"", cache.device)
    scales[page, offset] = torch.tensor([0xFF] * 7 + [0], dtype=torch.uint8, device=cache.device)


def poison_v32(cache: torch.Tensor, slots: torch.Tensor) -> None:
    cache_bytes, page, offset = _slot_address(cache, slots)
    nan32 = torch.tensor([float("nan")] * 4, dtype=torch.float32).view(torch.uint8)
    record = _nan_record(V32_D_NOPE, bytes(nan32.tolist()), cache.device)
    cache_bytes[:, :, 0][page, offset] = record


def to_workspace(
    cache: torch.Tensor,
    slots: torch.Tensor | None = None,
    *,
    scale_rounding: str | None = None,
    layout: str | None = None,
) -> torch.Tensor:
    """Flat bf16 kv [s_kv, 1, d_qk] for sparse prefill: every slot in order, or the given slots."""
    slots = _all_slots(cache) if slots is None else slots
    x = gather_tokens(cache, slots, scale_rounding=scale_rounding, layout=layout)
    return x.to(torch.bfloat16)[:, None]


def gather_workspace(
    cache: torch.Tensor,
    indices: torch.Tensor,
    *,
    scale_rounding: str | None = None,
    layout: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Compact bf16 workspace [n_unique, 1, d_qk] of the slots in indices (any shape, -1 invalid),
    and indices remapped into it (same shape and dtype, -1 kept)."""
    valid = indices != -1
    unique_slots, local = torch.unique(indices[valid], return_inverse=True)
    kv = to_workspace(cache, unique_slots, scale_rounding=scale_rounding, layout=layout)
    local_indices = torch.full_like(indices, -1)
    local_indices[valid] = local.to(indices.dtype)
    return kv, local_indices


def to_plain_rows(
    cache: torch.Tensor,
    *,
    dtype: str = "bf16",
    width: int = PLAIN_ROW_WIDTH,
    scale: torch.Tensor | None = None,
    scale_rounding: str | None = None,
    chunk: int = PLAIN_ROW_CHUNK,
    layout: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Plain rows [num_pages, 1, page_size, width]: each token's first `width` values.

    width 512 is FlashInfer trtllm-gen's layout (V3.2's latent, all of V4); d_qk keeps K
    whole. Tokens are dequantized `chunk` at a time. dtype "bf16" returns (rows, None);
    "e4m3" returns (e4m3(x / scale), scale) with one fp32 scale for the tensor: the given
    one (to share it between caches) or plain_rows_scale's.
    """
    _check_choice("dtype", dtype, ("bf16", "e4m3"))
    num_pages, page_size = cache.shape[:2]
    n = num_pages * page_size
    if dtype == "e4m3" and scale is None:
        scale = plain_rows_scale(
            cache, width=width, scale_rounding=scale_rounding, chunk=chunk, layout=layout
        )
    out_dtype = torch.bfloat16 if dtype == "bf16" else torch.float8_e4m3fn
    rows = torch.empty(n, width, dtype=out_dtype, device=cache.device)
    for start in range(0, n, chunk):
        slots = torch.arange(start, min(start + chunk, n), device=cache.device)
        x = gather_tokens(cache, slots, scale_rounding=scale_rounding, layout=layout)[:, :width]
        part = x.to(torch.bfloat16) if dtype == "bf16" else _to_e4m3(x / scale.to(x.device))
        rows[start : start + len(slots)] = part
    return rows.view(num_pages, 1, page_size, width), scale if dtype == "e4m3" else None


def plain_rows_scale(
    cache: torch.Tensor,
    *,
    width: int = PLAIN_ROW_WIDTH,
    scale_rounding: str | None = None,
    chunk: int = PLAIN_ROW_CHUNK,
    layout: str | None = None,
) -> torch.Tensor:
    """One fp32 e4m3 scale for a cache's plain rows: amax / 448 of the finite values (the
    NaN-poisoned unused slots do not count), floored at FLT_MIN."""
    n = cache.shape[0] * cache.shape[1]
    amax = torch.zeros((), dtype=torch.float32, device=cache.device)
    for start in range(0, n, chunk):
        slots = torch.arange(start, min(start + chunk, n), device=cache.device)
        x = gather_tokens(cache, slots, scale_rounding=scale_rounding, layout=layout)
        x = x[:, :width].abs()
        amax = torch.maximum(amax, torch.where(torch.isfinite(x), x, 0.0).amax())
    return e4m3_scale(amax)


def e4m3_scale(amax: torch.Tensor) -> torch.Tensor:
    """A per-tensor e4m3 scale amax / 448 (fp32); an all-zero tensor still gets a scale."""
    return _over_e4m3_max(amax.float()).clamp_min(FLT_MIN)
