"""The indexer's paged FP8 key cache as a layout (reference/layouts_indexer.py) against a brute
force: one key at a time, bytes placed by the addresses vLLM 0.33.0's indexer_k_quant_and_cache
computes (block * stride + offset * head_dim for the key, block * stride + block_size *
head_dim + offset * 4 for its fp32 scale), the ue8m0 scale from math.log2 in float64."""

from __future__ import annotations

import math

import pytest
import torch

from reference import indexer, layouts_indexer
from reference.cache_write import cache_write, encode
from reference.layout_table import LAYOUTS, of_width
from reference.layouts import gather_tokens

D = 128


def _brute_cache(keys: torch.Tensor, page_size: int, convention: str) -> torch.Tensor:
    n = keys.shape[0]
    pages = -(-n // page_size)
    flat = bytearray(pages * page_size * (D + 4))
    padded = torch.zeros(pages * page_size, D)
    padded[:n] = keys
    for t in range(pages * page_size):
        x = padded[t]
        s = float(torch.tensor(max(float(x.abs().max()), 1e-4), dtype=torch.float32) / 448.0)
        if convention == "ue8m0":
            s = 2.0 ** math.ceil(math.log2(s))
        q = (x * torch.tensor(1.0 / s, dtype=torch.float32)).to(torch.float8_e4m3fn)
        page, offset = divmod(t, page_size)
        base = page * page_size * (D + 4)
        at = base + offset * D
        flat[at : at + D] = bytes(q.view(torch.uint8).tolist())
        at = base + page_size * D + offset * 4
        flat[at : at + 4] = bytes(torch.tensor([s], dtype=torch.float32).view(torch.uint8).tolist())
    return torch.tensor(list(flat), dtype=torch.uint8).view(pages, page_size, 1, D + 4)


@pytest.mark.parametrize("convention", ["ue8m0", "raw"])
@pytest.mark.parametrize("page_size", [1, 4, 64])
def test_the_writer_places_every_byte_where_vllms_kernel_does(convention, page_size):
    g = torch.Generator().manual_seed(page_size)
    keys = (torch.randn(70, D, generator=g) * torch.rand(70, 1, generator=g) * 5).bfloat16()
    got = LAYOUTS["indexer-fp8"].writer()(keys.float(), page_size, convention)
    assert torch.equal(got, _brute_cache(keys.float(), page_size, convention))
    scales = layouts_indexer.record_views(got)[1].reshape(-1, 4).contiguous().view(torch.float32)
    if convention == "ue8m0":  # powers of two, each >= amax / 448
        m, _ = torch.frexp(scales)
        assert bool((m == 0.5).all())


def test_it_is_deepgemms_layout_and_reads_back_within_fp8():
    keys = torch.randn(40, D)
    cache = layouts_indexer.quantize_indexer(keys, 8, "raw")
    assert torch.equal(cache, indexer.quantize_key_cache(keys, 8))
    back = gather_tokens(cache, torch.arange(40), layout="indexer-fp8")
    assert torch.equal(back, indexer.dequantize_key_cache(cache)[:40])
    assert (back - keys).abs().max() < 0.07 * keys.abs().max()
    assert of_width(132) is LAYOUTS["indexer-fp8"]


def test_the_pow2_rule_is_exact_at_powers_of_two():
    s = torch.tensor([0.25, 0.25000003, 3.0, 1e-4 / 448], dtype=torch.float32)
    floor = 2.0 ** math.ceil(math.log2(1e-4 / 448))
    assert indexer._pow2_ceil(s).tolist() == [0.25, 0.5, 4.0, floor]
    with pytest.raises(ValueError, match="scale_fmt must be one of"):
        indexer.quantize_key_cache(torch.zeros(1, D), 1, "e8m0")


def test_a_write_changes_only_its_slots_records_and_gather_requests_reads_them():
    keys = torch.randn(16, D)
    cache = layouts_indexer.quantize_indexer(keys, 4)
    new = torch.randn(2, D).bfloat16()
    out = cache_write(new, torch.tensor([9, -1]), cache, layout="indexer-fp8")
    changed = (out != cache).view(4, -1).any(1)  # per page
    assert changed.tolist() == [False, False, True, False]
    records = encode(new[:1], "indexer-fp8")
    table = torch.tensor([[2, 0], [3, 1]], dtype=torch.int32)
    got = layouts_indexer.gather_requests(out, table, [6, 3])
    assert got.shape == (9, 132)
    assert torch.equal(got[1], records[0])  # request 0, position 1: page 2 offset 1 = slot 9
    brute = _brute_cache(keys, 4, "ue8m0").view(-1)
    # request 1, position 2: page 3, offset 2; its key at 3*528 + 2*128, scale at +512 + 2*4
    assert torch.equal(got[8, :D], brute[3 * 528 + 256 : 3 * 528 + 384])
    assert torch.equal(got[8, D:], brute[3 * 528 + 512 + 8 : 3 * 528 + 512 + 12])
