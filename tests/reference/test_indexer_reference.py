"""reference/indexer.py against the independent float64 implementation (tests/slow_indexer.py),
and the cache writer/reader, masks, memory tiling and top-k padding."""

from __future__ import annotations

import pytest
import torch

from reference import indexer
from tests.slow_indexer import paged_logits, ragged_logits


def _paged_problem(b=2, next_n=2, heads=4, d=16, block_size=8, ctx=(13, 21), seed=0, two_d=False):
    g = torch.Generator().manual_seed(seed)
    blocks_per_req = -(-max(ctx) // block_size)
    keys = torch.randn(b * blocks_per_req * block_size, d, generator=g) * 3
    cache = indexer.quantize_key_cache(keys, block_size)
    table = torch.randperm(b * blocks_per_req, generator=g).view(b, blocks_per_req).int()
    q = torch.randn(b, next_n, heads, d, generator=g).to(torch.float8_e4m3fn)
    w = torch.randn(b * next_n, heads, generator=g)
    lens = torch.tensor(ctx, dtype=torch.int32)
    if two_d:
        lens = torch.stack([lens - next_n + 1 + j for j in range(next_n)], 1) // 2
    return q, cache, w, lens, table


@pytest.mark.parametrize("two_d", [False, True])
def test_paged_matches_slow_float64(two_d: bool) -> None:
    q, cache, w, lens, table = _paged_problem(two_d=two_d)
    max_len = 24
    got = indexer.paged_mqa_logits(q, cache, w, lens, table, max_len)
    want = paged_logits(q, cache, w, lens, table, max_len)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    fin = torch.isfinite(want)
    assert fin.sum() > 20
    torch.testing.assert_close(got[fin].double(), want[fin], rtol=1e-5, atol=1e-4)


def test_paged_1d_mask_is_causal_over_last_next_n_positions() -> None:
    q, cache, w, lens, table = _paged_problem(next_n=3, ctx=(5, 9))
    got = indexer.paged_mqa_logits(q, cache, w, lens, table, 16)
    finite = torch.isfinite(got).sum(1).tolist()
    assert finite == [3, 4, 5, 7, 8, 9]  # query j of a request of n tokens sees n - next_n + j + 1


def test_paged_tiles_do_not_change_the_answer() -> None:
    q, cache, w, lens, table = _paged_problem()
    whole = indexer.paged_mqa_logits(q, cache, w, lens, table, 24)
    tiny = indexer.paged_mqa_logits(q, cache, w, lens, table, 24, block_bytes=1)
    assert torch.equal(torch.isinf(whole), torch.isinf(tiny))
    torch.testing.assert_close(whole, tiny, rtol=1e-6, atol=1e-5)  # summation order only


def test_ragged_matches_slow_float64_and_packs() -> None:
    g = torch.Generator().manual_seed(3)
    s_len, n, heads, d = 5, 19, 4, 16
    cache = indexer.quantize_key_cache(torch.randn(n, d, generator=g), 8)
    kv, scales = indexer.split_key_cache(cache, n)
    q = torch.randn(s_len, heads, d, generator=g).to(torch.float8_e4m3fn)
    w = torch.randn(s_len, heads, generator=g)
    ks = torch.tensor([0, 2, 0, 5, 7], dtype=torch.int32)
    ke = torch.tensor([15, 16, 17, 18, 19], dtype=torch.int32)
    got = indexer.mqa_logits(q, (kv, scales), w, ks, ke, block_bytes=64)
    want = ragged_logits(q, kv, scales, w, ks, ke)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    fin = torch.isfinite(want)
    torch.testing.assert_close(got[fin].double(), want[fin], rtol=1e-5, atol=1e-4)
    packed = indexer.mqa_logits(q, (kv, scales), w, ks, ke, max_seqlen_k=int((ke - ks).max()))
    for i in range(s_len):
        width = int(ke[i] - ks[i])
        torch.testing.assert_close(packed[i, :width], got[i, ks[i] : ke[i]], rtol=1e-6, atol=1e-5)
        assert torch.isinf(packed[i, width:]).all()


def test_cache_writer_is_deepgemm_layout_and_reader_inverts_it() -> None:
    g = torch.Generator().manual_seed(1)
    keys = torch.randn(70, 32, generator=g)
    keys[3] = 0.0  # amax floor 1e-4
    cache = indexer.quantize_key_cache(keys, 64)
    assert cache.shape == (2, 64, 1, 36) and cache.dtype == torch.uint8
    raw = cache[0].reshape(-1)
    scale1 = raw[64 * 32 + 4 : 64 * 32 + 8].view(torch.float32)  # token 1's scale, after all data
    assert scale1.item() == pytest.approx(keys[1].abs().max().item() / 448.0, rel=1e-6)
    assert raw[64 * 32 + 12 : 64 * 32 + 16].view(torch.float32).item() == pytest.approx(1e-4 / 448)
    back = indexer.dequantize_key_cache(cache)[:70]
    torch.testing.assert_close(back, keys, rtol=0.07, atol=1e-6)  # e4m3: 3 mantissa bits
    assert back[:, :].abs().amax(1)[:3].tolist() == pytest.approx(keys.abs().amax(1)[:3].tolist())


def test_reader_honours_block_stride() -> None:
    cache = indexer.quantize_key_cache(torch.randn(20, 16), 8)
    big = torch.randint(0, 256, (3, 8 * 20 + 40), dtype=torch.uint8)
    view = torch.as_strided(big, cache.shape, (8 * 20 + 40, 20, 20, 1), 0)
    view.copy_(cache)
    assert torch.equal(indexer.dequantize_key_cache(view), indexer.dequantize_key_cache(cache))


def test_topk_pads_with_minus_one_and_orders_descending() -> None:
    logits = torch.tensor([[1.0, 5.0, float("-inf"), 3.0], [float("-inf")] * 4])
    assert indexer.topk_indices(logits, 3).tolist() == [[1, 3, 0], [-1, -1, -1]]
    assert indexer.topk_indices(logits, 6).tolist()[0] == [1, 3, 0, -1, -1, -1]


def test_configs() -> None:
    v32, flash, pro = (indexer.INDEXERS[m] for m in ("v3.2", "v4-flash", "v4-pro"))
    assert (v32.heads, v32.head_dim, v32.topk, v32.compress_ratio) == (64, 128, 2048, 1)
    assert (flash.topk, pro.topk, flash.compress_ratio) == (512, 1024, 4)
    assert flash.visible(torch.tensor([0, 3, 4095])).tolist() == [0, 1, 1024]
