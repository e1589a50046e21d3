"""The indexer split into its logits and its top-k: serving rows add up the split of the very
indexer rows their indexer time came from (indexer_logits + indexer_topk = indexer), take the
fastest top-k kernel alone from `topk` rows of the same shapes (topk_alone, never added to the
total), and the report shows both."""

from __future__ import annotations

import textwrap

import pytest

from dsv4bench import serving as sv
from dsv4bench.cases import topk_case
from dsv4bench.measure import split
from dsv4bench.report.render import Report
from dsv4bench.report.sections import indexer_share
from dsv4bench.scenarios import load_text
from tests.factories import case_row


def _plan() -> sv.ServingPlan:
    spec = {"model": "v4-flash", "backends": ["kern"], "indexer": True}
    return sv.plan(sv.spec_from_dict({**spec, "batch_sizes": [2, 4], "contexts": [8192]}))


def _rows(plan: sv.ServingPlan, topk_ms: dict[str, float], logits_ms=None) -> list[dict]:
    """Case rows of the plan: indexer rows of 1.0 ms (split into logits_ms and the rest when
    given, as the worker splits them), topk rows of the indexer shapes by backend."""
    rows = []
    for c in plan.cases:
        backend = "kern" if c.op in ("decode", "prefill") else "helper"
        rows.append(case_row(c.case_id, backend, 1.0 if c.op == "indexer" else 0.1))
        if c.op == "indexer":
            if logits_ms is not None:
                rows[-1]["timing"]["split"] = split.split({"median_ms": 1.0},
                                                          {"median_ms": logits_ms})  # fmt: skip
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


def test_serving_rows_add_up_the_indexer_rows_own_split() -> None:
    plan = _plan()
    plain = sv.aggregate(plan, _rows(plan, {}))
    split_rows = sv.aggregate(plan, _rows(plan, {}, logits_ms=0.7))
    for a, b in zip(plain, split_rows, strict=True):
        assert "indexer_logits" not in a["breakdown_ms"] and "indexer_topk" not in a["breakdown_ms"]
        assert b["value_ms"] == pytest.approx(a["value_ms"])  # parts of the indexer, not added
        n = sum(p["multiplicity"] for p in b["parts"] if p["role"] == "indexer")
        got = b["breakdown_ms"]
        assert got["indexer"] == pytest.approx(n)
        assert got["indexer_logits"] == pytest.approx(0.7 * n)
        assert got["indexer_topk"] == pytest.approx(0.3 * n)
        assert got["indexer_logits"] + got["indexer_topk"] == pytest.approx(got["indexer"])
        assert indexer_share.topk_share(b) == pytest.approx(0.3)


def test_the_split_follows_the_runs_timer() -> None:
    plan = _plan()
    rows = _rows(plan, {}, logits_ms=0.7)
    for r in rows:  # every row has a profiler time: the run's timer is the profiler's
        t = r["timing"]
        t["profiler_ms"] = t["median_ms"] / 2
        if "split" in t:
            t["split"] = split.split(t, {"median_ms": 0.7, "profiler_ms": 0.2})
    (row, *_) = sv.aggregate(plan, rows)
    n = sum(p["multiplicity"] for p in row["parts"] if p["role"] == "indexer")
    assert row["timer"] == "profiler_ms"
    assert row["breakdown_ms"]["indexer_logits"] == pytest.approx(0.2 * n)
    assert row["breakdown_ms"]["indexer_topk"] == pytest.approx(0.3 * n)


