"""vLLM's chunked prefill workspace in the oracle (reference/prefill_chunks.py) against a
brute force: one index at a time, from vLLM's docstrings and its worked example."""

from __future__ import annotations

import pytest
import torch

from reference import prefill_chunks as pc
from reference.layout_table import LAYOUTS
from reference.layouts import gather_tokens


def test_vllms_worked_example():
    # flashmla_sparse.py: seq_lens=[10,15,20,5], chunks=[[0,2],[2,4]] -> starts [0,10,0,20]
    seq_lens = [10, 15, 20, 5]
    chunks = pc.split_prefill_chunks(seq_lens, 25)
    assert chunks == [(0, 2), (2, 4)]
    assert pc.workspace_starts(seq_lens, chunks) == [0, 10, 0, 20]


def test_workspace_rows_follow_the_factor_rule():
    assert pc.workspace_rows(163840) == 5 * 163840
    assert pc.workspace_rows(1 << 20) == 2 * (1 << 20)
    assert pc.workspace_rows(4096, factor=3) == 3 * 4096


def test_a_context_longer_than_the_workspace_is_refused():
    with pytest.raises(ValueError, match="exceeds the 8 rows"):
        pc.split_prefill_chunks([3, 9], 8)


def brute_chunks(seq_lens, rows):
    chunks, current, total = [], [], 0
    for r, s in enumerate(seq_lens):
        if current and total + s > rows:
            chunks.append((current[0], current[-1] + 1))
            current, total = [], 0
        current.append(r)
        total += s
    if current:
        chunks.append((current[0], current[-1] + 1))
    return chunks


@pytest.mark.parametrize("seed", range(5))
def test_chunks_match_the_brute_force(seed):
    g = torch.Generator().manual_seed(seed)
    seq_lens = torch.randint(1, 40, (9,), generator=g).tolist()
    assert pc.split_prefill_chunks(seq_lens, 50) == brute_chunks(seq_lens, 50)


def brute_remap(local, req, table, page_size, prefill, starts):
    out = []
    for t, row in enumerate(local.tolist()):
        got = []
        for i in row:
            if i < 0:
                got.append(-1)
            elif prefill[t] >= 0:
                got.append(int(starts[prefill[t]]) + i)
            elif i // page_size >= table.shape[1] or table[req[t], i // page_size] < 0:
                got.append(-1)
            else:
                got.append(int(table[req[t], i // page_size]) * page_size + i % page_size)
        out.append(got)
    return torch.tensor(out, dtype=local.dtype)


def test_remap_matches_the_brute_force_on_a_mixed_batch():
    g = torch.Generator().manual_seed(3)
    page_size, k = 4, 6
    # two decode requests, then three prefill requests in two chunks
    seq_lens = [7, 12, 9, 14, 5]
    table = torch.randperm(40, generator=g)[:20].view(5, 4).int()
    table[0, 3] = -1  # an unallocated page
    req = torch.tensor([0, 1, 2, 2, 3, 4, 4], dtype=torch.int32)
    prefill = torch.tensor([-1, -1, 0, 0, 1, 2, 2], dtype=torch.int32)
    chunks = pc.split_prefill_chunks(seq_lens[2:], 24)
    starts = torch.tensor(pc.workspace_starts(seq_lens[2:], chunks), dtype=torch.int32)
    local = torch.stack([torch.randint(-1, seq_lens[r], (k,), generator=g) for r in req.tolist()])
    local[0, 0] = 15  # page 3 of request 0: unallocated -> -1
    local[1, 0] = 16  # past the block table -> -1
    local = local.int()
    got = pc.remap(local, req, table, page_size, prefill, starts)
    assert torch.equal(got, brute_remap(local, req, table, page_size, prefill, starts))
    assert got.dtype == torch.int32 and got[0, 0] == -1 and got[1, 0] == -1


def test_gather_workspace_places_each_context_at_its_start():
    lay = LAYOUTS["v32"]
    page_size = 4
    kv = torch.randn(32, lay.d_qk)
    cache = lay.writer()(kv, page_size)
    table = torch.tensor([[5, 2, 7], [1, 0, 6]])
    seq_lens, starts = [10, 6], [0, 10]
    ws = pc.gather_workspace(cache, table, seq_lens, starts, 20, layout="v32")
    assert ws.shape == (20, 576) and ws.dtype == torch.bfloat16
    for r, (n, s) in enumerate(zip(seq_lens, starts, strict=True)):
        for i in range(n):
            slot = int(table[r, i // page_size]) * page_size + i % page_size
            want = gather_tokens(cache, torch.tensor([slot]), layout="v32")[0].bfloat16()
            assert torch.equal(ws[s + i], want)
    assert not ws[16:].any()
