"""Index remapping (reference/indices.py): properties and boundary rules."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reference.indices import (
    c4_visible,
    c128_visible,
    merge_window_extra,
    pad_width,
    ragged_to_global,
    to_global_slots,
    to_workspace_slots,
    window_indices,
    window_visible,
)

SETTINGS = settings(max_examples=60, deadline=None)


@st.composite
def paged_requests(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A block table of distinct pages and request-local positions (some -1) within it."""
    b = draw(st.integers(1, 4))
    page_size = draw(st.sampled_from([1, 2, 4, 64]))
    max_blocks = draw(st.integers(1, 5))
    s_q = draw(st.integers(1, 3))
    topk = draw(st.integers(1, 9))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    num_pages = b * max_blocks + draw(st.integers(0, 5))
    block_table = torch.randperm(num_pages, generator=gen)[: b * max_blocks].view(b, max_blocks)
    local = torch.randint(0, max_blocks * page_size, (b, s_q, topk), generator=gen)
    local[torch.rand(local.shape, generator=gen) < 0.3] = -1
    return local.int(), block_table.int(), page_size


@SETTINGS
@given(paged_requests())
def test_global_slots_round_trip(case: tuple[torch.Tensor, torch.Tensor, int]) -> None:
    local, block_table, page_size = case
    slots = to_global_slots(local, block_table, page_size)
    assert slots.dtype == local.dtype and slots.shape == local.shape
    assert torch.equal(slots == -1, local == -1)
    for r in range(local.shape[0]):
        for i, slot in zip(local[r].flatten().tolist(), slots[r].flatten().tolist(), strict=True):
            if i == -1:
                continue
            page, offset = divmod(slot, page_size)
            block = block_table[r].tolist().index(page)
            assert block * page_size + offset == i


@SETTINGS
@given(paged_requests(), st.integers(1, 3))
def test_global_slots_out_of_range_blocks(
    case: tuple[torch.Tensor, torch.Tensor, int], extra_blocks: int
) -> None:
    local, block_table, page_size = case
    max_blocks = block_table.shape[1]
    beyond = local.clone()
    beyond[local >= 0] += extra_blocks * max_blocks * page_size
    assert bool((to_global_slots(beyond, block_table, page_size) == -1).all())
    unmapped = block_table.clone()
    unmapped[:, 0] = -1
    slots = to_global_slots(local, unmapped, page_size)
    first_block = (local >= 0) & (local < page_size)
    assert bool((slots[first_block] == -1).all())
    assert torch.equal(
        slots[~first_block], to_global_slots(local, block_table, page_size)[~first_block]
    )


def test_global_slots_example() -> None:
    block_table = torch.tensor([[7, 3], [0, -1]])
    local = torch.tensor([[[0, 5, 4, 9, -1]], [[3, 4, 0, -7, 8]]])
    expected = torch.tensor([[[28, 13, 12, -1, -1]], [[3, -1, 0, -1, -1]]])
    assert torch.equal(to_global_slots(local, block_table, 4), expected)


def test_global_slots_rejects_mismatched_batch() -> None:
    with pytest.raises(ValueError, match="block_table"):
        to_global_slots(torch.zeros(2, 1, 3, dtype=torch.long), torch.zeros(3, 4), 4)


