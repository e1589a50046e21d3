"""The indexer split into its top-k and the rest: serving rows take the top-k alone from `topk`
rows of the indexer parts' shapes (never adding it to the total), and the report divides it by
the indexer rows' whole time."""

from __future__ import annotations

import textwrap

import pytest

from dsv4bench import serving as sv
from dsv4bench.cases import topk_case
from dsv4bench.report import indexer_share
from dsv4bench.report.render import Report
from dsv4bench.scenarios import load_text
from tests.factories import case_row


def _plan() -> sv.ServingPlan:
    spec = {"model": "v4-flash", "backends": ["kern"], "indexer": True}
    return sv.plan(sv.spec_from_dict({**spec, "batch_sizes": [2, 4], "contexts": [8192]}))


def _rows(plan: sv.ServingPlan, topk_ms: dict[str, float]) -> list[dict]:
    rows = []
    for c in plan.cases:
        backend = "kern" if c.op in ("decode", "prefill") else "helper"
        rows.append(case_row(c.case_id, backend, 1.0 if c.op == "indexer" else 0.1))
        if c.op == "indexer":
            twin = topk_case.of_indexer(c).case_id
            rows += [case_row(twin, b, ms) for b, ms in topk_ms.items()]
    return rows


def test_the_twin_is_the_case_a_topk_scenario_makes_for_that_shape() -> None:
    (ix,) = [c for c in _plan().cases if c.op == "indexer" and c.batch_size == 2]
    text = """\
        name: t
        op: topk
        backends: [torch]
        cases:
          - model: v4-flash
            batch_size: 2
            context_len: 8192
            form: plain
    """
    (point,) = load_text(textwrap.dedent(text), "t.yaml", known_backends=("torch",)).cases
    assert topk_case.of_indexer(ix).case_id == point.case_id


def test_serving_rows_carry_the_fastest_topk_beside_the_whole_indexer() -> None:
    plan = _plan()
    plain = sv.aggregate(plan, _rows(plan, {}))
    split = sv.aggregate(plan, _rows(plan, {"slow": 0.5, "fast": 0.25}))
    for a, b in zip(plain, split, strict=True):
        assert "indexer_topk" not in a["breakdown_ms"]
        assert b["value_ms"] == pytest.approx(a["value_ms"])  # never added to the total
        ix = [p for p in b["parts"] if p["role"] == "indexer"]
        assert ix and b["breakdown_ms"]["indexer"] == pytest.approx(
            sum(p["multiplicity"] for p in ix)
        )
        want = 0.25 * sum(p["multiplicity"] for p in ix)
        assert b["breakdown_ms"]["indexer_topk"] == pytest.approx(want)
        assert indexer_share.topk_share(b) == pytest.approx(0.25)


def test_no_split_unless_every_indexer_part_has_a_topk_row() -> None:
    plan = _plan()
    rows = _rows(plan, {"fast": 0.25})
    twins = {topk_case.of_indexer(c).case_id for c in plan.cases if c.op == "indexer"}
    dropped = sorted(twins)[0]
    rows = [r for r in rows if r["case_id"] != dropped]
    rows.append(case_row(dropped, "fast", None, status="oom"))
    out = sv.aggregate(plan, rows)
    assert any("indexer_topk" not in r["breakdown_ms"] for r in out)  # the point without
    assert any("indexer_topk" in r["breakdown_ms"] for r in out)  # the other batch size


def test_report_table_states_the_division(tmp_path) -> None:
    plan = _plan()
    rep = Report([], tmp_path, [])
    indexer_share.section(rep, sv.aggregate(plan, _rows(plan, {"fast": 0.25})))
    text = rep.doc.to_markdown()
    assert "top-k / indexer" in text and "nothing subtracted" in text
    assert "25.0%" in text
    rep = Report([], tmp_path, [])
    indexer_share.section(rep, sv.aggregate(plan, _rows(plan, {})))
    assert "top-k / indexer" not in rep.doc.to_markdown()


def test_indexer_topk_puts_every_twin_in_the_plan_on_the_helpers() -> None:
    spec = {"model": "v4-flash", "backends": ["kern"], "helper_backends": ["h", "torch"]}
    spec |= {"batch_sizes": [2, 4], "contexts": [8192], "indexer": True, "indexer_topk": True}
    plan = sv.plan(sv.spec_from_dict(spec))
    twins = {topk_case.of_indexer(c).case_id for c in plan.cases if c.op == "indexer"}
    topk = {c.case_id: c for c in plan.cases if c.op == "topk"}
    assert twins and set(topk) == twins
    assert all(plan.backends_for(c) == ("h", "torch") for c in topk.values())
    # no part of a point reads them: the total stays the indexer's whole time
    assert not any(p.case_id in twins for pt in plan.points() for p in pt.parts)
    assert not [c for c in _plan().cases if c.op == "topk"]  # off by default
    with pytest.raises(ValueError, match="indexer_topk: true needs indexer: true"):
        sv.spec_from_dict({**spec, "indexer": False})
