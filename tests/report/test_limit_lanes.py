"""Several limit searches of one lane read as one limit (report, builds side by side, compare),
as in results/sm90/studies/routes-limits: the 0.33.0 build's first search found no failure up to
12288, a second (--resume) found 14527 ok / 14528 failing; the 0.26.0 build's search began at
11622."""

from __future__ import annotations

import json

from dsv4bench.report import build_report, compare
from dsv4bench.report.builds import instance_groups, paragraph
from dsv4bench.report.limit_lanes import lane_id, merge_limits
from dsv4bench.report.route_crossover import crossovers
from dsv4bench.report.sections.crossover import _sentence
from tests.factories import write_run


def limit(backend, lo, last_ok, first_fail, probes, *, route="decode-kernel", step=1):
    params = dict(model="v4-flash", num_heads=64, tokens=lo, route=route, context_len=32768)
    return {
        "kind": "limit",
        "_run": "builds",
        "case_id": f"limit-tokens-prefill-t{lo}",
        "op": "prefill",
        "backend": backend,
        "backend_base": "flashmla",
        "axis": "tokens",
        "params": params,
        "last_ok": last_ok,
        "first_fail": first_fail,
        "probes": {str(k): v for k, v in probes.items()},
        "status": "crash" if first_fail else "ok",
        "message": "CUDA error" if first_fail else f"no failure up to {last_ok}",
        "step": step,
        "tags": [],
    }


def case(backend, case_id, ms):
    return {
        "kind": "case",
        "_run": "builds",
        "case_id": case_id,
        "op": "decode",
        "backend": backend,
        "backend_base": "flashmla",
        "status": "ok",
        "params": {"model": "v4-flash", "num_heads": 64, "batch_size": 64},
        "tags": [],
        "timing": {"median_ms": ms, "samples_ms": [ms] * 20, "n": 20},
        "accuracy": {"cos_diff": 2e-6},
    }


def two_builds() -> list[dict]:
    return [
        case("fm-0.26", "decode-a", 0.1),
        case("fm-0.33", "decode-a", 0.1),
        limit("fm-0.26", 11622, 11622, 11623, {11622: "ok", 11623: "crash"}),
        limit("fm-0.33", 11264, 12288, None, {11264: "ok", 12288: "ok"}, step=16),
        limit("fm-0.33", 12288, 14527, 14528, {12288: "ok", 14527: "ok", 14528: "crash"}),
        limit("fm-0.33", 49152, 57344, 58368, {57344: "ok", 58368: "error"}, route="decode-mixed"),
    ]


def test_searches_of_one_lane_are_joined_and_other_lanes_kept():
    rows = merge_limits(two_builds())
    limits = [r for r in rows if r["kind"] == "limit"]
    assert len(limits) == 3  # 0.26 decode-kernel, 0.33 decode-kernel (joined), 0.33 mixed
    joined = limits[1]
    assert (joined["last_ok"], joined["first_fail"], joined["status"]) == (14527, 14528, "crash")
    assert list(joined["probes"]) == ["11264", "12288", "14527", "14528"]
    assert joined["info"]["searches"] == [
        "limit-tokens-prefill-t11264",
        "limit-tokens-prefill-t12288",
    ]
    assert limits[2]["first_fail"] == 58368  # a lane of its own (decode-mixed)
    # one lane id per lane whatever the instance and the search's start
    assert lane_id(limits[0]) == lane_id(joined) != lane_id(limits[2])


def test_disagreeing_probes_never_put_last_ok_above_first_fail():
    # a second search saw 14000 fail where the first saw 14400 pass (a flaky size): the joined
    # limit is bounded by the lowest failure, and last_ok is the best pass below it
    first = limit("fm-0.33", 12288, 14400, 14528, {12288: "ok", 14400: "ok", 14528: "crash"})
    second = limit("fm-0.33", 13000, 13500, 14000, {13000: "ok", 13500: "ok", 14000: "crash"})
    (joined,) = merge_limits([first, second])
    assert (joined["last_ok"], joined["first_fail"]) == (13500, 14000)
    assert joined["last_ok"] < joined["first_fail"]


