"""The run history: entries keyed by commit, builds, device and date, append-only; the rolling
gate fails a planted 10 % slowdown of the smoke rows and passes noise; the page flags it."""

from __future__ import annotations

import json
import re

from dsv4bench.history import store, trend
from tests.history.conftest import BASELINE, history_of, slowed_run

OK_TIMED = sum(
    1
    for line in (BASELINE / "results.jsonl").open()
    if json.loads(line).get("status") == "ok" and json.loads(line).get("timing")
)


def test_an_entry_is_keyed_and_never_rewritten(tmp_path, run_cli):
    history = tmp_path / "h"
    date = "2026-12-01T10:00:00+00:00"
    code, out, _ = run_cli("history", "add", BASELINE, "--history", history, "--date", date)
    assert code == 0 and out.startswith("added: ")
    (path,) = (history / "entries").glob("*.json")
    entry = store.Entry.from_dict(json.loads(path.read_text()))
    rows = [json.loads(line) for line in (BASELINE / "results.jsonl").open()]
    assert entry.date == date and entry.device == "cpu x86_64"
    assert entry.commit == rows[0]["env"]["git_commit"]
    assert entry.builds["torch"].startswith("reference torch")
    assert len(entry.points) == len(rows)
    assert path.name.startswith(
        f"2026-12-01_cpu-x86-64_{re.sub('[^A-Za-z0-9]', '', entry.commit)[:12]}_"
    )
    before = path.read_bytes()
    code, out, _ = run_cli("history", "add", BASELINE, "--history", history, "--date", date)
    assert code == 0 and out.startswith("already there: ")
    assert path.read_bytes() == before and len(list((history / "entries").glob("*"))) == 1


def test_bad_input_is_one_line_and_exit_2(tmp_path, run_cli):
    code, _, err = run_cli("history", "gate", "--history", tmp_path / "none")
    assert code == 2 and "no history here" in err
    code, _, err = run_cli("history", "add", BASELINE, "--history", tmp_path, "--date", "May")
    assert code == 2 and "--date May: expected an ISO date" in err
    assert not (tmp_path / "entries").exists()
    code, _, err = run_cli(
        "history", "page", "--history", tmp_path, "--out", tmp_path / "p", "--window", "0"
    )
    assert code == 2 and "--window 0: expected at least 1 entry" in err


def test_planted_ten_percent_slowdown_fails_the_gate(planted, run_cli):
    history, _ = planted
    code, out, _ = run_cli("history", "gate", "--history", history)
    assert code == 1, out
    assert "REGRESSION: 2026-12-03_cpu-x86-64_" in out
    assert f": {OK_TIMED} regressed ({OK_TIMED} time)" in out


def test_noise_and_a_small_slowdown_pass_the_gate(tmp_path, run_cli):
    history = history_of(tmp_path, [1.0, 1.01, 1.03])
    code, out, _ = run_cli("history", "gate", "--history", history)
    assert code == 0 and "no regression" in out, out


def test_a_slower_median_within_the_historys_fast_tails_is_noise(tmp_path):
    base = [
        store.Point("k", "f", "b", "ok", 1.0, 0.9, 1.5, 10),
        store.Point("k", "f", "b", "ok", 1.0, 1.2, 1.5, 10),
    ]
    slower = store.Point("k", "f", "b", "ok", 1.2, 1.1, 1.6, 10)
    ratio, kind, _ = trend._time(slower, base, 0.05)
    assert kind == "slower" and abs(ratio - 1.2) < 1e-9  # p10 1.1 is below the window's 1.2
    ratio, kind, _ = trend._time(store.Point("k", "f", "b", "ok", 1.2, 1.3, 1.6, 10), base, 0.05)
    assert kind == "time"
    ratio, kind, _ = trend._time(store.Point("k", "f", "b", "ok", 0.5, 0.45, 0.6, 10), base, 0.05)
    assert kind == "faster" and ratio == 0.5


