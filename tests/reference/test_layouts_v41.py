"""The V4.1 528 / 288-byte records and V32_NO_ROPE against a brute-force, byte-by-byte codec
written from the record descriptions (flash_mla_interface.py, vLLM 0.33.0 cache_utils.py)."""

from __future__ import annotations

import math
import struct

import pytest
import torch

from reference import layouts_v41 as lv
from reference.layout_table import LAYOUTS, of_width
from reference.layouts import gather_tokens, to_workspace

# ---- the brute force: one Python float at a time ------------------------------------------


def e4m3_value(byte: int) -> float:
    sign = -1.0 if byte & 0x80 else 1.0
    exp, man = (byte >> 3) & 0xF, byte & 7
    if exp == 0xF and man == 7:
        return math.nan
    if exp == 0:
        return sign * man / 8 * 2.0**-6
    return sign * (1 + man / 8) * 2.0 ** (exp - 7)


def nearest_e4m3(x: float) -> int:
    """The e4m3 byte nearest x (ties: even mantissa), saturating at +-448."""
    best = None
    for byte in range(256):
        v = e4m3_value(byte)
        if math.isnan(v) or (v == 0 and byte == 0x80):
            continue
        key = (abs(v - min(max(x, -448.0), 448.0)), byte & 1)
        if best is None or key < best[0]:
            best = (key, byte)
    byte = best[1]
    return byte | 0x80 if x < 0 and byte == 0 else byte


E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def nearest_e2m1(x: float) -> int:
    mag = min(abs(x), 6.0)
    best = min(range(8), key=lambda c: (abs(E2M1[c] - mag), c & 1))
    return best | (8 if math.copysign(1.0, x) < 0 else 0)


def brute_v41(token: list[float]) -> bytes:
    values, scales = [], []
    for t in range(16):
        tile = token[32 * t : 32 * t + 32]
        exp = math.ceil(math.log2(max(max(abs(v) for v in tile), 1e-4) / 448))
        scales.append(exp + 127)
        values += [nearest_e4m3(v / 2.0**exp) for v in tile]
    return bytes(values + scales)


def brute_v41_fp4(token: list[float]) -> bytes:
    codes, scales = [], []
    for t in range(32):
        tile = token[16 * t : 16 * t + 16]
        scale_byte = nearest_e4m3(min(max(max(abs(v) for v in tile) / 6, 2.0**-9), 448.0))
        scales.append(scale_byte)
        codes += [nearest_e2m1(v / e4m3_value(scale_byte)) for v in tile]
    packed = [codes[2 * i] | codes[2 * i + 1] << 4 for i in range(256)]
    return bytes(packed + scales)


def read_v41(record: bytes) -> list[float]:
    return [e4m3_value(record[i]) * 2.0 ** (record[512 + i // 32] - 127) for i in range(512)]


def read_v41_fp4(record: bytes) -> list[float]:
    out = []
    for i in range(512):
        code = record[i // 2] >> (4 * (i % 2)) & 0xF
        value = -E2M1[code & 7] if code & 8 else E2M1[code & 7]
        out.append(value * e4m3_value(record[256 + i // 16]))
    return out


def read_v32_nope(record: bytes) -> list[float]:
    scales = struct.unpack("<4f", record[512:528])
    return [e4m3_value(record[i]) * scales[i // 128] for i in range(512)]


# ---- inputs ----------------------------------------------------------------------------------


def _kv(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    kv = (
        torch.randn(n, 512, generator=g)
        * torch.logspace(-3, 2, 512)[torch.randperm(512, generator=g)]
    )
    kv[0, :64] = 0.0  # an all-zero tile: the scale floors
    kv[1, :16] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 2)  # e2m1 ties
    return kv


WRITERS = {
    "v41": (lv.quantize_v41, brute_v41, read_v41),
    "v41-fp4": (lv.quantize_v41_fp4, brute_v41_fp4, read_v41_fp4),
}


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_writer_matches_the_brute_force_bytes(name):
    write, brute, _ = WRITERS[name]
    kv = _kv(3)
    cache = write(kv, 2)
    assert cache.shape == (2, 2, 1, LAYOUTS[name].token_bytes)
    flat = cache.view(-1, cache.shape[-1])
    for t in range(3):
        assert bytes(flat[t].tolist()) == brute(kv[t].tolist()), f"token {t}"
    assert not flat[3].any()  # the slot past N stays zero


@pytest.mark.parametrize("name", ["v41", "v41-fp4", "v32-nope"])
def test_reader_matches_the_brute_force_values(name):
    lay = LAYOUTS[name]
    cache = lay.writer()(_kv(4, seed=1), 4)
    flat = cache.view(-1, lay.token_bytes)
    brute_read = {"v41": read_v41, "v41-fp4": read_v41_fp4, "v32-nope": read_v32_nope}[name]
    want = torch.tensor([brute_read(bytes(r.tolist())) for r in flat])
    got = lay.reader()(cache)
    assert torch.equal(got, want)
    slots = torch.tensor([3, 0])
    assert torch.equal(gather_tokens(cache, slots, layout=name), want[slots])


@pytest.mark.parametrize(
    "name, rel",
    [("v41", 2.0**-3), ("v41-fp4", 2.0**-1), ("v32-nope", 2.0**-3)],  # e4m3: 3 mantissa bits
)
def test_round_trip_is_within_one_step_of_each_tile_scale(name, rel):
    lay = LAYOUTS[name]
    kv = _kv(5, seed=2)
    back = lay.reader()(lay.writer()(kv, 8))[:5]
    tiles, back_tiles = kv.unflatten(-1, (-1, lay.tile)), back.unflatten(-1, (-1, lay.tile))
    amax = tiles.abs().amax(-1, keepdim=True)
    assert ((back_tiles - tiles).abs() <= rel * amax + 1e-6).all()
    exact = torch.zeros(1, 512)
    exact[0, :8] = torch.tensor([1.0, -2.0, 0.5, 4.0, 3.0, -6.0, 1.5, 0.0])
    assert torch.equal(lay.reader()(lay.writer()(exact, 1)), exact)


def test_fp4_packs_the_even_value_in_the_low_nibble():
    kv = torch.zeros(1, 512)
    kv[0, 0], kv[0, 1] = 6.0, -1.0  # scale 1: codes 7 and 8 | 2
    record = lv.quantize_v41_fp4(kv, 1).view(-1)
    assert record[0] == (0x7 | 0xA << 4)
    assert e4m3_value(int(record[256])) == 1.0


def test_the_528_byte_width_names_two_layouts():
    assert LAYOUTS["v41"].token_bytes == LAYOUTS["v32-nope"].token_bytes == 528
    assert of_width(528) is None  # a name is needed: the width alone is ambiguous
    cache = lv.quantize_v41(_kv(2), 2)
    with pytest.raises(ValueError, match="528"):
        gather_tokens(cache, torch.tensor([0]))
    ws = to_workspace(cache, layout="v41")
    assert ws.shape == (2, 1, 512) and ws.dtype == torch.bfloat16


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="512"):
        lv.quantize_v41(torch.zeros(2, 576), 2)
    with pytest.raises(ValueError, match="convention"):
        lv.quantize_v41_fp4(torch.zeros(2, 512), 2, convention="sglang")
    with pytest.raises(ValueError, match="slots"):
        lv.gather_v41(lv.quantize_v41(torch.zeros(2, 512), 2), torch.tensor([2]))
    with pytest.raises(ValueError, match="288-byte"):
        lv.dequantize_v41_fp4(lv.quantize_v41(torch.zeros(2, 512), 2))
