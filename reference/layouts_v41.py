"""The 528- and 288-byte token records of DeepSeek V4.1 and GLM-5.3-Flash, in plain PyTorch.

All three are token-major: token t of a page sits at ``t * token_bytes``, its scales right
after its own values, cache ``(num_pages, page_size, 1, token_bytes)``; the page stride is
``stride(0)`` (engines may pad it), and every reader here takes it from there.

"v41" (FlashMLA ModelType::V41), 528 B: 512 x e4m3, the 64 rope values included (no bf16
    part), then 16 x ue8m0 scales (byte b = 2^(b-127)), one per 32 values.
"v41-fp4" (ModelType::V41_FP4, an extra cache only), 288 B: 512 x e2m1, two per byte (the
    even-indexed value in the low nibble), then 32 x e4m3 scales, one per 16 values.
"v32-nope" (FlashMLA's V32_NO_ROPE, GLM-5.3-Flash), 528 B: 512 x e4m3 in 4 tiles of 128,
    then 4 x fp32 scales (little endian); no rope.

Sources: vllm/models/deepseek_v41/common/ops/cache_utils.py (writer
`_quantize_and_insert_k_mxfp8_kernel`) and fused_compress_quant_cache.py
(`_rope_quant_insert_nvfp4_kernel`), vLLM 0.33.0; the V32_NO_ROPE width:
sglang/kernels/ops/attention/flash_mla_interface.py (sglang 0.5.23); the record descriptions:
flash_mla/flash_mla_interface.py (sgl-flash-mla 1.0.0), `flash_mla_with_kvcache`.
"""

from __future__ import annotations

import torch

from reference.layouts import (
    _V32_SCALE_RULES,
    _bytes_of,
    _cache_bytes,
    _ceil_log2,
    _check_choice,
    _check_kv,
    _check_layout,
    _check_page_size,
    _check_slots,
    _e4m3_tiles,
    _over_e4m3_max,
    _quantize_tiles,
    _tile_amax,
    _to_e4m3,
)

D_QK = 512
MX_TILE = 32  # values per ue8m0 scale (v41)
FP4_TILE = 16  # values per e4m3 scale (v41-fp4)
NOPE_TILE = 128  # values per fp32 scale (v32-nope)
E2M1_MAX = 6.0
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # codes 0..7; bit 3 is the sign
FP4_SCALE_MIN = 2.0**-9  # the writer clamps amax / 6 to e4m3's range [2^-9, 448]
V41_BYTES, FP4_BYTES, NOPE_BYTES = 528, 288, 528


