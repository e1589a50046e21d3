"""Result files: a crash mid-row loses nothing on resume, and readers say what they skipped."""

from __future__ import annotations

import json

from dsv4bench.rows.results import ResultWriter, read_rows


def row(i: int) -> dict:
    return {"kind": "case", "case_id": f"c{i}", "backend": "torch", "status": "ok"}


def test_a_torn_last_line_moves_to_a_side_file_and_the_next_row_stays_whole(tmp_path):
    w = ResultWriter(tmp_path)
    w.append(row(0))
    w.append(row(1))
    data = w.path.read_bytes()
    w.path.write_bytes(data[: len(data) - 20])  # killed in the middle of row 1
    fragment = data[data.index(b"\n") + 1 : len(data) - 20]

    again = ResultWriter(tmp_path)  # what --resume opens
    assert again.torn == tmp_path / "results.jsonl.torn"
    assert again.torn.read_bytes() == fragment + b"\n"
    again.append(row(2))
    rows = read_rows(tmp_path)
    assert [r["case_id"] for r in rows] == ["c0", "c2"] and rows.unreadable == ()
    assert again.finished() == {("c0", "torch"), ("c2", "torch")}  # c1 runs again
    assert ResultWriter(tmp_path).torn is None  # a repaired file needs nothing more


def test_a_whole_row_missing_only_its_newline_is_kept(tmp_path):
    w = ResultWriter(tmp_path)
    w.append(row(0))
    w.path.write_bytes(w.path.read_bytes() + json.dumps(row(1)).encode())
    again = ResultWriter(tmp_path)
    again.append(row(2))
    assert again.torn is None
    assert [r["case_id"] for r in read_rows(tmp_path)] == ["c0", "c1", "c2"]


def test_readers_count_and_report_unreadable_lines(tmp_path, capsys):
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(row(0)) + "\n{not json\n[1, 2]\n" + json.dumps(row(1)) + '\n{"c')
    rows = read_rows(path)
    assert [r["case_id"] for r in rows] == ["c0", "c1"]
    assert rows.unreadable == (2, 3, 5)
    err = capsys.readouterr().err
    assert f"{path}: 3 unreadable line(s) skipped (line 2, 3, 5)" in err
    assert read_rows(path, quiet=True).unreadable == (2, 3, 5)
    assert capsys.readouterr().err == ""


def test_retry_failed_leaves_failed_cases_to_run_again(tmp_path):
    w = ResultWriter(tmp_path)
    w.append({**row(0), "status": "crash"})
    w.append({**row(1), "status": "incorrect"})
    w.append({**row(2), "status": "crash", "tags": ["limit-probe"]})
    w.append({**row(3), "kind": "limit", "status": "crash"})
    w.append({**row(4), "status": "crash"})
    w.append(row(4))  # retried once already: its last row is ok
    everything = {(f"c{i}", "torch") for i in range(5)}
    assert w.finished() == everything
    assert w.finished(retry_failed=True) == everything - {("c0", "torch"), ("c1", "torch")}
