"""The shared page-size-1 conversion (backends/paged_rows.py) that FA3 and FlashInfer's sm90
path feed their kernels: index lists, the joined decode lists, page tables, the bf16 pool,
the sink scaling and the no-key lse, on small hand-built and generated inputs."""

from __future__ import annotations

import math

import torch

from dsv4bench.backends import paged_rows
from dsv4bench.backends.flashinfer import sm90
from dsv4bench.cases.case import Case
from dsv4bench.cases.inputs import make_inputs
from reference import layouts

V4 = dict(model="v4-flash", d_qk=512, d_v=512, layout="v4", num_heads=4, topk=128, window=128,
          extra_topk=64, compress_ratio=4, page_size=256, sink=True, batch_size=2, s_q=2,
          context_len=1024)  # fmt: skip


def same(a, b) -> bool:
    """Equal bit for bit as values, NaN (a poisoned, unused slot) where both are NaN."""
    return a.shape == b.shape and bool(((a == b) | (a.isnan() & b.isnan())).all())


def test_a_rows_list_is_its_valid_entries_before_its_length():
    idx = torch.tensor([[3, -1, 5, 7], [2, 4, -1, -1]])
    assert paged_rows.row_lists(idx).tolist() == [
        [True, False, True, True],
        [True, True, False, False],
    ]
    lengths = torch.tensor([3, 1])
    assert paged_rows.row_lists(idx, lengths).tolist() == [
        [True, False, True, False],
        [True, False, False, False],
    ]
    prefill = torch.tensor([[0, 5, -2, 9]])  # prefill: invalid below 0 or from the key count
    assert paged_rows.row_lists(prefill, limit=6).tolist() == [[True, True, False, False]]


def test_decode_lists_join_the_extra_cache_past_the_main_slots():
    x = {
        "q": torch.zeros(1, 2, 4, 512),
        "k_cache": torch.zeros(2, 4, 1, 584, dtype=torch.uint8),  # 8 main slots
        "extra_k_cache": torch.zeros(1, 4, 1, 584, dtype=torch.uint8),
        "indices": torch.tensor([[[1, 6], [7, -1]]]),
        "extra_indices": torch.tensor([[[0, -1], [3, 2]]]),
        "topk_length": torch.tensor([1]),  # per request: each of its query tokens
        "extra_topk_length": None,
    }
    caches, idx, ok = paged_rows.decode_lists(x)
    assert len(caches) == 2
    assert idx.tolist() == [[1, 6, 8, -1], [7, -1, 11, 10]]
    assert ok.tolist() == [[True, False, True, False], [True, False, True, True]]


def test_page_table_puts_each_rows_list_first_and_zero_after():
    idx = torch.tensor([[9, -1, 4, 7], [-1, -1, -1, -1]])
    table, lens = paged_rows.page_table(idx, paged_rows.row_lists(idx))
    assert table.tolist() == [[9, 4, 7, 0], [0, 0, 0, 0]] and lens.tolist() == [3, 0]
    assert table.dtype == lens.dtype == torch.int32
    flat, qo, kv_indptr, kv_len = paged_rows.flat_lists(idx, paged_rows.row_lists(idx))
    assert flat.tolist() == [9, 4, 7] and qo.tolist() == [0, 1, 2]
    assert kv_indptr.tolist() == [0, 3, 3] and kv_len.tolist() == [3, 0]
    empty = torch.full((2, 3), -1)
    assert paged_rows.flat_lists(empty, paged_rows.row_lists(empty))[0].tolist() == [0]


def test_the_bf16_pool_holds_every_slot_of_both_caches_in_order():
    case = Case(scenario="t", op="decode", **V4)
    x = make_inputs(case, "cpu")
    caches = [x["k_cache"], x["extra_k_cache"]]
    rows, exact = paged_rows.bf16_pool(caches, 512, "v4", check_exact=True)
    want = torch.cat([
        layouts.gather_tokens(c, torch.arange(c.shape[0] * c.shape[1]), layout="v4")
        for c in caches
    ])  # fmt: skip
    assert rows.dtype == torch.bfloat16
    assert same(rows.float(), want.to(torch.bfloat16).float()) and same(rows.float(), want)
    assert exact is True  # V4's e4m3 * power-of-two values are exact in bf16
    assert paged_rows.bf16_pool(caches, 512, "v4")[1] is None
    chunks = list(paged_rows.gather_chunks(caches, "v4", chunk=100))
    assert [s for s, _ in chunks][:3] == [0, 100, 200]
    assert same(torch.cat([v for _, v in chunks]), want)
    # FlashInfer's sm90 pool is the same rows, viewed [slots, 1, ckv | kpe]
    pool = sm90.bf16_pool_from_caches(caches, 512, "v4")
    assert same(pool.ckv[:, 0].float(), rows.float()) and pool.kpe.shape == (rows.shape[0], 1, 0)


def test_the_sink_takes_its_share_and_a_row_without_keys_says_plus_inf():
    out = torch.ones(3, 2, 4)
    lse = torch.tensor([[0.0, 1.0], [2.0, -1.0], [0.5, 0.5]])
    sink = torch.tensor([0.0, 1.0])
    paged_rows.scale_by_sink(out, lse, sink)
    share = torch.exp(lse) / (torch.exp(lse) + torch.exp(sink))
    assert torch.allclose(out, share[..., None].expand(3, 2, 4))
    fixed = paged_rows.no_key_lse(torch.tensor([-math.inf, 0.5, math.inf]))
    assert fixed.tolist() == [math.inf, 0.5, math.inf]