@SETTINGS
@given(st.integers(0, 2**31 - 1), st.integers(1, 5), st.integers(0, 7))
def test_workspace_and_ragged_offsets(seed: int, b: int, topk: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    seqlens = torch.randint(1, 50, (b,), generator=gen)
    cu = torch.cat([torch.zeros(1, dtype=torch.long), seqlens.cumsum(0)])
    local = (torch.rand(b, 2, topk, generator=gen) * seqlens[:, None, None]).long()
    local[torch.rand(local.shape, generator=gen) < 0.3] = -1
    ws = to_workspace_slots(local.int(), cu[:-1])
    assert ws.dtype == torch.int32
    assert torch.equal(ws == -1, local == -1)
    assert torch.equal(ws.long()[local >= 0], (local + cu[:-1, None, None])[local >= 0])

    tokens = local.reshape(b * 2, topk)
    req_of_token = torch.arange(b).repeat_interleave(2)
    ragged = ragged_to_global(tokens, cu, req_of_token)
    assert torch.equal(ragged.view(b, 2, topk), ws.long())
    # Every valid global position lands inside its own request's range.
    starts, ends = cu[req_of_token][:, None], cu[req_of_token + 1][:, None]
    valid = tokens >= 0
    assert bool(((ragged >= starts) & (ragged < ends))[valid].all())


@SETTINGS
@given(
    st.integers(0, 300),
    st.sampled_from([4, 64, 128]),
    st.integers(0, 3),
    st.sampled_from([-1, 0, 7]),
)
def test_pad_width(width: int, multiple: int, rows: int, fill: int) -> None:
    idx = torch.arange(rows * width, dtype=torch.int32).view(rows, width)
    padded = pad_width(idx, multiple, fill)
    assert padded.shape[-1] % multiple == 0
    assert width <= padded.shape[-1] < width + multiple
    assert padded.dtype == idx.dtype
    assert torch.equal(padded[:, :width], idx)
    assert bool((padded[:, width:] == fill).all())


@st.composite
def window_extra(draw: st.DrawFn) -> tuple:
    t = draw(st.integers(1, 6))
    kw = draw(st.integers(0, 20))
    ke = draw(st.integers(0, 20))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    window = torch.randint(0, 40, (t, kw), generator=gen)
    extra = torch.randint(0, 40, (t, ke), generator=gen)
    window[torch.rand(window.shape, generator=gen) < 0.2] = -1
    extra[torch.rand(extra.shape, generator=gen) < 0.2] = -1
    wl = torch.randint(0, kw + 1, (t,), generator=gen)
    el = torch.randint(0, ke + 1, (t,), generator=gen)
    s_kv_window = draw(st.integers(1, 1000))
    pad_to = draw(st.sampled_from([1, 4, 64, 128]))
    return window.int(), wl, extra.int(), el, s_kv_window, pad_to


@SETTINGS
@given(window_extra())
def test_merge_window_extra(case: tuple) -> None:
    window, wl, extra, el, s_kv_window, pad_to = case
    idx, lengths = merge_window_extra(window, wl, extra, el, s_kv_window, pad_to=pad_to)
    assert idx.dtype == window.dtype
    assert torch.equal(lengths, wl + el)
    width = idx.shape[1]
    assert width % pad_to == 0 and window.shape[1] + extra.shape[1] <= width
    assert width < window.shape[1] + extra.shape[1] + pad_to
    for r in range(idx.shape[0]):
        w, e = int(wl[r]), int(el[r])
        shifted = [i + s_kv_window if i >= 0 else -1 for i in extra[r, :e].tolist()]
        expected = window[r, :w].tolist() + shifted
        assert idx[r, : w + e].tolist() == expected
        assert bool((idx[r, w + e :] == -1).all())


def test_merge_window_extra_int_lengths_and_errors() -> None:
    window = torch.tensor([[5, 6, 7], [1, -1, 9]])
    extra = torch.tensor([[0, 2], [3, 4]])
    idx, lengths = merge_window_extra(window, 2, extra, 1, 100, pad_to=4)
    # The width follows the input widths (3 + 2 -> 8), not the lengths.
    assert idx.tolist() == [[5, 6, 100] + [-1] * 5, [1, -1, 103] + [-1] * 5]
    assert lengths.tolist() == [3, 3]
    with pytest.raises(ValueError, match="window_len"):
        merge_window_extra(window, 4, extra, 1, 100)
    with pytest.raises(ValueError, match="extra_len"):
        merge_window_extra(window, 1, extra, torch.tensor([0, -1]), 100)


@pytest.mark.parametrize(
    ("pos", "window"),
    [(0, 1), (1, 2), (126, 127), (127, 128), (128, 128), (129, 128), (5000, 128)],
)
def test_window_visible(pos: int, window: int) -> None:
    assert window_visible(pos) == min(pos + 1, 128)
    assert window_visible(torch.tensor([pos])).tolist() == [window]


@pytest.mark.parametrize(
    ("pos", "c4", "c4_capped", "c128"),
    [
        (0, 0, 0, 0),
        (2, 0, 0, 0),
        (3, 1, 1, 0),
        (4, 1, 1, 0),
        (7, 2, 2, 0),
        (126, 31, 31, 0),
        (127, 32, 32, 1),
        (128, 32, 32, 1),
        (254, 63, 63, 1),
        (255, 64, 64, 2),
        (4095, 1024, 512, 32),
        (4096, 1024, 512, 32),
    ],
)
def test_compressed_visible(pos: int, c4: int, c4_capped: int, c128: int) -> None:
    assert c4_visible(pos, topk=10**9) == c4
    assert c4_visible(pos, topk=512) == c4_capped
    assert c128_visible(pos) == c128
    t = torch.tensor([pos])
    assert c4_visible(t, 512).tolist() == [c4_capped]
    assert c128_visible(t).tolist() == [c128]


@SETTINGS
@given(st.lists(st.integers(0, 5000), min_size=1, max_size=8), st.sampled_from([1, 4, 128]))
def test_visible_rules_agree_on_ints_and_tensors(positions: list[int], window: int) -> None:
    t = torch.tensor(positions)
    assert window_visible(t, window).tolist() == [window_visible(p, window) for p in positions]
    assert c4_visible(t, 7).tolist() == [c4_visible(p, 7) for p in positions]
    assert c128_visible(t).tolist() == [c128_visible(p) for p in positions]


def test_window_indices() -> None:
    idx = window_indices(torch.tensor([0, 2, 127, 128, 300]), window=128)
    assert idx.shape == (5, 128)
    assert idx[0, :2].tolist() == [0, -1]
    assert idx[1, :4].tolist() == [0, 1, 2, -1]
    assert idx[2].tolist() == list(range(128))
    assert idx[3].tolist() == list(range(1, 129))
    assert idx[4].tolist() == list(range(173, 301))
    visible = (idx >= 0).sum(1)
    assert torch.equal(visible, window_visible(torch.tensor([0, 2, 127, 128, 300])))
    assert window_indices(5, window=4).tolist() == [[2, 3, 4, 5]]
