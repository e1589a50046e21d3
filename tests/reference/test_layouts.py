"""Tests of reference/layouts.py: round trips, readers on hand-built bytes, converters."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reference.layouts import (
    dequantize_v4,
    dequantize_v32,
    gather_tokens,
    gather_workspace,
    head_dim_of,
    layout_of,
    quantize_v4,
    quantize_v32,
    split_pages_v4,
    to_plain_rows,
    to_workspace,
    v4_page_stride,
)

# A few e4m3 (fn) encodings and their values, from the format: s eeee mmm, bias 7.
E4M3 = {
    0x00: 0.0,
    0x01: 2.0**-9,  # smallest subnormal
    0x07: 7 * 2.0**-9,  # largest subnormal
    0x08: 2.0**-6,  # smallest normal
    0x38: 1.0,
    0x3C: 1.5,
    0x40: 2.0,
    0x7E: 448.0,
    0xB8: -1.0,
    0xFE: -448.0,
}
E4M3_CODES = list(E4M3)
JUNK = 0xFF  # e4m3 NaN: a reader that strays into padding produces NaNs


def bf16_bytes(value: float) -> bytes:
    """Little-endian bf16 of a value exactly representable in bf16."""
    packed = struct.pack("<f", value)
    assert packed[:2] == b"\0\0", f"{value} is not exact in bf16"
    return packed[2:]


def storage_bytes(cache: torch.Tensor) -> np.ndarray:
    """All bytes of the cache's storage, addressed like storage_offset and strides."""
    return torch.empty(0, dtype=torch.uint8).set_(cache.untyped_storage()).numpy()


