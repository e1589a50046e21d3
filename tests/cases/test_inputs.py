"""Inputs are deterministic, laid out as engines lay them out, and the same for both routes."""

from __future__ import annotations

from dataclasses import replace

import torch

from dsv4bench.cases.case import Case
from dsv4bench.cases.inputs import fingerprint, make_inputs
from dsv4bench.cases.oracle import oracle_call

V4 = Case(
    scenario="t",
    op="decode",
    model="v4-flash",
    d_qk=512,
    d_v=512,
    num_heads=8,
    batch_size=3,
    topk=128,
    extra_topk=64,
    context_len=1024,
    page_size=64,
    layout="v4",
    sink=True,
    scale_convention="flashmla",
    window=128,
    compress_ratio=4,
)
V32 = replace(
    V4,
    model="v3.2",
    d_qk=576,
    layout="v32",
    topk=128,
    extra_topk=0,
    window=0,
    compress_ratio=0,
    sink=False,
    scale_convention="pow2",
)


def test_same_case_same_tensors_and_fingerprint():
    a, b = make_inputs(V4, "cpu"), make_inputs(V4, "cpu")
    assert fingerprint(a) == fingerprint(b)
    assert torch.equal(a["q"], b["q"]) and torch.equal(a["extra_indices"], b["extra_indices"])
    assert fingerprint(make_inputs(replace(V4, seed=1), "cpu")) != fingerprint(a)


def test_v4_decode_indices_are_the_window_and_distinct_compressed_entries():
    x = make_inputs(V4, "cpu")
    idx, extra = x["indices"], x["extra_indices"]
    assert idx.shape == (3, 1, 128) and extra.shape == (3, 1, 64)
    assert idx.dtype == torch.int32 and (idx >= 0).all()  # context >= window: all visible
    for row in extra.view(-1, 64):
        assert len(set(row.tolist())) == 64  # top-k picks distinct entries
    slots = x["extra_k_cache"].shape[0] * x["extra_k_cache"].shape[1]
    assert int(extra.max()) < slots
    assert x["attn_sink"].shape == (8,)


def test_early_positions_pad_with_minus_one_valid_first():
    case = replace(V32, context_len=100, topk=128, batch_size=1, s_q=2)
    idx = make_inputs(case, "cpu")["indices"][0]
    valid = (idx >= 0).sum(-1).tolist()
    assert valid == [99, 100]  # query j sees positions [0, context_len - s_q + j]
    for row, n in zip(idx, valid, strict=True):
        assert (row[:n] >= 0).all() and (row[n:] == -1).all()


def test_the_three_prefill_routes_see_the_same_problem():
    chunk = replace(V4, op="prefill", tokens=192, batch_size=1, context_len=512)
    sparse = replace(chunk, route="sparse-prefill")
    decode = replace(chunk, route="decode-kernel")
    mixed = replace(chunk, route="decode-mixed")
    xs, xd, xm = (make_inputs(c, "cpu") for c in (sparse, decode, mixed))
    assert xs["indices"].shape[-1] % 128 == 0
    assert xd["q"].shape == (192, 1, 8, 512) and xd["indices"].shape == (192, 1, 128)
    # vLLM's mixed batch: the chunk is one request of 192 query tokens, the same tensors
    assert xm["q"].shape == (1, 192, 8, 512) and xm["indices"].shape == (1, 192, 128)
    assert xm["extra_indices"].shape == (1, 192, chunk.extra_topk)
    for key in ("q", "indices", "extra_indices"):
        assert torch.equal(xm[key].flatten(0, 1), xd[key].flatten(0, 1))
    a, b, m = oracle_call(sparse, xs)(), oracle_call(decode, xd)(), oracle_call(mixed, xm)()
    assert m.out.shape == (192, 8, 512) and m.lse.shape == (192, 8)
    torch.testing.assert_close(a.out, b.out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a.lse, b.lse, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(m.out, b.out, rtol=0, atol=0)
    torch.testing.assert_close(m.lse, b.lse, rtol=0, atol=0)


def test_v32_prefill_routes_agree_too():
    chunk = replace(V32, op="prefill", tokens=100, batch_size=1, context_len=300)
    a = oracle_call(replace(chunk, route="sparse-prefill"), make_inputs(chunk, "cpu"))()
    dk = replace(chunk, route="decode-kernel")
    b = oracle_call(dk, make_inputs(dk, "cpu"))()
    # the bf16 workspace rounds V3.2's e4m3 x fp32-scale values; the FP8 path does not
    torch.testing.assert_close(a.out, b.out, rtol=2e-2, atol=2e-2)


def test_slots_no_index_names_are_nan():
    from reference.layouts import gather_tokens

    unused = 0
    for case in (V4, V32):
        x = make_inputs(case, "cpu")
        for cache_key, idx_key in (("k_cache", "indices"), ("extra_k_cache", "extra_indices")):
            if cache_key not in x:
                continue
            cache = x[cache_key]
            values = gather_tokens(cache, torch.arange(cache.shape[0] * cache.shape[1]))
            used = torch.zeros(values.shape[0], dtype=torch.bool)
            used[x[idx_key][x[idx_key] >= 0].long()] = True
            assert torch.isfinite(values[used]).all()
            assert torch.isnan(values[~used]).all()
            unused += int((~used).sum())
    assert unused > 0
