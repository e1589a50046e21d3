"""Typed rows: invariants, every committed row still loads, one tolerance for run and report."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsv4bench import rows
from dsv4bench.cases.case import Case, Tolerance
from dsv4bench.report.load import accuracy_failure, normalize, tolerance
from dsv4bench.rows.results import ResultWriter

ROOT = Path(__file__).resolve().parents[2]
ACC = {"cos_diff": 6e-6, "lse_max_abs": 1e-6, "nonfinite": 0}


def test_every_committed_row_loads_and_round_trips():
    from dsv4bench.rows.results import read_rows

    files = sorted(
        [*ROOT.glob("results/**/results.jsonl"), *ROOT.glob("results/**/results.jsonl.gz")]
    )
    assert files, "no committed results"
    kinds = set()
    for f in files:
        for raw in read_rows(f):
            record = rows.from_dict(raw)
            kinds.add(record.kind)
            back = record.to_dict()
            assert {k: v for k, v in back.items() if k in raw} == raw | {"kind": record.kind}
    assert {"case", "serving"} <= kinds


@pytest.mark.parametrize(
    "fields, problem",
    [
        ({"status": "crash", "accuracy": ACC, "tolerance": {}}, "accuracy on a row with status"),
        ({"status": "incorrect", "timing": {"median_ms": 1.0}}, "timing on a row with status"),
        ({"status": "ok", "accuracy": ACC}, "accuracy without the tolerance"),
        ({"status": "fine"}, "unknown status 'fine'"),
    ],
)
def test_case_row_invariants(fields, problem, tmp_path):
    with pytest.raises(rows.RowError, match=problem):  # built in code: refused at once
        rows.CaseRow(case_id="c", **fields)
    row = rows.CaseRow(case_id="c", **fields, validate=False)  # as read from a file
    assert any(problem in p for p in row.problems())
    with pytest.raises(rows.RowError, match=problem):
        ResultWriter(tmp_path).append(row)
    assert not (tmp_path / "results.jsonl").exists()


def test_a_serving_point_has_a_value_exactly_when_ok():
    assert rows.ServingRow(value_ms=1.0).status == "ok"
    assert rows.ServingRow().status == "error"
    assert rows.ServingRow(value_ms=1.0, status="error", validate=False).problems()
    with pytest.raises(rows.RowError, match="value_ms"):
        rows.ServingRow(value_ms=1.0, status="error")


def test_the_row_carries_its_tolerance_and_the_report_uses_it():
    prefill = Case("t", "prefill", "v4-flash", 512, 512, 64, tokens=128, layout="v4")
    assert prefill.tolerance == Tolerance(7e-6, 1e-3)  # FlashMLA's prefill tolerance
    assert Case("t", "decode", "v3.2", 576, 512, 64).tolerance.cos_diff == 5e-6
    judged = {"kind": "case", "op": "prefill", "status": "ok", "accuracy": ACC}
    # the run judged it at 7e-6 and says so: the report agrees
    row = normalize({**judged, "tolerance": {"cos_diff": 7e-6, "lse_abs": 1e-3}}, "r")
    assert tolerance(row)["cos_diff"] == 7e-6 and accuracy_failure(row) is None
    # a stricter tolerance of its own wins over the op's default
    strict = normalize({**judged, "tolerance": {"cos_diff": 5e-6, "lse_abs": 1e-3}}, "r")
    assert accuracy_failure(strict) == "cos_diff 6e-06 > 5e-06"
    # a row written before rows carried it: the Case default of its op
    assert accuracy_failure(normalize(judged, "r")) is None


def test_old_rows_keep_their_scale_reading():
    old = {"kind": "case", "status": "ok", "info": {"v32_scale_reading": "bf16"}}
    assert rows.from_dict(old).scale_reading == "bf16"


def test_serving_rows_keep_their_dequant_and_c128_modes():
    from dsv4bench import serving as sv

    spec = sv.spec_from_dict(
        {
            "model": "v4-flash",
            "prompt_lens": [4096],
            "chunk_sizes": [4096],
            "routes": ["sparse-prefill"],
            "dequant": ["pool"],
            "batch_sizes": [1],
            "contexts": [8192],
            "c128_index": "layer",
            "backends": ["kern"],
        }
    )
    for raw in sv.aggregate(sv.plan(spec), []):
        record = rows.from_dict(raw)
        assert isinstance(record, rows.ServingRow) and not record.extra
        assert (record.dequant, record.c128_index) == (raw["dequant"], raw["c128_index"])
        assert record.to_dict()["dequant"] in ("pool", None)
