"""Report parts of issue 13: the TP x route crossover (vLLM's 32-head rule measured) and two
instances of one backend side by side (two FlashMLA builds), from synthetic rows."""

from __future__ import annotations

import math

import pytest

from dsv4bench.report import build_report
from dsv4bench.report.builds import instance_groups, paragraph
from dsv4bench.report.route_crossover import crossovers
from tests.factories import write_run


def row(backend="flashmla", *, heads=64, tokens=4096, route="sparse-prefill", ms=1.0, **kw):
    status = kw.pop("status", "ok")
    params = dict(model=kw.pop("model", "v3.2"), num_heads=heads, tokens=tokens, route=route)
    params.update(context_len=32768, layout="v32", head_padding="engine")
    case_id = kw.pop("case_id", None) or "prefill-" + "-".join(map(str, params.values()))
    return {
        "kind": "case",
        "_run": "run",
        "case_id": case_id,
        "op": "prefill",
        "backend": backend,
        "backend_base": kw.pop("base", "flashmla"),
        "status": status,
        "message": "",
        "params": params,
        "tags": kw.pop("tags", []),
        "timing": {"median_ms": ms} if status == "ok" else None,
        "accuracy": {"cos_diff": kw.pop("cos", 2e-6)} if status in ("ok", "incorrect") else None,
        **kw,
    }


def sweep(times: dict[int, tuple[float, float, float]], tokens=4096, backend="flashmla"):
    """Rows at each head count: (sparse-prefill, decode-mixed, decode-kernel) ms; None = crash."""
    rows = []
    for heads, per_route in times.items():
        routes = ("sparse-prefill", "decode-mixed", "decode-kernel")
        for route, ms in zip(routes, per_route, strict=True):
            status = "ok" if ms is not None else "crash"
            rows.append(row(backend, heads=heads, tokens=tokens, route=route, ms=ms, status=status))
    return rows


# V3.2 chunk 4096: the decode routes win below 32 heads (vLLM's rule is right);
# chunk 8192: decode-mixed also wins at 32 (vLLM keeps h32 on the slower sparse prefill)
RIGHT = {128: (4.0, 8.0, 9.0), 64: (2.0, 4.1, 4.5), 32: (1.0, 2.05, 2.2), 16: (1.0, 0.9, 1.1),
         8: (1.0, 0.5, 0.6)}  # fmt: skip
LOW = {128: (8.0, 16.0, None), 64: (4.0, 8.0, None), 32: (2.0, 1.5, None), 16: (2.0, 0.8, None),
       8: (2.0, 0.4, None)}  # fmt: skip


def test_the_crossover_and_vllms_verdict():
    found = crossovers(sweep(RIGHT) + sweep(LOW, tokens=8192))
    assert [(c.model, c.tokens) for c in found] == [("v3.2", 4096), ("v3.2", 8192)]
    right, low = found
    assert right.heads == [128, 64, 32, 16, 8]
    assert right.crossover("decode-mixed") == 16 and right.monotone("decode-mixed")
    assert right.crossover("decode-kernel") == 8  # sglang's shape loses at 16 here
    assert right.ratio(8, "decode-mixed") == pytest.approx(0.5)
    assert right.vllm_verdict().startswith("right")
    assert low.crossover("decode-mixed") == 32
    assert low.vllm_penalty() == {32: pytest.approx(2.0 / 1.5)}
    verdict = low.vllm_verdict()
    assert "h32 (sparse-prefill: x1.33)" in verdict and "decode-mixed also wins at h32" in verdict
    assert low.compared("decode-kernel") == [] and low.failed[8]["decode-kernel"] == "crash"


def test_a_route_that_wins_only_in_the_middle_is_not_monotone():
    odd = {64: (1.0, 0.9, 1.2), 32: (1.0, 1.1, 1.2), 16: (1.0, 0.8, 1.2)}
    (c,) = crossovers(sweep(odd))
    assert c.crossover("decode-mixed") == 16 and not c.monotone("decode-mixed")
    assert c.wins("decode-mixed") == [64, 16]
    assert c.crossover("decode-kernel") is None  # loses at the smallest head count
    assert "sparse-prefill wins at h" not in c.vllm_verdict()  # 16 < 32 picks the winner


def test_one_head_count_or_no_decode_route_is_no_crossover():
    one = [row(heads=64, route=r) for r in ("sparse-prefill", "decode-mixed")]
    sparse_only = [row(heads=h) for h in (64, 32)]
    assert crossovers(one) == [] and crossovers(sparse_only) == []


def build(name, factor, *, limit=None, cos=2e-6, incorrect=()):
    rows = [
        row(name, heads=h, ms=factor * h / 64, cos=cos, case_id=f"c{h}", base="flashmla")
        for h in (64, 32, 16)
    ]
    for r in rows:
        if r["case_id"] in incorrect:
            r["status"] = "incorrect"
    if limit:
        rows.append(
            {
                **row(name, heads=64, route="decode-kernel", tokens=8192, base="flashmla"),
                "kind": "limit",
                "case_id": "limit-tokens-x",
                "axis": "tokens",
                "last_ok": limit[0],
                "first_fail": limit[1],
                "status": "crash",
                "step": limit[2] if len(limit) > 2 else 1,
            }
        )
    return rows