def test_serving_rows_carry_the_fastest_topk_alone_beside_the_whole_indexer() -> None:
    plan = _plan()
    plain = sv.aggregate(plan, _rows(plan, {}))
    alone = sv.aggregate(plan, _rows(plan, {"slow": 0.5, "fast": 0.25}))
    for a, b in zip(plain, alone, strict=True):
        assert "topk_alone" not in a["breakdown_ms"]
        assert b["value_ms"] == pytest.approx(a["value_ms"])  # never added to the total
        ix = [p for p in b["parts"] if p["role"] == "indexer"]
        want = 0.25 * sum(p["multiplicity"] for p in ix)
        assert b["breakdown_ms"]["topk_alone"] == pytest.approx(want)
        assert "indexer_topk" not in b["breakdown_ms"]  # the indexer rows had no split
        assert indexer_share.alone_share(b) == pytest.approx(0.25)


def test_no_split_unless_every_indexer_part_has_one() -> None:
    plan = _plan()
    rows = _rows(plan, {"fast": 0.25}, logits_ms=0.7)
    twins = {topk_case.of_indexer(c).case_id for c in plan.cases if c.op == "indexer"}
    dropped = sorted(twins)[0]
    rows = [r for r in rows if r["case_id"] != dropped]
    rows.append(case_row(dropped, "fast", None, status="oom"))
    out = sv.aggregate(plan, rows)
    assert any("topk_alone" not in r["breakdown_ms"] for r in out)  # the point without
    assert any("topk_alone" in r["breakdown_ms"] for r in out)  # the other batch size
    (unsplit, *_) = [r for r in rows if r.get("timing", {}) and "split" in r["timing"]]
    del unsplit["timing"]["split"]
    out = sv.aggregate(plan, rows)
    assert any("indexer_logits" not in r["breakdown_ms"] for r in out)
    assert any("indexer_logits" in r["breakdown_ms"] for r in out)


def test_report_table_states_both_divisions(tmp_path) -> None:
    plan = _plan()
    rep = Report([], tmp_path, [])
    indexer_share.section(rep, sv.aggregate(plan, _rows(plan, {"fast": 0.25}, logits_ms=0.7)))
    text = rep.doc.to_markdown()
    assert "logits ms" in text and "add up to indexer ms" in text and "30.0%" in text
    assert "alone / indexer" in text and "nothing subtracted" in text and "25.0%" in text
    assert "dashed line of the same color is its top-k part" in text
    rep = Report([], tmp_path, [])
    indexer_share.section(rep, sv.aggregate(plan, _rows(plan, {})))
    text = rep.doc.to_markdown()
    assert "top-k / indexer" not in text and "alone / indexer" not in text


def test_the_figure_draws_the_top_k_part_beside_each_split_line(monkeypatch, tmp_path) -> None:
    plan = _plan()
    drawn = []
    monkeypatch.setattr(
        indexer_share.plots, "line_figure", lambda title, panels, **kw: drawn.extend(panels)
    )
    rep = Report([], tmp_path, [])
    monkeypatch.setattr(rep, "save", lambda fig, name: f"{name}.png")
    out = sv.aggregate(plan, _rows(plan, {"fast": 0.25}, logits_ms=0.7))
    indexer_share.section(rep, out)
    lines = [s for p in drawn for s in p.series]
    whole = [s for s in lines if s.linestyle == "-"]
    part = [s for s in lines if s.linestyle == "--"]
    assert whole and len(part) == len(whole)
    for w, t in zip(whole, part, strict=True):
        assert t.label == f"{w.label}: its top-k" and t.color == w.color and t.xs == w.xs
        assert all(0 < b < a for a, b in zip(w.ys, t.ys, strict=True))  # a part of the indexer
    drawn.clear()
    indexer_share.section(rep, sv.aggregate(plan, _rows(plan, {})))  # no split: no dashed line
    assert drawn and all(s.linestyle == "-" for p in drawn for s in p.series)


def test_rows_before_the_split_read_their_topk_as_the_kernel_alone() -> None:
    old = {"breakdown_ms": {"indexer": 2.0, "indexer_topk": 0.5}, "value_ms": 4.0}
    assert indexer_share.stages(old) is None and indexer_share.topk_share(old) is None
    assert indexer_share.topk_alone(old) == 0.5 and indexer_share.alone_share(old) == 0.25


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