def test_status_missing_and_entries_of_other_devices(tmp_path):
    def entry(i, device, points):
        return store.Entry(f"e{i}", f"2026-12-0{i}", "c", device, "h", {}, ["smoke"], points=points)

    ok = store.Point("a · t", "f", "t", "ok", 1.0, 0.9, 1.1, 10)
    gone = store.Point("b · t", "f", "t", "ok", 1.0, 0.9, 1.1, 10)
    crashed = store.Point("a · t", "f", "t", "crash")
    history = [entry(1, "cpu x", [ok, gone]), entry(2, "H100", [ok]), entry(3, "cpu x", [crashed])]
    kinds = {v.key: v.kind for v in trend.judge_entry(history, history[2], 0.05)}
    assert kinds == {"a · t": "status", "b · t": "missing"}
    assert {v.kind for v in trend.judge_entry(history, history[1], 0.05)} == {"new"}


def test_the_page_shows_the_planted_slowdown(planted):
    _, page = planted
    html = (page / "index.html").read_text()
    assert '<div id="gate" class="gate regression">REGRESSION: 2026-12-03_' in html
    flagged = re.findall(
        r'<tr class="regression"><td>2026-12-03_[^<]*</td><td>([^<]*)</td><td>time</td>', html
    )
    assert len(flagged) == OK_TIMED
    images = re.findall(r'<img src="([^"]+)"', html)
    assert images and all((page / name).is_file() for name in images)
    assert "decode/v3.2/v32" in html and "x1.09" in html


def test_a_resumed_runs_last_row_counts(tmp_path):
    run = tmp_path / "resumed"
    run.mkdir()
    first = json.loads((BASELINE / "results.jsonl").open().readline())
    again = {**first, "status": "crash", "timing": None, "derived": None, "accuracy": None}
    again["message"] = "boom"
    lines = [json.dumps(first), json.dumps(again)]
    (run / "results.jsonl").write_text("\n".join(lines) + "\n")
    (point,) = store.entry_of(run).points
    assert point.status == "crash" and point.median_ms is None


def test_a_run_without_rows_gives_no_entry(tmp_path, run_cli):
    run = tmp_path / "empty"
    run.mkdir()
    (run / "results.jsonl").write_text(
        json.dumps({"kind": "limit", "backend": "t", "case_id": "c", "status": "ok"}) + "\n"
    )
    code, _, err = run_cli("history", "add", run, "--history", tmp_path / "h")
    assert code == 2 and "holds no case or serving rows" in err


def test_slowed_run_scales_every_timing(tmp_path):
    run = slowed_run(tmp_path / "s", 2.0)
    a = [json.loads(x) for x in (BASELINE / "results.jsonl").open()]
    b = [json.loads(x) for x in (run / "results.jsonl").open()]
    pairs = [(x["timing"], y["timing"]) for x, y in zip(a, b, strict=True) if x.get("timing")]
    assert pairs and all(abs(y["median_ms"] - 2 * x["median_ms"]) < 1e-12 for x, y in pairs)


def test_the_committed_history_has_a_smoke_trend_and_stays_small():
    from tests.history.conftest import ROOT

    folder = ROOT / "results" / "history"
    entries = store.entries(folder)
    smoke = [e for e in entries if e.scenarios == ["smoke"]]
    assert len(smoke) >= 2 and smoke[-1].date > smoke[0].date
    serving = [p for e in entries for p in e.points if p.family.startswith(("ttft/", "tpot/"))]
    assert serving
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    assert size < 1 << 20, size
    html = (folder / "trend" / "index.html").read_text()
    assert all(f"{e.commit}" in html for e in entries)


def test_the_committed_trend_page_is_the_current_codes(tmp_path, run_cli):
    # what .ci/run checks: --no-figures writes the HTML alone, the same as a drawn page's
    from tests.history.conftest import ROOT

    folder = ROOT / "results" / "history"
    args = ("--history", folder, "--time-threshold", "9.0", "--no-figures")
    assert run_cli("history", "page", *args, "--out", tmp_path)[0] == 0
    assert (tmp_path / "index.html").read_text() == (folder / "trend" / "index.html").read_text()
    assert not list(tmp_path.glob("*.png"))


def test_the_page_html_does_not_depend_on_drawing(planted, tmp_path, run_cli):
    history, page = planted
    assert (
        run_cli("history", "page", "--history", history, "--out", tmp_path, "--no-figures")[0] == 0
    )
    assert (tmp_path / "index.html").read_text() == (page / "index.html").read_text()
