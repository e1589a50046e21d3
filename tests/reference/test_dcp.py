"""One DCP rank's slots (reference/dcp.py) against a brute force that deals each request's
tokens to the ranks one at a time and looks every index up in the rank's shard."""

from __future__ import annotations

import pytest
import torch

from reference import dcp, indices


def dealt(n: int, ranks: int, group: int) -> list[list[int]]:
    """Tokens 0..n-1 handed out `group` at a time, round-robin: each rank's shard in order."""
    shards: list[list[int]] = [[] for _ in range(ranks)]
    for start in range(0, n, group):
        shards[(start // group) % ranks].extend(range(start, min(start + group, n)))
    return shards


def brute(idx, table, page_size, ranks, rank, group):
    most = int(idx.max()) + 1 if idx.numel() else 0
    shard = dealt(most, ranks, group)[rank]
    at = {p: j for j, p in enumerate(shard)}
    rows = table.tolist()
    out = []
    for r, entries in enumerate(idx.reshape(idx.shape[0], -1).tolist()):
        for i in entries:
            j = at.get(i)
            if j is None or j // page_size >= len(rows[r]) or rows[r][j // page_size] < 0:
                out.append(-1)
            else:
                out.append(rows[r][j // page_size] * page_size + j % page_size)
    return torch.tensor(out, dtype=idx.dtype).reshape(idx.shape)


@pytest.mark.parametrize(
    "ranks,rank,group,page_size",
    [(2, 0, 1, 4), (2, 1, 1, 4), (4, 3, 2, 4), (3, 1, 4, 8), (8, 5, 1, 16), (1, 0, 1, 4)],
)
def test_local_slots_match_the_dealt_shards(ranks, rank, group, page_size):
    g = torch.Generator().manual_seed(ranks * 100 + rank * 10 + group)
    b, s_q, k, context = 3, 2, 24, 90
    pages = dcp.table_pages(context, page_size, ranks)
    table = torch.randperm(b * pages * 2, generator=g)[: b * pages].view(b, pages).int()
    table[1, 0] = -1  # an unallocated page: -1
    idx = torch.randint(-1, context + 40, (b, s_q, k), generator=g).int()  # -1s, past the table
    got = dcp.local_slots(idx, table, page_size, ranks, rank, group)
    want = brute(idx, table, page_size, ranks, rank, group)
    assert torch.equal(got, want) and got.dtype == torch.int32
    assert bool((got >= 0).any()) and bool((got < 0).any())


def test_every_position_has_exactly_one_owner_and_shards_add_up():
    for ranks, group in ((1, 1), (2, 1), (4, 2), (3, 8)):
        for n in (0, 1, 7, 64, 97):
            shards = dealt(n, ranks, group)
            assert [dcp.shard_len(n, ranks, r, group) for r in range(ranks)] == list(
                map(len, shards)
            )
            pos = torch.arange(n)
            for r, shard in enumerate(shards):
                mine = pos[dcp.owner(pos, ranks, group) == r]
                assert mine.tolist() == shard
                assert dcp.local_position(mine, ranks, group).tolist() == list(range(len(shard)))


def test_the_table_width_holds_every_shard():
    for ranks, group, page_size, n in ((2, 1, 64, 8193), (4, 64, 64, 129), (8, 16, 64, 1000)):
        pages = dcp.table_pages(n, page_size, ranks)
        assert all(dcp.shard_len(n, ranks, r, group) <= pages * page_size for r in range(ranks))


def test_one_rank_is_the_plain_remap():
    g = torch.Generator().manual_seed(1)
    table = torch.randperm(16, generator=g).view(2, 8).int()
    idx = torch.randint(-1, 40, (2, 3, 10), generator=g).int()
    assert torch.equal(dcp.local_slots(idx, table, 4, 1, 0), indices.to_global_slots(idx, table, 4))


@pytest.mark.parametrize(
    "ranks,rank,group,message",
    [(2, 2, 1, "dcp_rank < dcp_size"), (0, 0, 1, "dcp_rank < dcp_size"), (2, 0, 3, "divide")],
)
def test_a_configuration_the_engine_refuses_is_refused(ranks, rank, group, message):
    idx, table = torch.zeros(1, 1, 4, dtype=torch.int32), torch.zeros(1, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match=message):
        dcp.local_slots(idx, table, 4, ranks, rank, group)


def test_compact_moves_each_rows_slots_to_its_front_in_order():
    g = torch.Generator().manual_seed(7)
    slots = torch.randint(-1, 50, (3, 2, 16), generator=g)
    slots[slots % 3 == 0] = -1
    want = [
        [v for v in row if v >= 0] + [-1] * sum(v < 0 for v in row)
        for row in slots.reshape(-1, 16).tolist()
    ]
    got = dcp.compact(slots.int())
    assert got.reshape(-1, 16).tolist() == want and got.dtype == torch.int32
    assert not torch.equal(got, slots.int())  # interior gaps closed