def test_builds_side_by_side_show_the_joined_limit_only():
    _, new = instance_groups(two_builds())[0]
    text = paragraph(new)
    assert "decode-kernel v4-flash h64 tokens limit: last ok 14527, first fail 14528" in text
    assert "no failure up to 12288" not in text


def test_compare_matches_limits_of_two_builds_by_lane(tmp_path):
    run = tmp_path / "run"
    write_run(run, two_builds())
    code, _ = compare.compare(run, run, tmp_path / "out", backends=("fm-0.26", "fm-0.33"))
    md = (tmp_path / "out" / "compare.md").read_text()
    assert code == 0 and "## Only in base" not in md
    limits = md.split("## Measured limits", 1)[1].split("##", 1)[0]
    assert "| 11622 | 11623 | 14527 | 14528 |" in limits
    assert "0 only in base, 1 only in new" in md  # the mixed lane was searched on 0.33 only


def test_crash_boundary_names_a_limit_off_the_prediction(tmp_path):
    rows = two_builds()
    for r in rows:
        r["env"] = {"gpu": "NVIDIA H200", "smem_per_block_optin": 232448}
    run = write_run(tmp_path / "run", rows)
    build_report([run], tmp_path / "out")
    md = (tmp_path / "out" / "report.md").read_text()
    assert "fm-0.33 (v4-flash, decode-kernel, tokens): last ok **14527**" in md
    assert "not the predicted 11622" in md and "no failure up to 12288" not in md
    assert (
        "fm-0.26 (v4-flash, decode-kernel, tokens): last ok **11622**, first failure "
        "**11623** (crash); sglang" in md
    )


def test_a_route_that_never_wins_says_so():
    rows = []
    for heads in (64, 32, 16):
        for route, ms in (("sparse-prefill", 1.0), ("decode-mixed", 1.7)):
            params = dict(model="v3.2", num_heads=heads, tokens=4096, route=route)
            rows.append({**case("fm", f"p{heads}{route}", ms), "op": "prefill", "params": params})
    (c,) = crossovers(rows)
    assert "decode-mixed loses at every measured head count (h16..h64)" in _sentence(c)


def test_limit_probes_are_no_crossover_points():
    # a limit search's probes are prefill rows too (3 calls, at the limit's sizes): a probe
    # that seems to win must not turn a route that never wins into a crossover
    rows = []
    for heads in (64, 32, 16):
        for route, ms in (("sparse-prefill", 1.0), ("decode-mixed", 1.7)):
            params = dict(model="v3.2", num_heads=heads, tokens=4096, route=route)
            rows.append({**case("fm", f"p{heads}{route}", ms), "op": "prefill", "params": params})
    probe = dict(rows[-1], case_id="probe", tags=["limit-probe"])
    probe["timing"] = {"median_ms": 0.1, "samples_ms": [0.1] * 3, "n": 3}
    rows[-1] = probe  # the decode-mixed point at h16 measured by a probe only
    (c,) = crossovers(rows)
    assert "decode-mixed loses at every measured head count (h32..h64)" in _sentence(c)


def test_a_batch_limit_of_any_backend_reads_without_flashmlas_or_sglangs_story(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    lim = limit("crashy", 1, 5, 6, {1: "ok", 5: "ok", 6: "crash"})
    lim.update(op="decode", axis="batch_size", params={"model": "v3.2", "batch_size": 1})
    (run / "results.jsonl").write_text(json.dumps(lim) + "\n")
    build_report([run], tmp_path / "out")
    md = (tmp_path / "out" / "report.md").read_text()
    section = md.split("## Crash boundary", 1)[1].split("\n## ", 1)[0]
    assert "measured limits" in section and "last ok **5**, first failure **6** (crash)." in section
    assert "sglang" not in section and "FlashMLA" not in section and "11673" not in section


def test_a_run_without_limits_or_failed_decode_route_rows_draws_no_crash_boundary(tmp_path):
    from pathlib import Path

    smoke = Path(__file__).resolve().parents[2] / "results" / "cpu" / "smoke"
    files = build_report([smoke], tmp_path / "out")
    assert "crash-boundary.png" not in {f.name for f in files}
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Crash boundary" not in md and "no limit rows and no failed decode-route" in md
