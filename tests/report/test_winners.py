"""The report's "which backend wins" section on hand-made rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsv4bench.report.sections import winners
from tests.factories import V4, make_case


def row(case_id, backend, ms, status="ok", **params):
    p = {"op": "decode", "model": "v3.2", "num_heads": 128, "s_q": 1, **params}
    return {
        "kind": "case",
        "case_id": case_id,
        "backend": backend,
        "status": status,
        "params": p,
        "timing": {"median_ms": ms} if ms else None,
    }


ROWS = [
    row("b1", "flashmla", 0.020, batch_size=1),
    row("b1", "flashinfer", 0.030, batch_size=1),
    row("b1", "triton", None, "unsupported", batch_size=1),
    row("b64", "flashmla", 0.110, batch_size=64),
    row("b64", "flashinfer", 0.100, batch_size=64),
    row("b64", "flashinfer-e4m3", 0.090, "incorrect", batch_size=64),  # never wins
    row("alone", "flashmla", 0.5, op="prefill", tokens=4096),
]


def test_winner_margin_and_ratio():
    by_id = {s.case_id: s for s in winners.shapes(ROWS)}
    assert "alone" not in by_id  # one backend: nothing to compare
    assert by_id["b1"].winner == ("flashmla", 0.020) and by_id["b1"].margin == 1.5
    b64 = by_id["b64"]
    assert b64.winner[0] == "flashinfer"  # the faster e4m3 row is incorrect
    assert abs(b64.ratio("flashinfer") - 0.100 / 0.110) < 1e-12
    assert b64.others == {"flashinfer-e4m3": "incorrect"}


def test_section_has_table_and_figure(tmp_path):
    text, images = winners.markdown(ROWS, tmp_path)
    assert "## Which backend wins" in text and "flashmla 1, flashinfer 1" in text
    row64 = (
        "| decode v3.2 h128 | batch 64 | flashinfer | 0.1 | events | 0.1 | flashmla 0.11 | 1.10x |"
    )
    assert row64 in text
    assert "triton: unsupported" in text
    assert [p.name for p in images] == ["winners-ratio.png"] and images[0].stat().st_size > 0


def test_figure_draws_a_line_per_variant_and_leaves_one_size_families_to_the_table(
    tmp_path, monkeypatch
):
    from dsv4bench.report import plots

    drawn = []
    monkeypatch.setattr(plots, "line_figure", lambda *a, **k: drawn.append(a[1]) or None)
    monkeypatch.setattr(plots, "save", lambda fig, path: path)
    rows = []
    for ctx in (8192, 65536):  # one family, two contexts at the same batch sizes
        for b, ms in ((1, 0.02), (64, 0.1)):
            cid = f"b{b}-{ctx}"
            rows.append(row(cid, "flashmla", ms, batch_size=b, context_len=ctx))
            rows.append(row(cid, "triton", ms * 2, batch_size=b, context_len=ctx))
    rows.append(row("h8", "flashmla", 0.5, op="prefill", tokens=4096, num_heads=8))
    rows.append(row("h8", "triton", 0.4, op="prefill", tokens=4096, num_heads=8))
    text, _ = winners.markdown(rows, tmp_path)
    ((panel,),) = drawn  # the one-size prefill family is not a panel
    assert [(s.label, s.xs) for s in panel.series] == [
        ("triton ctx 8K", [1, 64]),
        ("triton ctx 64K", [1, 64]),
    ]
    assert "1 shape family measured at a single size is in the table" in text
    assert "| prefill v3.2 h8 | chunk 4096 | triton |" in text


def test_gpu_time_ranks_where_every_backend_measured_it():
    fast_launch = row("b2", "flashmla", 0.0188, batch_size=2)
    fast_kernel = row("b2", "triton", 0.0194, batch_size=2)
    fast_launch["timing"]["profiler_ms"] = 0.0160
    fast_kernel["timing"]["profiler_ms"] = 0.0150
    (s,) = winners.shapes([fast_launch, fast_kernel])
    assert s.basis == "profiler makespan" and s.winner == ("triton", 0.0150)
    assert s.events == {"flashmla": 0.0188, "triton": 0.0194}  # kept beside
    del fast_kernel["timing"]["profiler_ms"]  # one backend without it: events for both
    (s,) = winners.shapes([fast_launch, fast_kernel])
    assert s.basis == "events" and s.winner == ("flashmla", 0.0188)


def test_committed_h100_rows_rank_by_makespan():
    from dsv4bench.report.load import load_rows

    rows = load_rows(Path(__file__).resolve().parents[2] / "results/sm90/baseline-h100")
    shapes = [s for s in winners.shapes(rows) if len(s.times) > 1]
    by_makespan = [s for s in shapes if s.basis == "profiler makespan"]
    attention = [s for s in shapes if s.params["op"] in ("decode", "prefill")]
    # the baseline's attention kernels were profiled (the top-k alone ranks by graph replay)
    assert len(by_makespan) > len(attention) / 2
    # where the timed call's events and the kernels' makespan disagree, the makespan ranks
    disagree = [s for s in by_makespan if min(s.events, key=s.events.get) != s.winner[0]]
    assert disagree
    for s in by_makespan:
        busy = {b: t["profiler_ms"] for b, t in s.timings.items()}
        assert s.winner == min(busy.items(), key=lambda kv: (kv[1], kv[0]))


def test_shapes_of_one_family_and_size_name_what_tells_them_apart(tmp_path):
    rows = []
    for ctx in (131072, 500000):
        for b, ms in (("flashmla", 0.02), ("triton", 0.03)):
            rows.append(row(f"c{ctx}", b, ms, batch_size=1, model="v4-flash", context_len=ctx))
    text, _ = winners.markdown(rows, tmp_path)
    assert "| decode v4-flash h128 (context_len 131072) | batch 1 |" in text
    assert "| decode v4-flash h128 (context_len 500000) | batch 1 |" in text


def test_progress_lines_name_a_prefill_chunks_route():
    from dsv4bench.run.runner import Job, _job_label

    chunk = make_case(V4, op="prefill", tokens=64, context_len=128, route="decode-mixed")
    assert _job_label(Job(chunk, "flashmla")).endswith("flashmla route decode-mixed")
    assert _job_label(Job(make_case(V4), "triton")).endswith(" triton")


def test_a_ratio_never_divides_times_of_two_runs(tmp_path):
    """Two runs of one case: a line per run, each ratio within its run (the other run's
    FlashMLA time is never the divisor), whichever run loads last."""
    a = [{**row("b8", "flashmla", 0.10, batch_size=8), "_run": "a"},
         {**row("b8", "fa3", 0.15, batch_size=8), "_run": "a"}]  # fmt: skip
    b = [{**row("b8", "flashmla", 0.08, batch_size=8), "_run": "b"},
         {**row("b8", "flashinfer", 0.09, batch_size=8), "_run": "b"}]  # fmt: skip
    for rows in (a + b, b + a):
        by_run = {s.run: s for s in winners.shapes(rows)}
        assert by_run["a"].ratio("fa3") == 0.15 / 0.10
        assert by_run["b"].ratio("flashinfer") == 0.09 / 0.08
        assert "fa3" not in by_run["b"].times and "flashinfer" not in by_run["a"].times
    text, _ = winners.markdown(a + b, tmp_path)
    assert "| decode v3.2 h128 [a] | batch 8 | flashmla |" in text
    assert "| decode v3.2 h128 [b] | batch 8 | flashmla |" in text
    assert "no ratio divides times of two runs" in text
    alone, _ = winners.markdown(a, tmp_path)
    assert "[a]" not in alone and "two runs" not in alone


def test_the_oracle_is_a_baseline_never_a_candidate(tmp_path, monkeypatch):
    from dsv4bench.report import plots

    drawn = []
    monkeypatch.setattr(plots, "line_figure", lambda *a, **k: drawn.append(a[1]) or None)
    monkeypatch.setattr(plots, "save", lambda fig, path: path)
    rows = []
    for b, ms in ((1, 0.02), (64, 0.1)):
        rows += [row(f"b{b}", "flashmla", ms, batch_size=b),
                 row(f"b{b}", "triton", ms * 1.2, batch_size=b),
                 row(f"b{b}", "torch", ms * 150, batch_size=b)]  # fmt: skip
    oracle_base = {**row("b1", "torch-cpu", 3.0, batch_size=1), "backend_base": "torch"}
    shapes = winners.shapes([*rows, oracle_base])
    assert all(set(s.times) == {"flashmla", "triton"} for s in shapes)
    text, _ = winners.markdown(rows, tmp_path)
    assert "torch" not in text.split("not a candidate.")[1]
    ((panel,),) = drawn
    assert [s.label for s in panel.series] == ["triton"]  # the relative panel has no oracle


def test_kernel_tables_and_plots_use_the_winners_timer_events_beside(tmp_path, monkeypatch):
    """A FlashMLA decode row of 0.838 ms by events and 0.414 ms by makespan: the kernel table
    (and its TFLOP/s, a rate of the same call) reads the makespan, as the winners rank it."""
    from dsv4bench.report import plots
    from dsv4bench.report.render import Report
    from dsv4bench.report.sections.kernels import kernels

    drawn = []
    monkeypatch.setattr(plots, "line_figure", lambda *a, **k: drawn.append(a[1]) or None)
    monkeypatch.setattr(plots, "save", lambda fig, path: path)
    rows = []
    for b, events, makespan in ((64, 0.5, 0.25), (128, 0.838, 0.414)):
        r = row(f"b{b}", "flashmla", events, batch_size=b, s_q=2)
        r["op"], r["timing"]["profiler_ms"] = "decode", makespan
        r["derived"] = {"tflops": 100.0 * b / events, "peak_fraction": 0.1, "bound": "compute"}
        rows.append(r)
    rep = Report(rows, tmp_path, [])
    kernels(rep)
    md = rep.doc.to_markdown()
    assert "| ms | timer | events ms | TFLOP/s |" in md
    line = next(ln for ln in md.splitlines() if "`b128`" in ln)
    tflops = 100.0 * 128 / 0.414
    assert f"| 0.414 | profiler makespan | 0.838 | {tflops:.4g} |" in line, line
    tf_panel = drawn[0][0]
    assert tf_panel.series[0].ys == pytest.approx([100.0 * 64 / 0.25, tflops])


def test_helper_ops_stand_beside_the_projects_triton(tmp_path, monkeypatch):
    from dsv4bench.report import plots

    drawn = []
    monkeypatch.setattr(plots, "line_figure", lambda *a, **k: drawn.append(a[1]) or None)
    monkeypatch.setattr(plots, "save", lambda fig, path: path)
    rows = []
    for b, ms in ((1, 0.004), (64, 0.005)):
        cid = f"remap-b{b}"
        rows.append(row(cid, "triton", ms, op="remap", batch_size=b))
        rows.append(row(cid, "vllm-triton-0.33.0", ms * 1.25, op="remap", batch_size=b))
        rows.append(row(cid, "torch", ms * 20, op="remap", batch_size=b))  # the oracle: no ratio
    rows.append(row("w", "vllm-ops-0.33.0", 0.01, op="cache_write", batch_size=8))
    rows.append(row("w", "triton", None, "unsupported", op="cache_write", batch_size=8))
    text, _ = winners.markdown(rows, tmp_path)
    assert "| remap v3.2 h128 | batch 64 | triton | 0.005 |" in text
    assert "| vllm-triton-0.33.0 1.25 | triton |" in text  # engine time / Triton time
    assert "| cache_write v3.2 h128 | batch 8 | vllm-ops-0.33.0 | 0.01 |" in text
    assert "|  |  | triton: unsupported |" in text  # no Triton time: no ratio, no baseline
    ((panel,),) = drawn
    assert panel.ylabel == "time / Triton time"
    assert [(s.label, s.ys) for s in panel.series] == [("vllm-triton-0.33.0", [1.25, 1.25])]