def test_two_builds_side_by_side():
    rows = build("flashmla-0.26", 1.0, limit=(11622, 11623))
    rows += build("flashmla-0.33", 0.9, limit=(11600, 11616, 16), cos=3e-6, incorrect=("c16",))
    rows += [row("triton", base="triton", case_id="c64")]  # one instance: no group
    (group,) = instance_groups(rows)
    old, new = group
    assert (old.name, new.name) == ("flashmla-0.26", "flashmla-0.33")
    assert old.reference == new.reference == "flashmla-0.26"
    assert old.speed == pytest.approx(1.0)
    assert new.speed == pytest.approx(0.9) and len(new.ratios) == 2  # c16 is incorrect
    assert (new.ok, new.incorrect, new.cases, new.max_cos_diff) == (2, 1, 3, 3e-6)
    text = paragraph(new)
    assert "**flashmla-0.33**: 2 of 3 cases ok, 1 incorrect" in text
    assert "time 0.900x flashmla-0.26's (geometric mean over 2 cases, 0.90..0.90; events)" in text
    assert "decode-kernel v3.2 h64 tokens limit: last ok 11600, first fail 11616 (to 16)" in text
    assert "last ok 11622, first fail 11623 (crash)" in paragraph(old)
    (lim,) = [r for r in rows if r["kind"] == "limit" and r["backend"] == "flashmla-0.33"]
    lim.update(last_ok=None, first_fail=None, status="unsupported")  # 0.33 not found
    (group,) = instance_groups(rows)
    assert "limit: not searched (unsupported)" in paragraph(group[1])
    assert math.isclose(new.speed, 0.9)


def test_an_instance_counts_a_rejudged_case_once_by_its_last_row():
    """q8kv8's prefill run judged its outliers cases twice: 33 cases, not 41 rows."""
    rows = build("flashmla-0.26", 1.0) + build("flashmla-0.33", 0.9, incorrect=("c16",))
    again = [dict(r, status="incorrect") for r in rows if r["backend"] == "flashmla-0.33"]
    (group,) = instance_groups(rows + again[:1] + [dict(again[0], status="ok")])
    new = group[1]
    assert (new.cases, new.ok, new.incorrect) == (3, 2, 1)
    assert "**flashmla-0.33**: 2 of 3 cases ok, 1 incorrect" in paragraph(new)


def test_build_ratios_divide_by_the_timer_both_rows_measured():
    old, new = build("flashmla-0.26", 1.0), build("flashmla-0.33", 0.9)
    for r, makespan in ((old[0], 1.0), (new[0], 0.5)):  # c64: both profiled
        r["timing"]["profiler_ms"] = makespan
    new[1]["timing"]["profiler_ms"] = 0.1  # c32: only one side profiled -> events
    (group,) = instance_groups(old + new)
    inst = group[1]
    assert sorted(inst.ratios) == pytest.approx([0.5, 0.9, 0.9])  # c64 by makespan, not 0.9
    assert inst.timers == {"profiler makespan", "events"}
    assert "; events / profiler makespan)" in paragraph(inst)


def test_an_instance_that_runs_nothing_says_why():
    rows = build("flashmla-sgl", 1.0)
    refused = build("flashmla-sgl-invariant", 1.0)
    for r in refused:
        r.update(status="unsupported", message="no switch on sm90")
    refused[0]["message"] = "prefill has none"
    (group,) = instance_groups(rows + refused)
    inv = group[1]
    assert (inv.cases, inv.unsupported, inv.reasons) == (
        0,
        3,
        ["prefill has none", "no switch on sm90"],
    )
    assert paragraph(inv).startswith(
        "**flashmla-sgl-invariant**: 0 of 0 cases ok, "
        "3 unsupported (prefill has none / no switch on sm90)"
    )


def test_report_has_both_sections(tmp_path):
    rows = sweep(RIGHT, backend="fm") + sweep(LOW, tokens=8192, backend="fm")
    for r in rows:
        r["backend_base"] = "fm"  # one instance: no side-by-side group of its own
    rows += build("flashmla-0.26", 1.0, limit=(11622, 11623))
    rows += build("flashmla-0.33", 1.1, limit=(11622, 11623))
    run = write_run(tmp_path / "run", rows)
    files = build_report([run], tmp_path / "out")
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## TP x route crossover" in md and "## Backend instances side by side" in md
    assert "fm v3.2 chunk 8K (events): decode-mixed wins at h <= 32" in md
    assert "| v3.2 | 4K | decode-mixed | 2.00 | 2.05 | 2.05 | **0.90** | **0.50** | h <= 16 |" in md
    assert "| v3.2 | 8K | decode-kernel | crash | crash | crash | crash | crash | none |" in md
    assert "time 1.100x flashmla-0.26's" in md
    assert "| flashmla-0.33 | 3/3 | 1.100 | 2e-06 | last ok 11622, first fail 11623 (crash) |" in md
    assert any(f.name == "crossover-fm.png" for f in files)


def test_a_crossover_divides_by_the_timer_all_its_rows_measured():
    rows = sweep({64: (1.0, 0.9, 1.2), 32: (1.0, 0.8, 1.2)})
    for r in rows:  # every row profiled: the decode-mixed makespans lose at 64 heads
        makespan = 1.5 if (param_of(r) == ("decode-mixed", 64)) else 1.0
        r["timing"]["profiler_ms"] = makespan
    (c,) = crossovers(rows)
    assert c.timer == "profiler makespan"
    assert c.ratio(64, "decode-mixed") == pytest.approx(1.5)  # events alone: 0.9
    rows[0]["timing"].pop("profiler_ms")  # one row without it: the whole chunk by events
    (c,) = crossovers(rows)
    assert c.timer == "events" and c.ratio(64, "decode-mixed") == pytest.approx(0.9)


def param_of(r: dict) -> tuple:
    return (r["params"]["route"], r["params"]["num_heads"])
