"""compare: time, accuracy, status and limit regressions between two result sets."""

from __future__ import annotations

import copy
import gzip
import json

from dsv4bench.report import compare
from dsv4bench.report.compare import time_change
from tests.factories import write_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def row(
    case_id: str,
    backend: str = "flashmla",
    *,
    ms: float = 0.1,
    spread: float = 0.01,
    n: int = 20,
    status: str = "ok",
    cos: float = 2e-6,
    op: str = "decode",
    message: str = "",
) -> dict:
    """A case row with `n` samples spread +-spread around `ms`."""
    samples = [ms * (1 + spread * (2 * i / max(1, n - 1) - 1)) for i in range(n)]
    samples.sort()
    timed = status in ("ok", "incorrect")
    return {
        "kind": "case",
        "scenario": "t",
        "case_id": case_id,
        "op": op,
        "params": {"model": "v4-flash", "layout": "v4", "batch_size": 64, "num_heads": 64},
        "tags": [],
        "backend": backend,
        "provider": None,
        "status": status,
        "message": message,
        "accuracy": {"cos_diff": cos, "lse_max_abs": 1e-7, "nonfinite": 0} if timed else None,
        "timing": {
            "median_ms": samples[n // 2] if n % 2 else (samples[n // 2 - 1] + samples[n // 2]) / 2,
            "p10_ms": samples[max(0, n // 10)],
            "p90_ms": samples[min(n - 1, 9 * n // 10)],
            "n": n,
            "method": "events",
            "samples_ms": samples,
        }
        if timed
        else None,
        "derived": None,
        "info": {},
        "env": {"gpu": "H100"},
        "input_fingerprint": None,
    }


def base_rows() -> list[dict]:
    return [
        row("decode-a", ms=0.10),
        row("decode-b", ms=0.20),
        row("decode-c", ms=0.05),
        row("decode-a", "triton", ms=0.30),
        row("prefill-d", ms=1.5, op="prefill", cos=3e-6),
    ]


def find(rows, case_id, backend="flashmla"):
    return next(r for r in rows if r["case_id"] == case_id and r["backend"] == backend)


def run(tmp_path, base, new, **kw):
    b = write_run(tmp_path / "base", base)
    n = write_run(tmp_path / "new", new)
    code, files = compare.compare(b, n, tmp_path / "out", **kw)
    md = (tmp_path / "out" / "compare.md").read_text()
    return code, files, md


def test_identical_runs_exit_0(tmp_path, capsys):
    b = write_run(tmp_path / "base", base_rows())
    code, files = compare.compare(b, b, tmp_path / "out")
    assert code == 0
    assert (tmp_path / "out" / "compare.md") in files
    md = (tmp_path / "out" / "compare.md").read_text()
    assert "no regression" in md and "5 matched" in md
    assert "no regression" in capsys.readouterr().out
    png = tmp_path / "out" / "compare-ratios.png"
    assert png in files and png.read_bytes()[:8] == PNG_MAGIC


def test_slower_with_tight_samples_is_a_regression_listed_first(tmp_path, capsys):
    new = copy.deepcopy(base_rows())
    new[1] = row("decode-b", ms=0.24)  # 20% slower, +-1% spread, 20 samples each
    code, _, md = run(tmp_path, base_rows(), new)
    assert code == 1
    out = capsys.readouterr().out
    assert "REGRESSION" in out
    first = [line for line in out.splitlines() if line.startswith("  ")][0]
    assert "decode-b" in first and "x1.200" in first
    table = md.split("## Time ratios, worst first", 1)[1]
    assert "| case_id | backend | base ms | new ms | new / base |" in table
    assert "| `decode-b` | flashmla | 0.2 | 0.24 | 1.200 |" in table
    rows_md = [line for line in table.splitlines() if line.startswith("| `")]
    assert "decode-b" in rows_md[0]
    assert "| time | `decode-b` | flashmla |" in md


def test_slower_but_noisy_or_few_samples_is_not(tmp_path):
    base = base_rows()
    base[1] = row("decode-b", ms=0.20, spread=0.5)  # +-50%: overlapping spreads
    new = copy.deepcopy(base)
    new[1] = row("decode-b", ms=0.24, spread=0.5)
    new[2] = row("decode-c", ms=0.06, n=3)  # 20% slower, tight, but 3 samples
    code, _, md = run(tmp_path, [*base[:2], row("decode-c", ms=0.05, n=3), *base[3:]], new)
    assert code == 0
    assert "slower, within noise" in md and "too few samples" in md


def test_ok_to_crash_is_a_regression(tmp_path):
    new = copy.deepcopy(base_rows())
    new[0] = row("decode-a", status="crash", message="worker exited with code 1: CUDA error")
    code, _, md = run(tmp_path, base_rows(), new)
    assert code == 1
    assert "ok -> crash" in md and "## Status changes" in md


def test_accuracy_beyond_tolerance_is_a_regression(tmp_path):
    new = copy.deepcopy(base_rows())
    new[4] = row("prefill-d", ms=1.5, op="prefill", cos=2e-5)  # still "ok" by its status
    code, _, md = run(tmp_path, base_rows(), new)
    assert code == 1
    assert "| accuracy | `prefill-d` |" in md and "cos_diff 2e-05 > 7e-06" in md
    # within the prefill tolerance (7e-6): not a regression
    new[4] = row("prefill-d", ms=1.5, op="prefill", cos=6e-6)
    code, _, _ = run(tmp_path / "again", base_rows(), new)
    assert code == 0


def test_ok_to_incorrect_is_a_regression(tmp_path):
    new = copy.deepcopy(base_rows())
    new[0] = row("decode-a", status="incorrect", message="lse_max_abs 0.5 > 0.001")
    code, _, md = run(tmp_path, base_rows(), new)
    assert code == 1 and "lse_max_abs 0.5" in md


def test_cases_missing_from_new_are_a_regression_unless_partial(tmp_path, capsys):
    base = base_rows()
    new = [*copy.deepcopy(base[1:]), row("decode-new", ms=0.1)]
    code, _, md = run(tmp_path, base, new)
    assert code == 1 and "1 missing" in capsys.readouterr().out
    assert "| missing | `decode-a` | flashmla |" in md
    code, _, md = run(tmp_path, base, new, partial=True)
    assert code == 0
    only_base = md.split("## Only in base", 1)[1].split("##", 1)[0]
    only_new = md.split("## Only in new", 1)[1].split("##", 1)[0]
    assert "decode-a" in only_base and "decode-new" in only_new


def test_an_empty_new_run_is_one_line_exit_2_as_report_says(tmp_path, capsys):
    from dsv4bench import cli

    base = write_run(tmp_path / "base", base_rows())
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "results.jsonl").write_text("")
    for partial in ((), ("--partial",)):
        args = ["compare", str(base), str(empty), "--out", str(tmp_path / "o"), *partial]
        assert cli.main(args) == 2
        out, err = capsys.readouterr()
        assert not out and err.count("\n") == 1
        assert f"{empty}: holds no result rows; expected a NEW run with rows" in err
    assert cli.main(["report", str(empty), "--out", str(tmp_path / "r")]) == 2
    assert not (tmp_path / "o").exists()


def test_an_ok_row_without_timing_does_not_pass_silently(tmp_path, capsys):
    new = copy.deepcopy(base_rows())
    new[0]["timing"] = None  # ok, but nothing measured
    code, _, md = run(tmp_path, base_rows(), new)
    assert code == 1 and "ok but no timing in new" in md
    capsys.readouterr()
    both = copy.deepcopy(new)  # neither side timed: said in the summary, not failed
    code, _, _ = run(tmp_path / "both", both, both)
    out = capsys.readouterr().out
    assert code == 0 and "1 ok on both sides with no timing (not time-gated)" in out


def test_an_empty_base_run_is_one_line_exit_2(tmp_path, capsys):
    from dsv4bench import cli

    new = write_run(tmp_path / "new", base_rows())
    for name, empty in (("results.jsonl", b""), ("results.jsonl.gz", gzip.compress(b""))):
        base = tmp_path / name
        base.mkdir()
        (base / name).write_bytes(empty)
        assert cli.main(["compare", str(base), str(new), "--out", str(tmp_path / "o")]) == 2
        out, err = capsys.readouterr()
        assert not out and err == (
            f"dsv4bench: {base}: holds no result rows; expected a BASE run with rows to compare "
            "against\n"
        )
    assert not (tmp_path / "o").exists()


def test_faster_is_not_a_regression(tmp_path):
    new = copy.deepcopy(base_rows())
    new[1] = row("decode-b", ms=0.10)
    code, _, md = run(tmp_path, base_rows(), new)
    assert code == 0 and "faster" in md


def test_limit_moving_down_is_a_regression(tmp_path):
    def limit(last_ok, first_fail):
        r = row("limit-tokens-x", status="crash")
        r.update(kind="limit", axis="tokens", last_ok=last_ok, first_fail=first_fail, probes={})
        return r

    code, _, _ = run(tmp_path / "same", [limit(11622, 11623)], [limit(11622, 11623)])
    assert code == 0
    code, _, md = run(tmp_path / "down", [limit(11622, 11623)], [limit(8000, 8001)])
    assert code == 1 and "| limit |" in md


def test_pytest_benchmark_json_against_itself(tmp_path):
    data = {
        "benchmarks": [
            {
                "name": "test_decode[x]",
                "stats": {"median": 1e-4, "q1": 0.99e-4, "q3": 1.01e-4, "rounds": 30},
                "extra_info": {
                    "case_id": "decode-x",
                    "backend": "flashmla",
                    "op": "decode",
                    "status": "ok",
                },
            }
        ]
    }
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(data))
    code, _ = compare.compare(path, path, tmp_path / "out")
    assert code == 0


def test_time_rule_uses_quartiles_without_percentiles():
    base = {"median_ms": 1.0, "q1_ms": 0.99, "q3_ms": 1.01, "n": 30}
    slower = {"median_ms": 1.2, "q1_ms": 1.19, "q3_ms": 1.21, "n": 30}
    ratio, verdict, regressed = time_change(base, slower, 0.05)
    assert regressed and round(ratio, 3) == 1.2 and "new q1 1.19 ms > base q3 1.01 ms" in verdict
    ratio, verdict, regressed = time_change(
        {"median_ms": 1.0, "n": 30}, {"median_ms": 1.2, "n": 30}, 0.05
    )
    assert not regressed and verdict == "slower, spread unknown"


def test_serving_points_are_listed_not_judged(tmp_path):
    def point(value):
        return {
            "kind": "serving",
            "case_id": "ttft-v4-flash-L4096-C4096-decode-kernel",
            "backend": "flashmla",
            "metric": "ttft",
            "model": "v4-flash",
            "value_ms": value,
            "status": "ok" if value else "crash",
            "parts": [],
        }

    code, _, md = run(tmp_path, [*base_rows(), point(10.0)], [*base_rows(), point(None)])
    assert code == 0
    assert "## Serving points (informational)" in md
    assert "| point | backend | base ms | new ms | new / base | base status | new status |" in md
    assert "`ttft-v4-flash-L4096-C4096-decode-kernel`" in md


def test_contention_inflating_medians_is_not_a_regression_but_a_slower_fast_tail_is():
    """Measured on this 2-core machine under a load of 5: 0.5 ms calls became a 7 ms median
    with a 2.6 ms p10; a build 20 ms slower per call moves the fast tail too."""
    quiet = {"samples_ms": [0.49, 0.5, 0.5, 0.5, 0.51, 0.51, 0.52, 0.53, 0.55, 0.56]}
    busy = {"samples_ms": [2.4, 2.7, 3.5, 5.0, 6.8, 7.2, 7.9, 8.3, 8.5, 8.6]}
    slowed = {"samples_ms": [20.9, 21.0, 21.2, 22.5, 24.0, 25.1, 27.0, 28.4, 30.2, 31.0]}
    for t in (quiet, busy, slowed):
        t.update(median_ms=sorted(t["samples_ms"])[5], n=10)
    ratio, verdict, regressed = time_change(quiet, busy, 9.0)
    assert ratio > 10 and not regressed and "p10 within threshold" in verdict
    ratio, verdict, regressed = time_change(quiet, slowed, 9.0)
    assert regressed and "slower beyond noise" in verdict


# ---- two backend instances of one run (e.g. two FlashMLA builds) ----------------------------


def limit_row(backend: str, last_ok: int) -> dict:
    r = row("limit-tokens-prefill-x", backend, status="crash")
    r.update(kind="limit", axis="tokens", last_ok=last_ok, first_fail=last_ok + 1, timing=None)
    return r


def two_builds(slow_b: float = 1.0, limit_b: int = 11622) -> list[dict]:
    rows = []
    for backend, factor, limit in (("fm-0.26", 1.0, 11622), ("fm-0.33", slow_b, limit_b)):
        rows += [row("decode-a", backend, ms=0.1 * factor), row("decode-b", backend, ms=0.2)]
        rows.append(limit_row(backend, limit))
    return rows + [row("decode-a", "triton", ms=0.3)]  # a third backend: left out


def test_two_instances_of_one_run_are_compared_by_case(tmp_path):
    run = write_run(tmp_path / "run", two_builds())
    code, files = compare.compare(run, run, tmp_path / "out", backends=("fm-0.26", "fm-0.33"))
    md = (tmp_path / "out" / "compare.md").read_text()
    assert code == 0 and "3 matched" in md and "0 only in base, 0 only in new" in md
    assert "backend `fm-0.26`" in md and "backend `fm-0.33`" in md
    assert "fm-0.26 -> fm-0.33" in md and "triton" not in md


def test_a_slower_build_with_a_lower_limit_regresses(tmp_path, capsys):
    run = write_run(tmp_path / "run", two_builds(slow_b=1.3, limit_b=9000))
    code, _ = compare.compare(run, run, tmp_path / "out", backends=("fm-0.26", "fm-0.33"))
    out = capsys.readouterr().out
    assert code == 1 and "1 time" in out and "1 limit" in out
    # the other way round, the faster build with the higher limit is no regression
    code, _ = compare.compare(run, run, tmp_path / "back", backends=("fm-0.33", "fm-0.26"))
    assert code == 0


def test_an_instance_without_rows_is_named(tmp_path):
    import pytest

    from dsv4bench.report import ReportInputError

    run = write_run(tmp_path / "run", two_builds())
    with pytest.raises(ReportInputError, match="no rows of backend 'fm-9'.*fm-0.26, fm-0.33"):
        compare.compare(run, run, tmp_path / "out", backends=("fm-0.26", "fm-9"))


def test_cli_compare_one_run_two_instances(tmp_path, capsys):
    from dsv4bench import cli

    run = write_run(tmp_path / "run", two_builds(slow_b=1.3))
    assert cli.main(["compare", str(run), "--backends", "fm-0.26", "fm-0.33", "--in-place"]) == 1
    assert (run / "compare.md").exists()
    assert "1 time" in capsys.readouterr().out
    assert cli.main(["compare", str(run)]) == 2  # NEW is needed without --backends
    assert "NEW is needed unless --backends" in capsys.readouterr().err
    assert cli.main(["compare", str(run), "--backends", "fm-0.26", "fm-0.26"]) == 2
    assert cli.main(["compare", str(run), "--backends", "fm-0.26", "nope"]) == 2
    assert "no rows of backend 'nope'" in capsys.readouterr().err


def test_runs_on_two_gpus_name_both_and_say_they_differ(tmp_path, capsys):
    new = copy.deepcopy(base_rows())
    for r in new:
        r["env"] = {"gpu": "NVIDIA H200", "arch": "sm90"}
    code, _, md = run(tmp_path, base_rows(), new)
    out = capsys.readouterr().out
    expected = "base on H100, new on NVIDIA H200: different devices"
    assert code == 0 and expected in out and expected in md
    run(tmp_path, base_rows(), base_rows())
    out = capsys.readouterr().out
    assert "compare: base on H100, new on H100\n" in out
