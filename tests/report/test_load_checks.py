"""Rows are checked on load: junk, rows no run could write and impossible times are refused in
one line by report, compare and merge; a torn last line (a killed writer) is skipped."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

from dsv4bench import cli

GOOD = {
    "kind": "case",
    "case_id": "decode-a",
    "backend": "torch",
    "op": "decode",
    "status": "ok",
    "params": {"model": "v3.2", "layout": "v32"},
    "timing": {"median_ms": 0.1, "n": 5},
}


def run_dir(path: Path, text: str | bytes) -> Path:
    path.mkdir(parents=True)
    f = path / "results.jsonl"
    f.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def lines(*rows) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


BAD = {
    "binary junk": (bytes(range(256)) * 40, "results.jsonl:1: not a JSON object"),
    "a foreign object": (lines(GOOD, {"foo": 1}), "results.jsonl:2: not a result row: no case_id"),
    "NaN median": (
        lines({**GOOD, "timing": {"median_ms": math.nan}}),
        "results.jsonl:1: not a result row: median_ms nan is not a finite time >= 0",
    ),
    "negative median": (
        lines({**GOOD, "timing": {"median_ms": -1.0}}),
        "median_ms -1.0 is not a finite time >= 0",
    ),
    "unknown status": (lines({**GOOD, "status": "great"}), "unknown status 'great'"),
    # wrongly typed fields crashed report and compare with a traceback
    "env a string": (
        lines(GOOD, {**GOOD, "env": "H100"}),
        "results.jsonl:2: not a result row: env 'H100' is text, expected a mapping",
    ),
    "params a list": (
        lines({**GOOD, "params": ["v3.2"]}),
        "results.jsonl:1: not a result row: params ['v3.2'] is a list, expected a mapping",
    ),
    "timing a number": (
        lines({**GOOD, "timing": 0.1}),
        "timing 0.1 is a float, expected a mapping",
    ),
    "tags text": (lines({**GOOD, "tags": "smoke"}), "tags 'smoke' is text, expected a list"),
    "a serving point's tp": (
        lines({"kind": "serving", "metric": "tpot", "value_ms": 1.0, "tp": "8"}),
        "tp '8' is text, expected an integer",
    ),
}


@pytest.mark.parametrize("what", list(BAD))
@pytest.mark.parametrize("command", ["report", "compare", "merge"])
def test_junk_is_refused_in_one_line(tmp_path, capsys, what, command):
    text, why = BAD[what]
    bad = run_dir(tmp_path / "bad", text)
    good = run_dir(tmp_path / "good", lines(GOOD))
    args = {
        "report": ["report", bad, "--out", tmp_path / "out"],
        "compare": ["compare", good, bad, "--out", tmp_path / "out"],
        "merge": ["merge", good, bad, "--out", tmp_path / "out"],
    }[command]
    if command == "merge":
        good.joinpath("results.jsonl").write_text(lines({**GOOD, "case_id": "other"}))
    code = cli.main([str(a) for a in args])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    if command == "merge" and what == "binary junk":
        why = "unreadable line(s)"
    assert why in err
    assert not (tmp_path / "out" / "report.md").exists()


def test_a_torn_last_line_is_skipped_by_report(tmp_path, capsys):
    run = run_dir(tmp_path / "r", lines(GOOD) + '{"kind": "case", "case_')
    assert cli.main(["report", str(run), "--in-place"]) == 0
    assert "torn last line 2 skipped" in capsys.readouterr().err
    assert (run / "report.md").is_file()


def test_every_committed_results_file_loads():
    from dsv4bench.report.load import load_rows

    root = Path(__file__).resolve().parents[2] / "results"
    found = [*root.rglob("results.jsonl"), *root.rglob("results.jsonl.gz")]
    assert any(p.suffix == ".gz" for p in found) and any(p.suffix == ".jsonl" for p in found)
    for p in found:
        assert load_rows(p)


def test_a_compressed_run_reads_as_its_plain_rows(tmp_path):
    import gzip

    from dsv4bench.report.load import load_rows
    from dsv4bench.rows.results import read_rows

    smoke = Path(__file__).resolve().parents[2] / "results" / "cpu" / "smoke" / "results.jsonl"
    packed = tmp_path / "packed"
    packed.mkdir()
    (packed / "results.jsonl.gz").write_bytes(gzip.compress(smoke.read_bytes()))
    assert list(read_rows(packed)) == list(read_rows(smoke))
    plain = [{**r, "_run": "packed"} for r in load_rows(smoke)]
    assert load_rows(packed) == plain and load_rows(packed / "results.jsonl.gz") == plain


def test_a_failed_row_is_credited_no_time_or_derived_figure():
    from dsv4bench.report.load import load_rows

    root = Path(__file__).resolve().parents[2]
    rows = load_rows(root / "results/sm90/studies/engine-kernels/flashinfer-fa3")
    failed = [r for r in rows if r["kind"] == "case" and r["status"] != "ok"]
    credited = [r for r in rows if (r.get("derived") or {}).get("tflops")]
    assert failed and credited  # the committed run holds both
    assert all(r["timing"] is None and r["derived"] is None for r in failed)
    kept = [r for r in failed if "not_credited" in r["info"]]
    assert max(r["info"]["not_credited"]["derived"]["tflops"] for r in kept) > 600


def test_old_oracle_rows_load_as_reference_rows(tmp_path):
    from dsv4bench.report.load import load_rows

    old = {**GOOD, "accuracy": {"cos_diff": 0.0, "lse_max_abs": 0.0, "nonfinite": 0}}
    other = {**old, "backend": "flashmla"}
    (row,) = load_rows(run_dir(tmp_path / "r", lines(old)))
    assert row["accuracy"] is None and "the oracle itself" in row["info"]["reference_row"]
    (kept,) = load_rows(run_dir(tmp_path / "k", lines(other)))
    assert kept["accuracy"]["cos_diff"] == 0.0


def test_report_of_an_empty_results_file_is_one_line_exit_2(tmp_path, capsys):
    run = run_dir(tmp_path / "empty", "")
    for path in (run, run / "results.jsonl"):
        assert cli.main(["report", str(path), "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert err == f"dsv4bench: {path}: holds no result rows (an empty results file)\n"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "packed", [b"", gzip.compress(b""), gzip.compress(b"\n\n")], ids=["0-byte", "empty", "blank"]
)
def test_report_of_an_empty_packed_results_file_is_one_line_exit_2(tmp_path, capsys, packed):
    run = tmp_path / "empty"
    run.mkdir()
    (run / "results.jsonl.gz").write_bytes(packed)
    for path in (run, run / "results.jsonl.gz"):
        assert cli.main(["report", str(path), "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert err == f"dsv4bench: {path}: holds no result rows (an empty results file)\n"
    assert not (tmp_path / "out").exists()


def test_report_of_a_damaged_packed_results_file_is_one_line_exit_2(tmp_path, capsys):
    run = tmp_path / "damaged"
    run.mkdir()
    (run / "results.jsonl.gz").write_bytes(gzip.compress(lines(GOOD).encode())[:-9])
    assert cli.main(["report", str(run), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"dsv4bench: {run / 'results.jsonl.gz'}: not a readable gzip file (")
    assert err.count("\n") == 1


def test_rows_of_an_unknown_kind_are_counted_and_a_newer_schema_is_refused(tmp_path, capsys):
    later = {"kind": "trace", "case_id": "decode-a", "backend": "torch"}
    run = run_dir(tmp_path / "r", lines(GOOD, later, later, {**later, "kind": "probe"}))
    assert cli.main(["report", str(run), "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert err == (
        f"dsv4bench: {run / 'results.jsonl'}: rows this version does not know ignored: "
        "1 of kind 'probe', 2 of kind 'trace' (written by a newer dsv4bench?)\n"
    )
    # a row of a newer format may mean other things by the same fields: refused, not misread
    newer = run_dir(tmp_path / "n", lines(GOOD, {**GOOD, "schema": 2}))
    plain = run_dir(tmp_path / "p", lines({**GOOD, "case_id": "other"}))
    for args in (["report", newer], ["compare", plain, newer], ["merge", plain, newer]):
        code = cli.main([str(a) for a in [*args, "--out", tmp_path / "o"]])
        err = capsys.readouterr().err
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert err.strip().endswith(
            "results.jsonl:2: not a result row: row schema 2 is newer than this dsv4bench "
            "reads (1): update it"
        )
