"""The paired gate (dsv4bench/history/paired.py): a run against the comparable run before it,
per backend, on each case's time over the same case's time on the run's other backends. A
backend 10 % slower fails it and is named on the gate and the page; a machine slower for every
backend, one slow case alone, and too few cases pass. CI plants the slowdown in real time
(.ci/run, tests/plugins/planted_slowdown.py); these rows are scaled copies of the baseline."""

from __future__ import annotations

import re

from dsv4bench.history import paired, store
from dsv4bench.report.load import load_rows
from tests.history.conftest import BASELINE, slowed_run
from tests.in_process import main_in_process

FIRST = "decode-v3.2-v32-h8-b2-k64-97dc6d8e1a"  # a case the baseline times on both backends


def pair_history(tmp_path, factor: float, only=None):
    """The baseline (day 1) and a copy of it with `only`'s rows `factor` times slower (day 2)."""
    history = tmp_path / "history"
    runs = [BASELINE, slowed_run(tmp_path / "new", factor, only=only)]
    for day, (run, label) in enumerate(zip(runs, ("ci", "ci-planted"), strict=True), start=1):
        date = f"2026-12-0{day}T12:00:00+00:00"
        args = ("history", "add", run, "--history", history, "--date", date, "--label", label)
        assert main_in_process(*args) == 0
    return history


def torch_rows(row: dict) -> bool:
    return row["backend"] == "torch"


def test_a_backend_ten_percent_slower_fails_and_is_named(tmp_path, run_cli):
    history = pair_history(tmp_path, 1.10, only=torch_rows)
    code, out, _ = run_cli("history", "gate", "--history", history, "--paired")
    assert code == 1, out
    both = len(paired.relative_times(store.entries(history)[0])) // 2
    assert both >= paired.MIN_CASES
    assert re.search(rf"^ +time  median of {both} cases · torch ", out, re.M), out
    assert "reference-f64 x0.909 (faster), torch x1.100 (time)" in out
    # the page: the red banner and torch's row among the regressions
    page = tmp_path / "page"
    args = ("--history", history, "--paired", "--label", "ci-planted", "--no-figures")
    assert run_cli("history", "page", *args, "--out", page)[0] == 0
    html = (page / "index.html").read_text()
    assert '<div id="gate" class="gate regression">REGRESSION: 2026-12-02_' in html
    assert f"<td>median of {both} cases · torch</td><td>time</td><td>x1.100</td>" in html
    assert '<p id="rule">Paired gate (dsv4bench/history/paired.py): 2026-12-02_' in html


def test_a_whole_machine_slower_is_no_regression_for_the_paired_gate(tmp_path, run_cli):
    history = pair_history(tmp_path, 1.5)  # every row: a busy machine, not a kernel
    code, out, _ = run_cli("history", "gate", "--history", history, "--paired")
    assert code == 0 and "reference-f64 x1.000 (ok), torch x1.000 (ok)" in out, out
    # the window rule sees the same run as slower: what the run-relative time cancels
    code, out, _ = run_cli("history", "gate", "--history", history)
    assert code == 1, out


def test_one_slow_case_alone_is_not_judged(tmp_path, run_cli):
    history = pair_history(tmp_path, 3.0, only=lambda r: torch_rows(r) and r["case_id"] == FIRST)
    code, out, _ = run_cli("history", "gate", "--history", history, "--paired")
    assert code == 0 and "torch x1.000 (ok)" in out, out
    entries = store.entries(history)
    (case,) = [v for v in paired.judge_pair(*entries, 0.05) if v.key == f"{FIRST} · torch"]
    assert case.kind == "slower" and abs(case.ratio - 3.0) < 1e-9 and not case.regression


def test_too_few_cases_and_no_base_are_not_judged():
    def entry(i: int, times: dict) -> store.Entry:
        points = [
            store.Point(f"c{c} · {b}", "f", b, "ok", t, t, t, 10)
            for (c, b), t in sorted(times.items())
        ]
        return store.Entry(f"e{i}", f"2026-12-0{i}", "x", "cpu", "h", {}, ["s"], points=points)

    cases = range(paired.MIN_CASES - 1)
    base = entry(1, {**{(c, "a"): 1.0 for c in cases}, **{(c, "b"): 1.0 for c in cases}})
    new = entry(2, {**{(c, "a"): 2.0 for c in cases}, **{(c, "b"): 1.0 for c in cases}})
    verdicts = paired.judge_pair(base, new, 0.05)
    (a,) = [v for v in verdicts if v.key == f"median of {len(cases)} cases · a"]
    assert a.kind == "ok" and a.ratio == 2.0 and "not judged" in a.detail
    assert paired.judge_entry([base, new], base, 0.05) == []
    assert "nothing judged" in paired.pair_line([base, new], base, [])


def test_a_bad_paired_threshold_is_one_line_and_exit_2(tmp_path, run_cli):
    history = pair_history(tmp_path, 1.0)
    code, _, err = run_cli("history", "gate", "--history", history, "--paired-threshold", "-1")
    assert code == 2 and "--paired-threshold -1.0: expected a finite positive fraction" in err


def test_the_fastest_call_is_kept_and_judged_only_where_both_entries_have_it():
    row = next(r for r in load_rows(BASELINE) if r.get("timing"))
    key = f"{row['case_id']} · {row['backend']}"
    (point,) = [p for p in store.entry_of(BASELINE).points if p.key == key]
    assert point.min_ms == min(row["timing"]["samples_ms"]) and point.min_ms < point.p10_ms
    # the id of a run is the one it had before entries kept min_ms: re-added, "already there"
    now = store.entry_of(BASELINE, date="2026-12-01T10:00:00+00:00")
    for p in now.points:
        p.min_ms = None
    assert store._entry_id(now) == now.id

    def entry(i: int, fastest: float | None) -> store.Entry:
        points = [
            store.Point(f"c{c} · {b}", "f", b, "ok", 2.0, 1.0, 3.0, 10, min_ms=fastest)
            for c in range(paired.MIN_CASES)
            for b in ("a", "b")
        ]
        if fastest:  # backend a's fastest call half of b's: a relative time of 0.5
            for p in points[::2]:
                p.min_ms = fastest / 2
        return store.Entry(f"e{i}", f"2026-12-0{i}", "x", "cpu", "h", {}, ["s"], points=points)

    old, new = entry(1, None), entry(2, 0.8)  # a schema 1 entry (p10s alone), then schema 2
    assert not paired.has_fastest(old) and paired.has_fastest(new)
    (a,) = [v for v in paired.judge_pair(old, new, 0.05) if v.key.endswith("cases · a")]
    assert a.ratio == 1.0 and a.kind == "ok"  # p10 on both sides, not p10 against min
    (a,) = [v for v in paired.judge_pair(entry(1, 1.0), new, 0.05) if v.key.endswith("cases · a")]
    assert a.ratio == 1.0
    assert paired.relative_times(new)[("c0", "a")] == 0.5  # a's 0.4 over b's 0.8
