"""An independent, deliberately slow cache writer (the check on reference/cache_write.py): each
token's record bytes worked out one value at a time from the layout spec (docs/kernel-facts.md,
FP8 cache layouts; vLLM's concat_and_cache_mla fp8_ds_mla for V3.2's "raw" scale, FlashMLA's
test writer for "pow2" and V4), written at byte offsets computed from the page arithmetic.
Shares no code with reference/. Toy sizes only."""

from __future__ import annotations

import bisect
import math
import struct

import torch

from dsv4bench.backends.f64.parse import e4m3_value

# the finite non-negative e4m3 values and their bytes, ascending (0x00..0x7E)
_E4M3 = [(e4m3_value(b), b) for b in range(0x7F)]
_VALUES = [v for v, _ in _E4M3]
FLT_MIN = 2.0**-126
SCALE_FLOORS = {"flashmla": ("scale", 1e-4), "vllm": ("amax", 1e-4), "sglang": ("amax", 1e-8)}
WRITTEN = ("v32", "v4")  # the layouts this writer knows


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def e4m3_byte(x: float) -> int:
    """The e4m3 byte nearest x, ties to the even mantissa, saturating at +-448."""
    mag = min(abs(x), 448.0)
    i = bisect.bisect_left(_VALUES, mag)
    candidates = [c for c in (i - 1, i) if 0 <= c < len(_VALUES)]
    best = min(candidates, key=lambda c: (abs(_VALUES[c] - mag), _E4M3[c][1] & 1))
    byte = _E4M3[best][1]
    return byte | 0x80 if math.copysign(1.0, x) < 0 else byte


def _bf16_bytes(x: float) -> bytes:
    return struct.pack("<f", x)[2:]  # the input is bf16 already: the top half is exact


def _pow2_exponent(x: float) -> int:
    mantissa, exponent = math.frexp(x)
    return exponent - (mantissa == 0.5)


def record_v32(token: list[float], convention: str) -> bytes:
    values, scales = [], b""
    for t in range(4):
        tile = token[128 * t : 128 * t + 128]
        scale = f32(max(abs(v) for v in tile) / 448)
        if convention == "raw":
            scale = max(scale, FLT_MIN)
        else:
            scale = 2.0 ** _pow2_exponent(max(scale, f32(1e-4)))
        scales += struct.pack("<f", scale)
        values += [e4m3_byte(f32(v / scale)) for v in tile]
    return bytes(values) + scales + b"".join(_bf16_bytes(v) for v in token[512:])


def record_v4(token: list[float], convention: str) -> tuple[bytes, bytes]:
    """(576 data bytes, 8 scale bytes) of one V4 token."""
    what, floor = SCALE_FLOORS[convention]
    values, exponents = [], []
    for t in range(7):
        tile = token[64 * t : 64 * t + 64]
        amax = max(abs(v) for v in tile)
        if what == "amax":
            scale = f32(max(amax, f32(floor)) / 448)
        else:
            scale = max(f32(amax / 448), f32(floor))
        exponent = _pow2_exponent(scale)
        exponents.append(exponent + 127)
        values += [e4m3_byte(f32(v / 2.0**exponent)) for v in tile]
    rope = b"".join(_bf16_bytes(v) for v in token[448:])
    return bytes(values) + rope, bytes(exponents + [0])


def write(cache: torch.Tensor, kv: torch.Tensor, slots: list[int], layout: str, convention: str):
    """The cache's storage bytes (a flat uint8 copy) with row i of kv written at slots[i]."""
    if layout not in WRITTEN:
        raise ValueError(f"the slow writer writes {' and '.join(WRITTEN)} caches, not {layout}")
    storage = cache.untyped_storage()
    flat = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),), (1,)).clone()
    out = bytearray(flat.numpy().tobytes())
    page_size, page_stride = cache.shape[1], cache.stride(0)
    base = cache.storage_offset()
    for row, slot in enumerate(slots):
        if slot < 0:
            continue
        page, t = divmod(slot, page_size)
        token = [float(v) for v in kv[row].float()]
        start = base + page * page_stride
        if layout == "v32":
            at = start + t * 656
            out[at : at + 656] = record_v32(token, convention)
        else:
            data, scales = record_v4(token, convention)
            out[start + t * 576 : start + t * 576 + 576] = data
            at = start + page_size * 576 + t * 8
            out[at : at + 8] = scales
    return torch.frombuffer(out, dtype=torch.uint8).clone()