def e4m3_bound(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Largest |dequant - x| for round-to-nearest e4m3 with per-element scale: half an ulp of
    3 mantissa bits for normals (2^-4 |x|), half the subnormal step (2^-10 scale) below."""
    return 2.0**-4 * x.abs() + 2.0**-10 * scale


def per_element(tile_values: torch.Tensor, tile: int) -> torch.Tensor:
    return tile_values.repeat_interleave(tile, dim=-1)


def random_kv(n: int, d: int, magnitude: float, seed: int, dtype=torch.float32) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    # Per-token magnitudes spread over 2^-6 .. 2^6 so tiles get different scales.
    spread = torch.exp2(torch.randint(-6, 7, (n, 1), generator=gen).float())
    return (torch.randn(n, d, generator=gen) * spread * magnitude).to(dtype)


# ---- page geometry -----------------------------------------------------------------------


@pytest.mark.parametrize(("page_size", "stride"), [(64, 37440), (256, 149760), (2, 1728)])
def test_v4_page_stride_is_padded_to_576(page_size: int, stride: int) -> None:
    cache = quantize_v4(torch.randn(3 * page_size - 1, 512), page_size)
    assert v4_page_stride(page_size) == stride
    assert cache.shape == (3, page_size, 1, 584)
    assert cache.dtype == torch.uint8
    assert cache.stride(0) == stride
    assert cache.stride(1) == 584
    assert cache.stride(3) == 1
    assert cache.untyped_storage().nbytes() == 3 * stride


def test_v4_writer_places_bytes_where_the_spec_says() -> None:
    page_size, stride = 2, 1728
    kv = torch.zeros(3, 512)
    kv[2, :64] = 0.875  # token 2 = page 1, offset 0; tile 0 amax 448 * 2^-9 -> e = -9
    kv[2, 448] = 1.5
    raw = storage_bytes(quantize_v4(kv, page_size))
    token, scales = 1 * stride, 1 * stride + page_size * 576
    assert (raw[token : token + 64] == 0x7E).all()  # 0.875 * 2^9 = 448
    assert (raw[token + 64 : token + 448] == 0).all()
    assert raw[scales] == 127 - 9
    assert raw[scales + 1] == 127 - 13  # zero tile: flashmla floor 1e-4 -> e = -13
    assert raw[scales + 7] == 0  # pad byte
    assert bytes(raw[token + 448 : token + 450]) == bf16_bytes(1.5)
    # Slot 3 (page 1, offset 1) does not exist: its bytes and the page padding stay zero.
    assert (raw[token + 576 : token + 1152] == 0).all()
    assert (raw[scales + 8 : scales + 16] == 0).all()
    assert (raw[stride + page_size * 584 : 2 * stride] == 0).all()


# ---- readers on hand-built bytes ---------------------------------------------------------


def v4_token_spec(k: int) -> tuple[list[int], list[int], list[float]]:
    """e4m3 codes, ue8m0 scale bytes and rope values of hand-built V4 token k."""
    nope = [E4M3_CODES[(i + k) % len(E4M3_CODES)] for i in range(448)]
    scales = [120 + j + k for j in range(7)]
    rope = [(i - 32) * 0.5 + k for i in range(64)]
    return nope, scales, rope


def v4_token_value(k: int) -> list[float]:
    nope, scales, rope = v4_token_spec(k)
    return [E4M3[b] * 2.0 ** (scales[i // 64] - 127) for i, b in enumerate(nope)] + rope


def build_v4(
    num_pages: int, page_size: int, page_stride: int, offset: int, junk_pages: tuple[int, ...] = ()
) -> torch.Tensor:
    """A V4 cache written byte by byte from the spec; everything else (offset, padding, the
    scale pad byte, whole junk pages) holds JUNK. The last page ends right after its scales."""
    buf = np.full(offset + (num_pages - 1) * page_stride + page_size * 584, JUNK, np.uint8)
    for page in set(range(num_pages)) - set(junk_pages):
        base = offset + page * page_stride
        for t in range(page_size):
            nope, scales, rope = v4_token_spec(page * page_size + t)
            data = base + t * 576
            buf[data : data + 448] = nope
            buf[data + 448 : data + 576] = np.frombuffer(b"".join(map(bf16_bytes, rope)), np.uint8)
            scale = base + page_size * 576 + t * 8
            buf[scale : scale + 7] = scales
    shape, strides = (num_pages, page_size, 1, 584), (page_stride, 584, 584, 1)
    return torch.from_numpy(buf).as_strided(shape, strides, offset)


@pytest.mark.parametrize(
    ("page_size", "page_stride", "offset"),
    [(2, 1728, 0), (2, 2304, 100), (3, 3 * 584, 7), (4, 5000, 0)],
)
def test_v4_reader_on_hand_built_pages(page_size: int, page_stride: int, offset: int) -> None:
    num_pages = 3
    cache = build_v4(num_pages, page_size, page_stride, offset)
    expected = torch.tensor([v4_token_value(k) for k in range(num_pages * page_size)])
    assert cache.stride(0) == page_stride
    torch.testing.assert_close(dequantize_v4(cache), expected, rtol=0, atol=0)
    torch.testing.assert_close(
        dequantize_v4(cache.view(torch.float8_e4m3fn)), expected, rtol=0, atol=0
    )
    slots = torch.tensor([5, 0, 3, 3], dtype=torch.int32)
    torch.testing.assert_close(gather_tokens(cache, slots), expected[slots.long()], rtol=0, atol=0)


def test_gather_tokens_reads_only_the_listed_tokens() -> None:
    cache = build_v4(num_pages=3, page_size=2, page_stride=1728, offset=0, junk_pages=(1,))
    assert torch.isnan(dequantize_v4(cache)[2:4]).any()  # the junk page really is junk
    slots = torch.tensor([4, 1, 0, 5])
    expected = torch.tensor([v4_token_value(k) for k in slots.tolist()])
    torch.testing.assert_close(gather_tokens(cache, slots), expected, rtol=0, atol=0)


# Stored fp32 scale, then as sm90 (bf16, round to nearest even) and sm100 (e8m0, truncated) read it.
SCALE_CASES = [
    (0.3, 0.30078125, 0.25),
    (3.0, 3.0, 2.0),
    (1 + 2**-8, 1.0, 1.0),  # bf16 tie, rounds down to even
    (1 + 3 * 2**-8, 1 + 2**-6, 1.0),  # bf16 tie, rounds up to even
    (1e-3, 131 / 128 * 2**-10, 2**-10),
    (0.75, 0.75, 0.5),
]


def v32_token_spec(k: int) -> tuple[list[int], list[int], list[float]]:
    """e4m3 codes, indices into SCALE_CASES and rope values of hand-built V3.2 token k."""
    latent = [E4M3_CODES[(3 * i + k) % len(E4M3_CODES)] for i in range(512)]
    cases = [(j + k) % len(SCALE_CASES) for j in range(4)]
    rope = [(i - 32) * 0.25 - k for i in range(64)]
    return latent, cases, rope


def bf16_nearest_even(x: float) -> float:
    """x (exact in float32) rounded to bfloat16, ties to even, on the bits."""
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def v32_token_value(k: int, rounding: int) -> list[float]:
    """rounding: 0 exact fp32 scale, 1 bf16, 2 e8m0 (columns of SCALE_CASES). bf16 is sm90's
    reading: the product of the e4m3 value and the bf16 scale is rounded to bf16 as well."""
    latent, cases, rope = v32_token_spec(k)
    scale = [float(np.float32(SCALE_CASES[c][rounding])) for c in cases]
    values = [E4M3[b] * scale[i // 128] for i, b in enumerate(latent)]
    if rounding == 1:
        values = [bf16_nearest_even(x) for x in values]
    return values + rope


def build_v32(num_blocks: int, block_size: int, block_stride: int, offset: int) -> torch.Tensor:
    buf = np.full(offset + num_blocks * block_stride, JUNK, np.uint8)
    for block in range(num_blocks):
        for t in range(block_size):
            latent, cases, rope = v32_token_spec(block * block_size + t)
            record = offset + block * block_stride + t * 656
            scales = struct.pack("<4f", *(SCALE_CASES[c][0] for c in cases))
            buf[record : record + 512] = latent
            buf[record + 512 : record + 528] = np.frombuffer(scales, np.uint8)
            buf[record + 528 : record + 656] = np.frombuffer(
                b"".join(map(bf16_bytes, rope)), np.uint8
            )
    shape, strides = (num_blocks, block_size, 1, 656), (block_stride, 656, 656, 1)
    return torch.from_numpy(buf).as_strided(shape, strides, offset)


@pytest.mark.parametrize(("rounding", "name"), [(0, None), (1, "bf16"), (2, "e8m0")])
@pytest.mark.parametrize(("block_stride", "offset"), [(3 * 656, 0), (3 * 656 + 48, 16)])
def test_v32_reader_on_hand_built_blocks(
    rounding: int, name: str | None, block_stride: int, offset: int
) -> None:
    cache = build_v32(2, 3, block_stride, offset)
    # float32 product of an e4m3 value and an fp32 scale, rounded once, as numpy does it.
    expected = torch.tensor([v32_token_value(k, rounding) for k in range(6)], dtype=torch.float64)
    expected = expected.float()
    torch.testing.assert_close(dequantize_v32(cache, scale_rounding=name), expected, rtol=0, atol=0)
    slots = torch.tensor([4, 1])
    torch.testing.assert_close(
        gather_tokens(cache, slots, scale_rounding=name), expected[slots], rtol=0, atol=0
    )


def test_v32_scale_rounding_differs_for_non_power_of_two_scale() -> None:
    cache = build_v32(1, 1, 656, 0)  # token 0: tile 0 has scale 0.3
    code = E4M3_CODES[3]  # token 0, tile 0, element 1
    assert cache[0, 0, 0, 1].item() == code == 0x08
    x = {r: dequantize_v32(cache, scale_rounding=r)[0, 1].item() for r in (None, "bf16", "e8m0")}
    assert x[None] == pytest.approx(E4M3[code] * float(np.float32(0.3)), rel=0, abs=0)
    assert x["bf16"] == E4M3[code] * 0.30078125
    assert x["e8m0"] == E4M3[code] * 0.25
    assert len(set(x.values())) == 3


def test_v32_bf16_reading_rounds_the_product() -> None:
    """sm90 reads 7 * 2^-9 (e4m3 0x07) times scale 0.3 as bf16(7 * 2^-9 * bf16(0.3)): the exact
    product 539 * 2^-17 has 10 significant bits, bf16 keeps 8."""
    cache = build_v32(1, 1, 656, 0)  # token 0: element 4 is 0x07 in tile 0, scale 0.3
    assert cache[0, 0, 0, 4].item() == 0x07
    value = dequantize_v32(cache, scale_rounding="bf16")[0, 4].item()
    product = E4M3[0x07] * 0.30078125
    assert product == 539 * 2.0**-17
    assert value == bf16_nearest_even(product) == 540 * 2.0**-17
    assert value != product


# ---- writers: round trips and scale conventions ------------------------------------------

V4_SCALE_FLOOR = {"flashmla": 1e-4, "vllm": 1e-4 / 448, "sglang": 1e-8 / 448}


def tile_amax(x: torch.Tensor, tile: int) -> torch.Tensor:
    return x.unflatten(-1, (-1, tile)).abs().amax(-1)


@settings(max_examples=25, deadline=None)
@given(
    num_tokens=st.integers(1, 200),
    page_size=st.sampled_from([1, 2, 3, 64, 256]),
    log2_magnitude=st.integers(-16, 12),
    convention=st.sampled_from(["flashmla", "vllm", "sglang"]),
    bf16_input=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_v4_round_trip(
    num_tokens: int,
    page_size: int,
    log2_magnitude: int,
    convention: str,
    bf16_input: bool,
    seed: int,
) -> None:
    dtype = torch.bfloat16 if bf16_input else torch.float32
    kv = random_kv(num_tokens, 512, 2.0**log2_magnitude, seed, dtype)
    x = kv.float()
    out = dequantize_v4(quantize_v4(kv, page_size, convention=convention))
    assert out.shape == (-(-num_tokens // page_size) * page_size, 512)
    assert out.dtype == torch.float32
    # The power-of-two scale is at most twice the floored amax / 448.
    scale = 2 * (tile_amax(x[:, :448], 64) / 448).clamp_min(V4_SCALE_FLOOR[convention])
    err = (out[:num_tokens, :448] - x[:, :448]).abs()
    assert (err <= e4m3_bound(x[:, :448], per_element(scale, 64))).all()
    torch.testing.assert_close(
        out[:num_tokens, 448:], x[:, 448:].to(torch.bfloat16).float(), rtol=0, atol=0
    )
    assert (out[num_tokens:] == 0).all()


@settings(max_examples=25, deadline=None)
@given(
    num_tokens=st.integers(1, 150),
    block_size=st.sampled_from([1, 3, 64]),
    log2_magnitude=st.integers(-16, 12),
    scale_kind=st.sampled_from(["pow2", "raw"]),
    bf16_input=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_v32_round_trip(
    num_tokens: int,
    block_size: int,
    log2_magnitude: int,
    scale_kind: str,
    bf16_input: bool,
    seed: int,
) -> None:
    dtype = torch.bfloat16 if bf16_input else torch.float32
    kv = random_kv(num_tokens, 576, 2.0**log2_magnitude, seed, dtype)
    x = kv.float()
    cache = quantize_v32(kv, block_size, scale=scale_kind)
    num_blocks = -(-num_tokens // block_size)
    assert cache.shape == (num_blocks, block_size, 1, 656)
    assert cache.is_contiguous()
    out = dequantize_v32(cache)
    amax_scale = tile_amax(x[:, :512], 128) / 448
    if scale_kind == "pow2":
        scale = 2 * amax_scale.clamp_min(1e-4)
        bound = e4m3_bound(x[:, :512], per_element(scale, 128))
    else:  # x / scale and e4m3 * scale each round once more in fp32
        scale = amax_scale.clamp_min(torch.finfo(torch.float32).tiny)
        bound = e4m3_bound(x[:, :512], per_element(scale, 128)) * (1 + 2.0**-20)
    assert ((out[:num_tokens, :512] - x[:, :512]).abs() <= bound).all()
    torch.testing.assert_close(
        out[:num_tokens, 512:], x[:, 512:].to(torch.bfloat16).float(), rtol=0, atol=0
    )
    assert (out[num_tokens:] == 0).all()


def v4_scale_bytes(cache: torch.Tensor, slot: int) -> list[int]:
    """The 8 scale bytes of a slot, addressed from the spec and the cache's strides."""
    page_size = cache.shape[1]
    page, t = divmod(slot, page_size)
    start = cache.storage_offset() + page * cache.stride(0) + page_size * 576 + t * 8
    return storage_bytes(cache)[start : start + 8].tolist()


def test_v4_scale_floors_by_convention() -> None:
    kv = torch.zeros(3, 512)
    kv[1, :64] = torch.linspace(-1e-3, 1e-3, 64)  # tile 0 amax 1e-3
    kv[2, :64] = torch.linspace(-1e-6, 1e-6, 64)  # tile 0 amax 1e-6
    # 127 + ceil(log2(s)): flashmla s = max(amax/448, 1e-4); vllm s = max(amax, 1e-4)/448;
    # sglang s = max(amax, 1e-8)/448. Tokens: all zero, amax 1e-3, amax 1e-6.
    expected = {"flashmla": [114, 114, 114], "vllm": [105, 109, 105], "sglang": [92, 109, 99]}
    for convention, tile0 in expected.items():
        assert 127 + math.ceil(math.log2(V4_SCALE_FLOOR[convention])) == tile0[0]
        cache = quantize_v4(kv, 2, convention=convention)
        for slot in range(3):
            scale_bytes = v4_scale_bytes(cache, slot)
            assert scale_bytes[0] == tile0[slot], (convention, slot)
            assert scale_bytes[1:] == [tile0[0]] * 6 + [0]  # all-zero tiles, then the pad byte


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("e", [-3, -13])
def test_v4_scale_rounds_up_exactly_at_powers_of_two(dtype: torch.dtype, e: int) -> None:
    at = 448 * 2.0**e  # = 1.75 * 2^(e+8): the scale is exactly 2^e, the element stored as 448
    ulp = 2.0 ** (e + 8 - (23 if dtype == torch.float32 else 7))
    kv = torch.zeros(2, 512, dtype=dtype)
    kv[0, 5] = at
    kv[1, 5] = at + ulp  # one ulp more needs 2^(e+1); for e = -13 a float32 log2 says e
    for convention in ("flashmla", "vllm", "sglang"):
        cache = quantize_v4(kv, 2, convention=convention)
        assert v4_scale_bytes(cache, 0)[0] == 127 + e
        assert v4_scale_bytes(cache, 1)[0] == 127 + e + 1
        assert cache[0, 0, 0, 5].item() == 0x7E
        out = dequantize_v4(cache)
        assert out[0, 5].item() == at
        assert out[1, 5].item() == pytest.approx(at, rel=2**-4)


def v32_scales(cache: torch.Tensor, slot: int) -> list[float]:
    block_size = cache.shape[1]
    block, t = divmod(slot, block_size)
    start = cache.storage_offset() + block * cache.stride(0) + t * cache.stride(1) + 512
    return np.frombuffer(storage_bytes(cache)[start : start + 16].tobytes(), "<f4").tolist()


def test_v32_pow2_and_raw_scales() -> None:
    kv = torch.zeros(1, 576)
    for tile, amax in enumerate([100.0, 0.0, 448.0, 1e-5]):
        kv[0, tile * 128 + 7] = -amax
    raw = quantize_v32(kv, 1, scale="raw")
    pow2 = quantize_v32(kv, 1, scale="pow2")
    f32 = np.float32
    tiny = float(np.finfo(np.float32).tiny)
    assert v32_scales(raw, 0) == [
        float(f32(100) / f32(448)),
        tiny,
        1.0,
        float(f32(1e-5) / f32(448)),
    ]
    # pow2: max(amax/448, 1e-4) rounded up: 0.223 -> 2^-2, floors -> 2^-13, exactly 1 -> 1.
    assert v32_scales(pow2, 0) == [0.25, 2.0**-13, 1.0, 2.0**-13]
    assert raw[0, 0, 0, 7].item() == 0xFE  # -100 / (100/448) = -448
    # -100 / 0.25 = -400, halfway between -384 and -416: to even mantissa, -384 (0xFC).
    assert pow2[0, 0, 0, 7].item() == 0xFC
    assert dequantize_v32(raw)[0, 7].item() == pytest.approx(-100.0, rel=1e-6)
    assert dequantize_v32(pow2)[0, 7].item() == -96.0


def test_v4_reader_uses_stride0_of_a_further_padded_view() -> None:
    page_size, num_pages, padded_stride, offset = 64, 3, 37440 + 3 * 576 + 8, 40
    cache = quantize_v4(random_kv(150, 512, 1.0, seed=3), page_size)
    raw = storage_bytes(cache)
    buf = np.full(offset + num_pages * padded_stride, JUNK, np.uint8)
    for page in range(num_pages):
        src, dst = page * cache.stride(0), offset + page * padded_stride
        buf[dst : dst + page_size * 584] = raw[src : src + page_size * 584]
    shape, strides = (num_pages, page_size, 1, 584), (padded_stride, 584, 584, 1)
    padded = torch.from_numpy(buf).as_strided(shape, strides, offset)
    torch.testing.assert_close(dequantize_v4(padded), dequantize_v4(cache), rtol=0, atol=0)
    slots = torch.tensor([149, 0, 64, 127])
    torch.testing.assert_close(
        gather_tokens(padded, slots), gather_tokens(cache, slots), rtol=0, atol=0
    )


# ---- converters --------------------------------------------------------------------------


def test_split_pages_v4_preserves_bytes_and_slots() -> None:
    num_tokens = 600
    cache = quantize_v4(random_kv(num_tokens, 512, 1.0, seed=5), 256)
    split = split_pages_v4(cache, 64)
    assert split.shape == (12, 64, 1, 584)
    assert split.stride(0) == 37440
    assert split.stride(1) == 584
    old, new = storage_bytes(cache), storage_bytes(split)
    for slot in range(3 * 256):
        p, o = divmod(slot, 256)
        q, r = p * 4 + o // 64, o % 64
        assert q * 64 + r == slot
        src, dst = p * 149760 + o * 576, q * 37440 + r * 576
        assert (new[dst : dst + 576] == old[src : src + 576]).all()
        src, dst = p * 149760 + 256 * 576 + o * 8, q * 37440 + 64 * 576 + r * 8
        assert (new[dst : dst + 8] == old[src : src + 8]).all()
    for q in range(12):
        assert (new[q * 37440 + 64 * 584 : (q + 1) * 37440] == 0).all()
    torch.testing.assert_close(dequantize_v4(split), dequantize_v4(cache), rtol=0, atol=0)


def test_split_pages_v4_of_a_padded_view() -> None:
    cache = build_v4(num_pages=2, page_size=4, page_stride=3000, offset=9)
    split = split_pages_v4(cache, 2)
    assert split.shape == (4, 2, 1, 584)
    assert split.stride(0) == 1728
    torch.testing.assert_close(dequantize_v4(split), dequantize_v4(cache), rtol=0, atol=0)


def test_to_workspace_all_and_listed_slots() -> None:
    cache = quantize_v4(random_kv(100, 512, 1.0, seed=7), 64)
    full = dequantize_v4(cache)
    workspace = to_workspace(cache)
    assert workspace.shape == (128, 1, 512)
    assert workspace.dtype == torch.bfloat16
    # V4 values are e4m3 times a power of two, so bf16 holds them exactly.
    torch.testing.assert_close(workspace[:, 0].float(), full, rtol=0, atol=0)
    slots = torch.tensor([99, 3, 3, 64])
    torch.testing.assert_close(
        to_workspace(cache, slots)[:, 0].float(), full[slots], rtol=0, atol=0
    )
    v32 = quantize_v32(random_kv(10, 576, 1.0, seed=8), 4, scale="raw")
    assert to_workspace(v32, scale_rounding="bf16").shape == (12, 1, 576)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_gather_workspace_remaps_indices_and_keeps_invalid(dtype: torch.dtype) -> None:
    cache = quantize_v32(random_kv(200, 576, 1.0, seed=9), 64)
    indices = torch.tensor(
        [[[150, -1, 7, 150], [3, 3, -1, -1]], [[199, 0, 7, -1], [-1, -1, -1, -1]]], dtype=dtype
    )
    kv, local = gather_workspace(cache, indices)
    valid = indices != -1
    assert kv.shape == (5, 1, 576)  # {0, 3, 7, 150, 199}
    assert kv.dtype == torch.bfloat16
    assert local.shape == indices.shape
    assert local.dtype == dtype
    assert (local[~valid] == -1).all()
    assert (local[valid] >= 0).all()
    expected = gather_tokens(cache, indices[valid]).to(torch.bfloat16)
    torch.testing.assert_close(kv[local[valid].long(), 0], expected, rtol=0, atol=0)
    empty, none = gather_workspace(cache, torch.full((2, 4), -1, dtype=dtype))
    assert empty.shape == (0, 1, 576)
    assert (none == -1).all()


def test_to_plain_rows_bf16() -> None:
    v4 = quantize_v4(random_kv(130, 512, 1.0, seed=11), 64)
    rows, scale = to_plain_rows(v4)
    assert scale is None
    assert rows.shape == (3, 1, 64, 512)
    assert rows.dtype == torch.bfloat16
    torch.testing.assert_close(rows.float().reshape(-1, 512), dequantize_v4(v4), rtol=0, atol=0)
    v32 = quantize_v32(random_kv(10, 576, 1.0, seed=12), 4)
    rows, _ = to_plain_rows(v32)
    assert rows.shape == (3, 1, 4, 512)
    expected = dequantize_v32(v32)[:, :512].to(torch.bfloat16)
    torch.testing.assert_close(rows.reshape(-1, 512), expected, rtol=0, atol=0)


def test_to_plain_rows_e4m3_per_tensor_scale() -> None:
    cache = quantize_v4(random_kv(130, 512, 3.0, seed=13), 64)
    x = dequantize_v4(cache).reshape(3, 1, 64, 512)
    rows, scale = to_plain_rows(cache, dtype="e4m3")
    assert rows.dtype == torch.float8_e4m3fn
    assert rows.shape == (3, 1, 64, 512)
    assert scale is not None
    assert scale.dtype == torch.float32
    assert scale.dim() == 0
    assert scale.item() == pytest.approx(x.abs().max().item() / 448, rel=1e-6)
    assert rows.float().abs().max().item() == 448.0
    err = (rows.float() * scale - x).abs()
    assert (err <= e4m3_bound(x, scale) * (1 + 2.0**-20)).all()


# ---- layout queries and bad input --------------------------------------------------------


def test_layout_of_and_head_dim_of() -> None:
    v4 = quantize_v4(torch.randn(3, 512), 2)
    v32 = quantize_v32(torch.randn(3, 576), 2)
    assert (layout_of(v4), head_dim_of(v4)) == ("v4", 512)
    assert (layout_of(v32), head_dim_of(v32)) == ("v32", 576)
    assert gather_tokens(v4, torch.tensor([2])).shape == (1, 512)
    assert gather_tokens(v32, torch.tensor([2])).shape == (1, 576)


V4_CACHE = quantize_v4(torch.randn(4, 512), 2)
V32_CACHE = quantize_v32(torch.randn(4, 576), 2)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: quantize_v4(torch.randn(4, 576), 2), r"\[N, 512\]"),
        (lambda: quantize_v4(torch.randn(4, 512), 2, convention="trtllm"), "convention"),
        (lambda: quantize_v4(torch.randn(4, 512), 0), "page_size"),
        (lambda: quantize_v4(torch.full((1, 512), float("nan")), 2), "finite"),
        (lambda: quantize_v32(torch.randn(4, 512), 2), r"\[N, 576\]"),
        (lambda: quantize_v32(torch.randn(4, 576), 2, scale="fp8"), "scale"),
        (lambda: quantize_v32(torch.randn(4, 576), 0), "block_size"),
        (lambda: dequantize_v32(V32_CACHE, scale_rounding="fp16"), "scale_rounding"),
        (lambda: dequantize_v32(V4_CACHE), "656"),
        (lambda: dequantize_v4(V32_CACHE), "584"),
        (lambda: layout_of(torch.zeros(1, 2, 1, 600, dtype=torch.uint8)), "656.*584"),
        (lambda: gather_tokens(V4_CACHE, torch.tensor([4])), "slots"),
        (lambda: gather_tokens(V4_CACHE, torch.tensor([-1])), "slots"),
        (lambda: gather_tokens(V4_CACHE, torch.tensor([0.0])), "slots"),
        (lambda: gather_tokens(V4_CACHE.float(), torch.tensor([0])), "1-byte"),
        (lambda: gather_workspace(V32_CACHE, torch.tensor([-2, 0])), "slots"),
        (lambda: split_pages_v4(V4_CACHE, 3), "divide"),
        (lambda: split_pages_v4(V32_CACHE, 1), "584"),
        (lambda: to_plain_rows(V4_CACHE, dtype="fp16"), "dtype"),
    ],
)
def test_bad_input_raises_value_error(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


# ---- the same bytes and values on CUDA ---------------------------------------------------


def all_bytes(cache: torch.Tensor) -> torch.Tensor:
    return torch.as_strided(cache, (cache.untyped_storage().nbytes(),), (1,), 0).cpu()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_matches_cpu_bit_for_bit(dtype: torch.dtype) -> None:
    kv4 = random_kv(700, 512, 2.0**-8, seed=21, dtype=dtype)
    kv4[:40, :64] = 0
    kv4[:40, 0] = 448 * torch.exp2(torch.arange(-30, 10).float())  # scales exactly 2^-30 .. 2^9
    kv32 = random_kv(300, 576, 2.0**-8, seed=22, dtype=dtype)
    for convention in ("flashmla", "vllm", "sglang"):
        cpu = quantize_v4(kv4, 256, convention=convention)
        gpu = quantize_v4(kv4.cuda(), 256, convention=convention)
        assert gpu.is_cuda
        assert torch.equal(all_bytes(gpu), all_bytes(cpu))
        assert torch.equal(dequantize_v4(split_pages_v4(gpu)).cpu(), dequantize_v4(cpu))
    for scale in ("pow2", "raw"):
        cpu = quantize_v32(kv32, 64, scale=scale)
        gpu = quantize_v32(kv32.cuda(), 64, scale=scale)
        assert torch.equal(gpu.cpu(), cpu)
        for rounding in (None, "bf16", "e8m0"):
            expected = dequantize_v32(cpu, scale_rounding=rounding)
            assert torch.equal(dequantize_v32(gpu, scale_rounding=rounding).cpu(), expected)
        indices = torch.randint(-1, 300, (4, 2, 128), generator=torch.Generator().manual_seed(3))
        (kv_cpu, local_cpu), (kv_gpu, local_gpu) = (
            gather_workspace(cpu, indices),
            gather_workspace(gpu, indices.cuda()),
        )
        assert torch.equal(kv_gpu.cpu(), kv_cpu)
        assert torch.equal(local_gpu.cpu(), local_cpu)
        rows_cpu, scale_cpu = to_plain_rows(cpu, dtype="e4m3")
        rows_gpu, scale_gpu = to_plain_rows(gpu, dtype="e4m3")
        assert torch.equal(rows_gpu.cpu().view(torch.uint8), rows_cpu.view(torch.uint8))
        assert torch.equal(scale_gpu.cpu(), scale_cpu)


def test_poison_tokens_writes_nan_records_and_nothing_else():
    from reference import layouts

    for cache in (
        layouts.quantize_v4(torch.randn(130, 512), 64),
        layouts.quantize_v32(torch.randn(130, 576), 64),
    ):
        before = layouts.gather_tokens(cache, torch.arange(192))
        layouts.poison_tokens(cache, torch.tensor([0, 65, 191]))
        after = layouts.gather_tokens(cache, torch.arange(192))
        hit = torch.zeros(192, dtype=torch.bool)
        hit[[0, 65, 191]] = True
        assert torch.isnan(after[hit]).all()
        assert torch.equal(after[~hit], before[~hit])


@pytest.mark.parametrize("layout", ["v32", "v4"])
def test_writers_encode_long_caches_in_chunks_with_the_same_bytes(monkeypatch, layout) -> None:
    """A writer encodes ENCODE_CHUNK tokens at a time (its fp32 temporaries bounded); the
    bytes are those of one pass, across chunk edges and a last partial page."""
    import reference.layouts as layouts

    d = 576 if layout == "v32" else 512
    kv = (torch.randn(203, d, generator=torch.Generator().manual_seed(3)) * 3).to(torch.bfloat16)
    write = (lambda: quantize_v32(kv, 64)) if layout == "v32" else (lambda: quantize_v4(kv, 64))
    whole = write()
    monkeypatch.setattr(layouts, "ENCODE_CHUNK", 50)  # 5 chunks, the last one of 3 tokens
    chunked = write()
    assert torch.equal(whole.view(torch.uint8), chunked.view(torch.uint8))
    assert whole.view(torch.uint8).any()
