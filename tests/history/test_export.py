"""`dsv4bench history export`: a run's rows as PyTorch OSS benchmark database v3 records, valid
against a JSON schema written from the database's table (oss_benchmark_v3.schema.json)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from tests.history.conftest import BASELINE

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is not installed (.[test])")
SCHEMA = json.loads((Path(__file__).parent / "oss_benchmark_v3.schema.json").read_text())


def test_smoke_baseline_exports_valid_v3_records(tmp_path, run_cli):
    out = tmp_path / "v3.json"
    code, stdout, _ = run_cli("history", "export", BASELINE, "--out", out)
    assert code == 0, stdout
    records = json.loads(out.read_text())
    validator = jsonschema.Draft202012Validator(SCHEMA)
    for r in records:
        validator.validate(r)
    rows = [json.loads(line) for line in (BASELINE / "results.jsonl").open()]
    timed = [r for r in rows if r["status"] == "ok" and r.get("timing")]
    judged = [r for r in rows if (r.get("accuracy") or {}).get("cos_diff") is not None]
    names = [r["metric"]["name"] for r in records]
    assert names.count("median_ms") == len(timed) and names.count("cos_diff") == len(judged)
    first = next(r for r in records if r["metric"]["name"] == "median_ms")
    row = timed[0]
    assert first["model"]["backend"] == row["backend"]
    assert first["model"]["name"] == row["params"]["model"]
    assert first["benchmark"]["extra_info"]["case_id"] == row["case_id"]
    assert first["metric"]["benchmark_values"] == row["timing"]["samples_ms"]
    assert first["head_sha"] == row["env"]["git_commit"]
    assert first["runners"][0]["type"] == "cpu x86_64"


def test_the_schema_refuses_what_the_database_would(tmp_path, run_cli):
    out = tmp_path / "v3.json"
    assert run_cli("history", "export", BASELINE, "--out", out)[0] == 0
    good = json.loads(out.read_text())[0]
    validator = jsonschema.Draft202012Validator(SCHEMA)
    broken = []
    for change in (
        lambda r: r.pop("metric"),
        lambda r: r["model"]["extra_info"].update(num_heads=8),  # Map(String, String)
        lambda r: r["metric"].update(benchmark_values=["fast"]),
        lambda r: r.update(schema_version="v2"),
    ):
        bad = copy.deepcopy(good)
        change(bad)
        broken.append(not validator.is_valid(bad))
    assert broken == [True] * 4


def test_serving_points_export_as_ttft_and_tpot(tmp_path, run_cli):
    from dsv4bench.history.export import serving_records

    row = {
        "metric": "tpot",
        "model": "v4-flash",
        "backend": "torch",
        "status": "ok",
        "value_ms": 2.5,
        "batch_size": 4,
        "scenario": "s",
    }
    common = {"head_sha": "abc"}
    (rec,) = serving_records(row, common)
    assert rec["metric"]["name"] == "tpot_ms" and rec["metric"]["benchmark_values"] == [2.5]
    assert rec["metric"]["extra_info"]["batch_size"] == "4"
    assert serving_records({**row, "status": "error", "value_ms": None}, common) == []