def _records(num_tokens: int, page_size: int, width: int, device) -> torch.Tensor:
    num_pages = -(-num_tokens // page_size)
    return torch.zeros(num_pages * page_size, width, dtype=torch.uint8, device=device)


def _paged(records: torch.Tensor, page_size: int) -> torch.Tensor:
    return records.view(-1, page_size, 1, records.shape[-1])


def _token_records(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Bytes [len(slots), token_bytes] of the tokens at the given global slots."""
    cache_bytes = _cache_bytes(cache)
    num_pages, page_size = cache.shape[:2]
    slots = _check_slots(slots, num_pages * page_size, cache.device)
    return cache_bytes[:, :, 0][slots // page_size, slots % page_size]


def _all_slots(cache: torch.Tensor) -> torch.Tensor:
    return torch.arange(cache.shape[0] * cache.shape[1], device=cache.device)


# ---- v41: MXFP8 ------------------------------------------------------------------------


def quantize_v41(kv: torch.Tensor, page_size: int, convention: str = "vllm") -> torch.Tensor:
    """kv [N, 512] -> V4.1 cache (ceil(N / page_size), page_size, 1, 528): per 32 values the
    scale 2^ceil(log2(max(amax, 1e-4) / 448)) as vLLM's writer picks it."""
    _check_kv(kv, D_QK, "512 values, rope included")
    _check_choice("convention", convention, ("vllm",))
    _check_page_size(page_size)
    x = kv.float()
    exponent = _ceil_log2(_over_e4m3_max(_tile_amax(x, MX_TILE).clamp_min(1e-4)))
    values = _quantize_tiles(x, MX_TILE, torch.exp2(exponent.float()))
    records = _records(len(kv), page_size, V41_BYTES, kv.device)
    records[: len(kv)] = torch.cat([values, (exponent + 127).clamp(0, 255).to(torch.uint8)], -1)
    return _paged(records, page_size)


def _decode_v41(records: torch.Tensor) -> torch.Tensor:
    scale = torch.exp2(records[:, D_QK:].float() - 127)
    return (_e4m3_tiles(records[:, :D_QK], MX_TILE) * scale.unsqueeze(-1)).flatten(-2)


def gather_v41(
    cache: torch.Tensor, slots: torch.Tensor, scale_rounding: str | None = None
) -> torch.Tensor:
    """The V4.1 tokens at the given slots, float32 [len(slots), 512]; ue8m0 scales are powers
    of two, which every scale_rounding keeps."""
    return _decode_v41(_token_records(cache, slots))


def dequantize_v41(cache: torch.Tensor, *, scale_rounding: str | None = None) -> torch.Tensor:
    _check_layout(cache, "v41", "dequantize_v41")
    return gather_v41(cache, _all_slots(cache))


# ---- v41-fp4: NVFP4 ----------------------------------------------------------------------


def _e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """e2m1 codes (uint8 0..15) of x, round to nearest even, saturating at 6."""
    grid = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=x.device)
    order = torch.tensor([0, 2, 4, 6, 1, 3, 5, 7], device=x.device)  # argmin takes the first
    distance = (x.abs().clamp_max(E2M1_MAX).unsqueeze(-1) - grid[order]).abs()
    code = order[distance.argmin(-1)]
    return (code + 8 * torch.signbit(x).long()).to(torch.uint8)


def _e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    grid = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    magnitude = grid[(codes & 7).long()]
    return torch.where(codes >= 8, -magnitude, magnitude)


def quantize_v41_fp4(kv: torch.Tensor, page_size: int, convention: str = "vllm") -> torch.Tensor:
    """kv [N, 512] -> V4.1 FP4 cache (ceil(N / page_size), page_size, 1, 288): per 16 values
    the e4m3 scale of clamp(amax / 6, 2^-9, 448), values divided by it (round to nearest)."""
    _check_kv(kv, D_QK, "512 values, rope included")
    _check_choice("convention", convention, ("vllm",))
    _check_page_size(page_size)
    tiles = kv.float().unflatten(-1, (-1, FP4_TILE))
    amax = tiles.abs().amax(-1)
    scale = _to_e4m3((amax / E2M1_MAX).clamp(FP4_SCALE_MIN, 448.0))
    codes = _e2m1_codes(tiles / scale.float().unsqueeze(-1)).flatten(-2)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    records = _records(len(kv), page_size, FP4_BYTES, kv.device)
    records[: len(kv)] = torch.cat([packed, scale.view(torch.uint8)], -1)
    return _paged(records, page_size)


def _decode_v41_fp4(records: torch.Tensor) -> torch.Tensor:
    packed = records[:, : D_QK // 2]
    codes = torch.stack([packed & 0xF, packed >> 4], -1).flatten(-2)
    scale = records[:, D_QK // 2 :].contiguous().view(torch.float8_e4m3fn).float()
    tiles = _e2m1_values(codes).unflatten(-1, (-1, FP4_TILE))
    return (tiles * scale.unsqueeze(-1)).flatten(-2)


def gather_v41_fp4(
    cache: torch.Tensor, slots: torch.Tensor, scale_rounding: str | None = None
) -> torch.Tensor:
    """The V4.1 FP4 tokens at the given slots, float32 [len(slots), 512] (e4m3 scales are
    read exactly)."""
    return _decode_v41_fp4(_token_records(cache, slots))


def dequantize_v41_fp4(cache: torch.Tensor, *, scale_rounding: str | None = None) -> torch.Tensor:
    _check_layout(cache, "v41-fp4", "dequantize_v41_fp4")
    return gather_v41_fp4(cache, _all_slots(cache))


# ---- v32-nope: V3.2's latent record without the rope ----------------------------------------


def quantize_v32_nope(kv: torch.Tensor, page_size: int, convention: str = "pow2") -> torch.Tensor:
    """kv [N, 512] -> (ceil(N / page_size), page_size, 1, 528): V3.2's 512 e4m3 + 4 fp32 scales
    (scale conventions as quantize_v32's) and no rope."""
    _check_kv(kv, D_QK, "512 latent values, no rope")
    _check_choice("convention", convention, _V32_SCALE_RULES)
    _check_page_size(page_size)
    x = kv.float()
    scale = _V32_SCALE_RULES[convention](_tile_amax(x, NOPE_TILE))
    records = _records(len(kv), page_size, NOPE_BYTES, kv.device)
    records[: len(kv)] = torch.cat([_quantize_tiles(x, NOPE_TILE, scale), _bytes_of(scale)], -1)
    return _paged(records, page_size)


def gather_v32_nope(
    cache: torch.Tensor, slots: torch.Tensor, scale_rounding: str | None = None
) -> torch.Tensor:
    """float32 [len(slots), 512]; fp32 scales read exactly (scale_rounding is not modelled)."""
    records = _token_records(cache, slots)
    scale = records[:, D_QK:].contiguous().view(torch.float32)
    return (_e4m3_tiles(records[:, :D_QK], NOPE_TILE) * scale.unsqueeze(-1)).flatten(-2)


def dequantize_v32_nope(cache: torch.Tensor, *, scale_rounding: str | None = None) -> torch.Tensor:
    _check_layout(cache, "v32-nope", "dequantize_v32_nope")
    return gather_v32_nope(cache, _all_slots(cache))
