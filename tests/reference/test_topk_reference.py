"""The top-k oracle (reference/topk.py) against a brute force written apart from it: a Python
sort of each row's window, mapped into each form by hand. Ties and -inf inside windows are
built in; picks are compared by the scores they select (ties make index sets free)."""

from __future__ import annotations

import math

import pytest
import torch

from reference import topk

PAGE = 4


def _brute_scores(logits, lengths, starts, k) -> list[list[float]]:
    """Per row: the k largest finite values of its window, descending (Python's sort)."""
    out = []
    for i, (n, s) in enumerate(zip(lengths.tolist(), starts.tolist(), strict=True)):
        window = [v for v in logits[i, s : s + n].tolist() if v != -math.inf]
        out.append(sorted(window, reverse=True)[:k])
    return out


def _brute_form(local: int, row: int, form: str, x: dict) -> int:
    """A window position as the form's index, by hand."""
    if form == "plain":
        return local + int(x["row_starts"][row])
    if form == "ragged":
        return local + int(x["offsets"][row])
    req = int(x["row_to_batch"][row])
    return int(x["block_table"][req, local // PAGE]) * PAGE + local % PAGE


def _inputs(rows: int = 6, width: int = 40, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randint(-4, 5, (rows, width), generator=g).float()  # many ties
    logits[1, 3:9] = -math.inf  # -inf inside a window: never picked
    lengths = torch.tensor([40, 12, 0, 7, 30, 25], dtype=torch.int32)[:rows]
    starts = torch.tensor([0, 2, 0, 33, 5, 10], dtype=torch.int32)[:rows]
    requests = 3
    table = torch.randperm(requests * 10, generator=g).view(requests, 10).to(torch.int32)
    return {
        "logits": logits,
        "lengths": lengths,
        "row_starts": starts,
        "block_table": table,
        "row_to_batch": (torch.arange(rows) // 2).to(torch.int32),
        "offsets": torch.tensor([0, 0, 40, 40, 52, 52], dtype=torch.int32)[:rows],
    }


@pytest.mark.parametrize("form", topk.FORMS)
@pytest.mark.parametrize("k", [1, 5, 16, 64])
def test_oracle_picks_the_brute_force_scores_in_every_form(form: str, k: int) -> None:
    x = _inputs()
    got = topk.select(x, k, form, page_size=PAGE)
    assert got.shape == (6, k) and got.dtype == torch.int32
    want = _brute_scores(x["logits"], x["lengths"], x["row_starts"], k)
    for row in range(6):
        n, s = int(x["lengths"][row]), int(x["row_starts"][row])
        index_of = {_brute_form(p, row, form, x): p for p in range(n)}  # form index -> local
        picks = [int(i) for i in got[row] if i >= 0]
        assert (got[row][len(picks) :] == -1).all()  # valid picks first, -1 after
        assert len(set(picks)) == len(picks) == len(want[row])
        local = [index_of[i] for i in picks]  # KeyError: a pick outside the row's window
        scores = [float(x["logits"][row, s + p]) for p in local]
        assert scores == want[row]  # descending, the same values as the sort


def test_a_window_of_fewer_finite_logits_than_k_pads_with_minus_one() -> None:
    x = _inputs()
    got = topk.local_topk(x["logits"], x["lengths"], 64, x["row_starts"])
    assert (got[1] >= 0).sum() == 12 - 6  # 6 of its 12 keys are -inf
    assert (got[2] == -1).all()  # an empty window
    assert (got[3] >= 0).sum() == 7


def test_row_blocks_do_not_change_the_answer() -> None:
    x = _inputs()
    whole = topk.local_topk(x["logits"], x["lengths"], 8, x["row_starts"])
    one_row = topk.local_topk(x["logits"], x["lengths"], 8, x["row_starts"], block_bytes=1)
    assert torch.equal(whole, one_row)


def test_unknown_form_and_bad_lengths_are_refused() -> None:
    x = _inputs()
    with pytest.raises(ValueError, match="form"):
        topk.select(x, 4, "sorted")
    with pytest.raises(ValueError, match="lengths"):
        topk.local_topk(x["logits"], x["lengths"][:3], 4)
