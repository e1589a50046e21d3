"""Comparing top-k selections where scores can tie: by the scores they select, not by indices.

Two correct kernels may return different index sets when logits tie (or differ only by rounding)
at the k-th place. So each selection is scored under the *oracle's* logits, the scores sorted
descending, and the two sorted lists compared position by position: position p matches when the
scores differ by at most `rel_tol` times the row's largest |logit| (a pick whose score is as
good as the oracle's is as good a pick). The index-set overlap is reported too, for information.

Given the kernel's own logits, the tolerance of a row also admits twice the row's largest
logit difference: if |oracle - kernel| <= e elementwise, the exact top-k of the kernel's
logits has sorted oracle scores within 2e of the oracle's top-k at every position (order
statistics move by at most e). So a kernel passes when its top-k is exact for its own logits,
and its logits are judged by the cosine difference; a kernel that picks worse than that fails.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

REL_TOL = 1e-5  # of the row's largest |logit|: fp32 summation-order noise, far below a real gap
ROW_BLOCK = 256  # rows per step (a row's logits can be 128K wide)


def _selected_scores(ref: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores of idx's picks under ref (-inf for -1), sorted descending; and per-row counts of
    bad picks: out of range, a masked (-inf) key, or a duplicate."""
    import torch

    n = ref.shape[1]
    idx = idx.long()
    listed = idx >= 0
    in_range = listed & (idx < n)
    scores = ref.gather(1, idx.clamp(0, max(n - 1, 0)))
    scores = scores.masked_fill(~in_range, float("-inf"))
    bad = (listed & ~in_range) | (in_range & torch.isneginf(scores))
    s, _ = idx.masked_fill(~listed, -1).sort(dim=1)
    dup = (s[:, 1:] == s[:, :-1]) & (s[:, 1:] >= 0)
    scores_sorted, _ = scores.sort(dim=1, descending=True)
    return scores_sorted, bad.sum(1) + dup.sum(1)


def compare_topk(
    ref_logits: torch.Tensor,
    expected: torch.Tensor,
    actual: torch.Tensor,
    *,
    actual_logits: torch.Tensor | None = None,
    rel_tol: float = REL_TOL,
) -> dict:
    """ref_logits (rows, N) from the oracle; expected/actual (rows, k) column indices, -1 padded.

    topk_matched: matched positions / compared positions (1.0 = as good as the oracle);
    topk_score_max_abs: largest score difference at a position; topk_invalid: picks that are
    out of range, masked or duplicated; topk_count_mismatch: rows whose number of picks differs;
    topk_index_overlap: |actual & expected| / |expected| (below 1 under ties, for information);
    topk_logit_err: the largest |oracle - kernel| logit (None without actual_logits)."""
    if expected.shape != actual.shape or expected.shape[0] != ref_logits.shape[0]:
        raise ValueError(
            f"shapes: logits {tuple(ref_logits.shape)}, expected {tuple(expected.shape)}, "
            f"actual {tuple(actual.shape)}"
        )
    import torch

    device = ref_logits.device
    matched = compared = invalid = count_mismatch = overlap = listed = 0
    max_abs = max_err = 0.0
    for r in range(0, ref_logits.shape[0], ROW_BLOCK):
        ref = ref_logits[r : r + ROW_BLOCK].double()
        e_idx = expected[r : r + ROW_BLOCK].to(device)
        a_idx = actual[r : r + ROW_BLOCK].to(device)
        se, _ = _selected_scores(ref, e_idx)
        sa, bad = _selected_scores(ref, a_idx)
        invalid += int(bad.sum())
        count_mismatch += int(((e_idx >= 0).sum(1) != (a_idx >= 0).sum(1)).sum())
        finite = torch.isfinite(ref)
        scale = ref.abs().masked_fill(~finite, 0).amax(1, keepdim=True)
        both = torch.isfinite(se) & torch.isfinite(sa)
        diff = (se - sa).abs().masked_fill(~both, 0)
        if both.any():
            max_abs = max(max_abs, float(diff.max()))
        tol = rel_tol * scale
        if actual_logits is not None:
            act = actual_logits[r : r + ROW_BLOCK].to(device).double()
            fin = finite & torch.isfinite(act)
            err = (ref - act).abs().masked_fill(~fin, 0).amax(1, keepdim=True)
            tol = torch.maximum(tol, 2 * err * (1 + 1e-9))
            max_err = max(max_err, float(err.max()) if err.numel() else 0.0)
        ok = both & (diff <= tol)
        ok |= torch.isneginf(se) & torch.isneginf(sa)  # both lists have run out of picks here
        used = torch.isfinite(se) | torch.isfinite(sa)
        matched += int((ok & used).sum())
        compared += int(used.sum())
        n = ref.shape[1]  # column n collects the -1 padding of both sides
        chosen = torch.zeros(ref.shape[0], n + 1, dtype=torch.bool, device=device)
        e_col = e_idx.long().masked_fill((e_idx < 0) | (e_idx >= n), n)
        chosen.scatter_(1, e_col, True)
        chosen[:, n] = False
        a_col = a_idx.long().masked_fill((a_idx < 0) | (a_idx >= n), n)
        overlap += int(chosen.gather(1, a_col).sum())
        listed += int((e_idx >= 0).sum())
    return {
        "topk_matched": matched / compared if compared else 1.0,
        "topk_score_max_abs": max_abs,
        "topk_invalid": invalid,
        "topk_count_mismatch": count_mismatch,
        "topk_index_overlap": overlap / listed if listed else 1.0,
        "topk_logit_err": max_err if actual_logits is not None else None,
    }


def compare_forms(case, x: dict, expected, actual) -> dict:
    """compare_topk for a `topk` case: the picks of its form (Output.out) and the oracle's, both
    read back as columns of the same logits (cases/topk_case.columns: a pick outside the row's
    window or request is out of range, so invalid); form_exact: the two outputs are equal."""
    import torch

    from dsv4bench.cases import topk_case

    if tuple(actual.out.shape) != tuple(expected.out.shape):
        raise ValueError(
            f"top-k shape {tuple(actual.out.shape)}, expected {tuple(expected.out.shape)}"
        )
    device = x["logits"].device
    want = topk_case.columns(case, x, expected.out.to(device))
    got = topk_case.columns(case, x, actual.out.to(device))
    acc = compare_topk(x["logits"], want, got)
    acc["form_exact"] = bool(torch.equal(expected.out.cpu(), actual.out.cpu()))
    return acc


def topk_problem(acc: dict) -> str | None:
    """Why a top-k result is not as good as the oracle's (one line), or None."""
    if acc.get("topk_invalid"):
        return f"{acc['topk_invalid']} top-k picks out of range, masked or duplicated"
    if acc.get("topk_count_mismatch"):
        return f"{acc['topk_count_mismatch']} rows pick a different number of keys"
    matched = acc.get("topk_matched")
    if matched is not None and matched < 1.0:
        return f"top-k scores match at {matched:.6f} of positions (< 1)"
    return None
