"""The `topk` case kind: scenario expansion (form, defaults, rules, sizes), its inputs (indexer
logits with ties, per-row windows), the forms read back as columns, and the judge catching
picks that are worse, out of the window or through another request's pages."""

from __future__ import annotations

import textwrap

import pytest
import torch

from dsv4bench.cases import inputs, topk_case
from dsv4bench.cases.oracle import oracle_call
from dsv4bench.cases.output import Output
from dsv4bench.measure import judge
from dsv4bench.measure.topk import compare_forms
from dsv4bench.scenarios import ScenarioError, load_text


def _load(body: str, op: str = "topk"):
    text = f"name: t\nop: {op}\nbackends: [torch]\ncases:\n{textwrap.indent(body, '  ')}"
    return load_text(text, "t.yaml", known_backends=("torch",)).cases


def test_expansion_defaults_to_plain_and_takes_the_indexer_defaults() -> None:
    (v32,) = _load("- model: v3.2\n  context_len: 8192\n")
    (v4,) = _load("- model: v4-flash\n  context_len: 8192\n  form: ragged\n")
    assert (v32.form, v32.topk, v32.num_heads, v32.compress_ratio) == ("plain", 2048, 64, 0)
    assert (v4.form, v4.topk, v4.compress_ratio, v4.extra_topk) == ("ragged", 512, 4, 0)
    assert v32.params()["form"] == "plain"
    (chunk,) = _load("- model: v3.2\n  tokens: 512\n  context_len: 4096\n")
    assert chunk.query_tokens == 512
    ids = {c.case_id for c in _load("- model: v3.2\n  form: [plain, page_table, ragged]\n")}
    assert len(ids) == 3


def test_other_ops_keep_their_ids_and_take_no_form() -> None:
    (ix,) = _load("- model: v3.2\n", op="indexer")
    assert "form" not in ix.params()
    with pytest.raises(ScenarioError, match="only topk and remap have a form"):
        _load("- model: v3.2\n  form: plain\n", op="indexer")
    with pytest.raises(ScenarioError, match=r"unknown form \(top-k or remap\)"):
        _load("- model: v3.2\n  form: sorted\n")


def test_a_case_that_fits_no_gpu_names_the_logits() -> None:
    with pytest.raises(ScenarioError, match="logits"):
        _load("- model: v3.2\n  tokens: 65536\n  context_len: 1073741824\n")


def test_inputs_are_indexer_logits_with_ties_and_windows() -> None:
    (case,) = _load("- model: v4-flash\n  batch_size: 2\n  s_q: 2\n  context_len: 1024\n")
    x = inputs.make_inputs(case, "cpu")
    keys = 1024 // 4
    assert x["logits"].shape == (4, keys) and x["logits"].dtype == torch.float32
    assert x["lengths"].tolist() == [255, 256, 255, 256]  # (pos + 1) // 4
    finite = torch.isfinite(x["logits"])
    assert (finite.sum(1) == x["lengths"]).all()  # -inf exactly outside each window
    assert ((x["logits"] == 0) & finite).float().mean() > 0.02  # relu(...) = 0 on every head
    (other,) = _load(
        "- model: v4-flash\n  batch_size: 2\n  s_q: 2\n  context_len: 1024\n  form: page_table\n"
    )
    y = inputs.make_inputs(other, "cpu")
    assert torch.equal(x["logits"], y["logits"])  # every form reads the same logits
    assert y["block_table"].shape == (2, 4) and y["row_to_batch"].tolist() == [0, 0, 1, 1]


@pytest.mark.parametrize("form", ["plain", "page_table", "ragged"])
def test_the_judge_catches_bad_picks(form: str) -> None:
    (case,) = _load(
        f"- model: v3.2\n  batch_size: 2\n  context_len: 512\n  topk: 16\n  form: {form}\n"
    )
    x = inputs.make_inputs(case, "cpu")
    want = oracle_call(case, x)()
    assert topk_case.columns(case, x, want.out).max() < 512
    acc = compare_forms(case, x, want, Output(want.out.clone()))
    assert judge.verdict(acc, case.tolerance)[0] == "ok" and acc["form_exact"]
    worse = want.out.clone()
    worst = x["logits"][0].argmin().item()  # the row's lowest logit instead of its best
    worse[0, 0] = topk_case_index(case, x, 0, worst)
    verdict = judge.verdict(compare_forms(case, x, want, Output(worse)), case.tolerance)
    assert verdict[0] == "incorrect" and "match" in verdict[1]
    other = want.out.clone()
    other[0, 0] = want.out[1, 0]  # a pick of the other request
    if form != "plain":  # plain columns are the same numbers in every row
        acc = compare_forms(case, x, want, Output(other))
        assert acc["topk_invalid"] >= 1


def topk_case_index(case, x: dict, row: int, column: int) -> int:
    """Column `column` of `row` as the case's form names it."""
    from reference import topk

    local = torch.tensor([[column]], dtype=torch.int32)
    if case.form == "ragged":
        return int(topk.ragged(local, x["offsets"][row : row + 1])[0, 0])
    if case.form == "page_table":
        one = x["row_to_batch"][row : row + 1]
        return int(topk.page_table(local, x["block_table"], case.page_size, one)[0, 0])
    return column
