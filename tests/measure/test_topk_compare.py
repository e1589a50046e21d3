"""Top-k comparison by selected scores: ties give different index sets that still match."""

from __future__ import annotations

import torch

from dsv4bench.measure.topk import compare_topk, topk_problem

NEG = float("-inf")


def test_tied_picks_match_though_indices_differ() -> None:
    logits = torch.tensor([[5.0, 3.0, 3.0, 3.0, 1.0], [2.0, 2.0, NEG, 2.0, 0.0]])
    expected = torch.tensor([[0, 1, 2], [0, 1, 3]])
    actual = torch.tensor([[0, 3, 1], [3, 0, 1]])  # another tied key; another order
    acc = compare_topk(logits, expected, actual)
    assert acc["topk_matched"] == 1.0
    assert acc["topk_score_max_abs"] == 0.0
    assert acc["topk_index_overlap"] == 5 / 6  # the index sets differ: an index compare fails
    assert topk_problem(acc) is None


def test_a_worse_pick_is_caught_with_its_ratio() -> None:
    logits = torch.tensor([[5.0, 3.0, 3.0, 1.0]])
    acc = compare_topk(logits, torch.tensor([[0, 1, 2]]), torch.tensor([[0, 1, 3]]))
    assert acc["topk_matched"] == 2 / 3
    assert acc["topk_score_max_abs"] == 2.0
    assert "2 of" not in topk_problem(acc) and "0.666667" in topk_problem(acc)


def test_rounding_level_differences_match() -> None:
    logits = torch.tensor([[1000.0, 999.99999, 1.0]])
    acc = compare_topk(logits, torch.tensor([[0]]), torch.tensor([[1]]))
    assert acc["topk_matched"] == 1.0  # 1e-5 apart on a row of scale 1000: within 1e-5 relative


def test_masked_duplicate_and_out_of_range_picks_are_invalid() -> None:
    logits = torch.tensor([[1.0, NEG, 2.0, 0.5]])
    expected = torch.tensor([[2, 0, 3]])
    for bad in ([2, 1, 0], [2, 2, 0], [2, 0, 7]):
        acc = compare_topk(logits, expected, torch.tensor([bad]))
        assert acc["topk_invalid"] == 1, bad
        assert "picks" in topk_problem(acc)


def test_padding_counts() -> None:
    logits = torch.tensor([[1.0, 2.0, NEG, NEG]])
    expected = torch.tensor([[1, 0, -1]])
    assert compare_topk(logits, expected, expected.clone())["topk_matched"] == 1.0
    acc = compare_topk(logits, expected, torch.tensor([[1, -1, -1]]))
    assert acc["topk_count_mismatch"] == 1 and acc["topk_matched"] == 0.5


def test_overlap_ignores_padding_next_to_column_zero() -> None:
    logits = torch.tensor([[3.0, 2.0, 1.0]])
    acc = compare_topk(logits, torch.tensor([[0, -1]]), torch.tensor([[0, -1]]))
    assert acc["topk_index_overlap"] == 1.0


def test_a_pick_exact_for_the_kernels_own_logits_passes() -> None:
    ref = torch.tensor([[5.0, 3.00, 2.99, 1.0]])
    mine = torch.tensor([[5.0, 2.995, 2.996, 1.0]])  # rounding swapped the 2nd and 3rd keys
    expected, actual = torch.tensor([[0, 1]]), torch.tensor([[0, 2]])
    assert compare_topk(ref, expected, actual)["topk_matched"] == 0.5
    acc = compare_topk(ref, expected, actual, actual_logits=mine)
    assert acc["topk_matched"] == 1.0 and abs(acc["topk_logit_err"] - 0.006) < 1e-6
    worse = compare_topk(ref, expected, torch.tensor([[0, 3]]), actual_logits=mine)
    assert worse["topk_matched"] == 0.5  # a key 2 below the oracle's is beyond any rounding
