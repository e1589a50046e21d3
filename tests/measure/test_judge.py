"""One judge for every op: the worker's verdict, the report's and compare's are the same call."""

from __future__ import annotations

from dsv4bench.measure import judge
from dsv4bench.report.compare import accuracy_bad
from dsv4bench.report.load import accuracy_failure, normalize

TOL = {"cos_diff": 5e-6, "lse_abs": 1e-3}
GOOD = {"cos_diff": 1e-7, "lse_max_abs": 1e-6, "nonfinite": 0}


def test_the_judge_reads_tolerance_and_topk_picks():
    assert judge.verdict(GOOD, TOL) == ("ok", "")
    assert judge.verdict({**GOOD, "cos_diff": 1e-3}, TOL)[0] == "incorrect"
    status, why = judge.verdict({**GOOD, "topk_invalid": 3}, TOL)
    assert status == "incorrect" and "3 top-k picks" in why
    assert "0.5" in judge.problem({**GOOD, "topk_matched": 0.5}, TOL)


def test_report_and_compare_apply_the_topk_judgement_to_stored_rows():
    row = {"kind": "case", "op": "indexer", "status": "ok", "tolerance": TOL}
    good = normalize({**row, "accuracy": GOOD}, "r")
    bad = normalize({**row, "accuracy": {**GOOD, "topk_count_mismatch": 2}}, "r")
    assert accuracy_failure(good) is None and accuracy_bad(good) is None
    assert "2 rows pick a different number" in accuracy_failure(bad)
    assert accuracy_bad(bad) == accuracy_failure(bad)


def test_an_answer_wrong_only_in_its_lse_is_incorrect():
    """A kernel whose out is right but whose lse is off (or +inf where a key exists) gives
    engines a wrong merge of split or prefix attention: the judge fails it on the lse alone."""
    status, why = judge.verdict({**GOOD, "lse_max_abs": 0.02}, TOL)
    assert status == "incorrect" and why == "lse_max_abs 0.02 > 0.001"
    status, why = judge.verdict({**GOOD, "lse_mismatch": 4}, TOL)
    assert status == "incorrect" and "4 lse values differ in finiteness" in why
    assert judge.verdict({**GOOD, "lse_max_abs": 1e-3}, TOL) == ("ok", "")  # at the bound
    stored = normalize({"kind": "case", "op": "decode", "status": "ok", "tolerance": TOL,
                        "accuracy": {**GOOD, "lse_max_abs": 0.02}}, "r")  # fmt: skip
    assert accuracy_failure(stored) == "lse_max_abs 0.02 > 0.001"


EXACT = {**TOL, "exact_cos_diff": 3e-5, "exact_lse_abs": 3e-3}
CLOSE = {**GOOD, "exact_cos_diff": 2e-5, "exact_lse_max_abs": 1e-3, "exact_nonfinite": 0}


def test_a_declared_exact_bound_judges_the_distance_to_the_kernels_own_model():
    assert judge.verdict(CLOSE, EXACT) == ("ok", "")
    status, why = judge.verdict({**CLOSE, "exact_cos_diff": 4e-5}, EXACT)
    assert status == "incorrect" and why == "exact_cos_diff 4e-05 > 3e-05 (the kernel's own model)"
    status, why = judge.verdict({**CLOSE, "exact_max_logits_max_abs": 0.01}, EXACT)
    assert status == "incorrect" and why.startswith("exact_max_logits_max_abs 0.01 > 0.003")
    assert judge.verdict({**CLOSE, "exact_nonfinite": 2}, EXACT)[0] == "incorrect"
    # a bound with nothing measured against it is not a pass
    assert "went unchecked" in judge.problem(GOOD, EXACT)
    # without a declared bound the distance is recorded, not judged (the rows before it)
    assert judge.verdict({**CLOSE, "exact_cos_diff": 1.0}, TOL) == ("ok", "")


def test_stored_rows_are_judged_with_their_own_exact_bound():
    row = {"kind": "case", "op": "prefill", "status": "ok", "tolerance": EXACT}
    bad = normalize({**row, "accuracy": {**CLOSE, "exact_cos_diff": 4e-5}}, "r")
    assert accuracy_failure(bad).startswith("exact_cos_diff 4e-05")
    assert accuracy_bad(bad) == accuracy_failure(bad)
    old = normalize({**row, "tolerance": TOL, "accuracy": {**CLOSE, "exact_cos_diff": 4e-5}}, "r")
    assert accuracy_failure(old) is None


def test_max_logits_takes_its_declared_bound_else_the_lse_one():
    acc = {**GOOD, "max_logits_max_abs": 0.12, "max_logits_mismatch": 0}
    lossy = {"cos_diff": 3e-3, "lse_abs": 0.1}
    assert judge.problem(acc, lossy) == "max_logits_max_abs 0.12 > 0.1"
    assert judge.verdict(acc, {**lossy, "max_logits_abs": 0.3}) == ("ok", "")
