"""report: synthetic rows of every kind -> report.md, self-contained report.html, valid PNGs."""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path

import pytest

from dsv4bench.report import ReportInputError, build_report, load_rows
from tests.factories import CRASH_MSG, H100_ENV, case_row, part, serving_row, write_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MODELS = {
    "v32": dict(model="v32", d_qk=576, d_v=512, num_heads=128, topk=2048, layout="v32"),
    "v4-flash": dict(model="v4-flash", d_qk=512, d_v=512, num_heads=64, topk=512, layout="v4"),
}


def params(op: str, model: str = "v4-flash", **kw) -> dict:
    """Case params as Case.params() writes them."""
    p = dict(
        model=model,
        d_qk=512,
        d_v=512,
        num_heads=64,
        head_padding="engine",
        batch_size=1,
        s_q=1,
        tokens=0,
        topk=512,
        extra_topk=0,
        context_len=4096,
        page_size=256,
        layout="v4",
        sink=False,
        scale_convention="flashmla",
        route="sparse-prefill",
        window=0,
        compress_ratio=0,
        softmax_scale=0.0,
        seed=0,
    )
    p.update(MODELS.get(model, {}))
    p.update(kw)
    return p


def plausible_row(
    op: str,
    backend: str,
    *,
    status: str = "ok",
    ms: float | None = 0.1,
    cos: float | None = 2.5e-6,
    tags=(),
    message: str = "",
    info=None,
    spread: float = 0.02,
    **kw,
) -> dict:
    """A plausible case row; its time, FLOP count and peak fraction follow from params."""
    p = params(op, **kw)
    digest = hashlib.sha1(json.dumps(p, sort_keys=True).encode()).hexdigest()[:10]
    size = f"t{p['tokens']}" if op == "prefill" else f"b{p['batch_size']}"
    case_id = f"{op}-{p['model']}-{p['layout']}-h{p['num_heads']}-{size}-k{p['topk']}-{digest}"
    row = case_row(
        case_id,
        backend,
        status=status,
        message=message,
        scenario="synthetic",
        op=op,
        params=p,
        tags=list(tags),
        provider={"name": f"{backend}-lib", "version": "1.0", "location": "/opt/x"},
        accuracy=None,
        derived=None,
        info=info or {},
        env=H100_ENV,
        input_fingerprint="f" * 16,
    )
    if status in ("ok", "incorrect") and cos is not None:
        row["accuracy"] = {
            "cos_diff": cos,
            "max_abs": 1e-3,
            "max_rel": 1e-2,
            "lse_max_abs": 3e-7,
            "nonfinite": 0,
        }
    if status in ("ok", "incorrect") and ms is not None:
        samples = [ms * (1 + spread * (i - 10) / 10) for i in range(21)]
        row["timing"] = {
            "median_ms": ms,
            "p10_ms": samples[2],
            "p90_ms": samples[18],
            "n": 21,
            "method": "events",
            "samples_ms": samples,
            "memory": {"scratch_bytes": 2**20, "output_bytes": 0},
        }
        q = p["tokens"] if op == "prefill" else p["batch_size"] * p["s_q"]
        flops = 2 * q * p["num_heads"] * p["topk"] * (p["d_qk"] + p["d_v"])
        tflops = flops / (ms * 1e-3) / 1e12
        row["derived"] = {
            "flops": flops,
            "bytes": 1e6,
            "tflops": tflops,
            "gbps": 100.0,
            "peak_fraction": tflops * 1e12 / 989.4e12,
            "bound": "compute",
        }
    return row


def make_rows() -> list[dict]:
    rows = []
    for backend, eff in (("flashmla", 1.0), ("triton", 0.45), ("torch", 0.02)):
        for model in ("v32", "v4-flash"):
            for b in (1, 8, 64, 128, 512):
                base = 0.02 + 0.0008 * b * (3 if model == "v32" else 1)
                rows.append(
                    plausible_row(
                        "decode",
                        backend,
                        model=model,
                        batch_size=b,
                        ms=base / eff,
                        cos=1.2e-6 * (1 + b % 3) / (eff + 0.5),
                    )
                )
        for t in (1024, 4096, 16384):
            rows.append(
                plausible_row(
                    "prefill", backend, tokens=t, ms=t * 1.6e-4 / eff, cos=3e-6, context_len=32768
                )
            )
        # head padding: heads per rank at TP 1..8, padded to 64
        for h in (8, 16, 32, 64):
            rows.append(
                plausible_row(
                    "decode",
                    backend,
                    num_heads=h,
                    batch_size=32,
                    ms=0.044 / eff,
                    info={"padded_heads": 64},
                    cos=0.0 if backend == "torch" else 2e-6,
                )
            )
    rows.append(
        plausible_row(
            "decode",
            "triton",
            model="v32",
            batch_size=2,
            cos=4e-5,
            status="incorrect",
            message="cos_diff 4e-05 > 5e-06",
        )
    )
    rows.append(
        plausible_row(
            "decode",
            "flashinfer",
            status="unsupported",
            message="needs sm100 (trtllm-gen)",
            ms=None,
        )
    )
    # workloads: a ragged batch (issue 23); its rows also read as kernel rows
    rows.append(
        plausible_row("decode", "flashmla", batch_size=3, context_lens=[900, 4096, 100], ms=0.03)
    )
    # TP x route crossover: a 4K chunk at 64 (above), 32 and 8 heads, sparse-prefill vs
    # decode-mixed; and a second instance of flashmla (another build) beside the first
    chunk = dict(tokens=4096, context_len=32768)
    for h in (32, 8):
        for route, ms in (("sparse-prefill", 0.65), ("decode-mixed", 0.03 * h)):
            rows.append(
                plausible_row("prefill", "flashmla", num_heads=h, route=route, ms=ms, **chunk)
            )
    rows.append(plausible_row("prefill", "flashmla", route="decode-mixed", ms=2.0, **chunk))
    for b in (1, 64):
        rows.append(plausible_row("decode", "flashmla-b", model="v32", batch_size=b, ms=0.03))
        rows[-1]["backend_base"] = "flashmla"
    # crash boundary: decode-kernel route probes around the scheduler limit
    probe_statuses = {}
    for t in (1024, 8192, 11000, 11600, 11622, 11623, 11640, 11673, 12000, 16384):
        st = "ok" if t <= 11622 else "crash"
        probe_statuses[str(t)] = st
        rows.append(
            plausible_row(
                "prefill",
                "flashmla",
                route="decode-kernel",
                tokens=t,
                status=st,
                message="" if st == "ok" else CRASH_MSG,
                tags=["limit-probe"],
                ms=t * 1e-4 if st == "ok" else None,
            )
        )
    limit = plausible_row("prefill", "flashmla", route="decode-kernel", tokens=1024)
    limit.update(
        kind="limit",
        case_id="limit-tokens-" + limit["case_id"],
        axis="tokens",
        last_ok=11622,
        first_fail=11623,
        status="crash",
        message=CRASH_MSG,
        probes=probe_statuses,
        accuracy=None,
        timing=None,
        derived=None,
    )
    rows.append(limit)
    rows += serving_rows()
    return rows


def serving_rows() -> list[dict]:
    rows = []
    for backend in ("flashmla", "triton"):
        for ctx in (4096, 32768, 131072):
            for b in (1, 8, 32, 128):
                value = 43 * (0.05 + 0.002 * b * math.log2(ctx))
                parts = [part(f"decode-v4-flash-{k}-b{b}-S{ctx}", backend) for k in ("c4", "c128")]
                rows.append(
                    serving_row(
                        "tpot",
                        backend,
                        value,
                        parts,
                        case_id=f"tpot-v4-flash-B{b}-S{ctx}",
                        route="decode",
                        batch_size=b,
                        context_len=ctx,
                    )
                )
        for route in ("decode-kernel", "sparse-prefill"):
            for chunk in (4096, 16384):
                for prompt in (4096, 16384, 65536, 131072):
                    fail = backend == "flashmla" and route == "decode-kernel" and chunk == 16384
                    value = prompt * 1e-3 * (1.3 if route == "decode-kernel" else 1)
                    value *= 1 + 0.15 * (chunk == 4096)
                    parts = [
                        part(f"prefill-v4-flash-t{chunk}-c{i}", backend, "crash" if fail else "ok")
                        for i in range(max(1, prompt // chunk))
                    ]
                    if route == "sparse-prefill":
                        parts.append(part(f"dequant-v4-flash-{chunk}", "torch", role="dequant"))
                    rows.append(
                        serving_row(
                            "ttft",
                            backend,
                            None if fail else value,
                            parts,
                            case_id=f"ttft-v4-flash-L{prompt}-C{chunk}-{route}",
                            route=route,
                            prompt_len=prompt,
                            chunk_size=chunk,
                            batch_size=1,
                        )
                    )
    return rows


def _check_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 5000, path
    assert b"IEND" in data[-16:]


@pytest.fixture(scope="module")
def full_report(tmp_path_factory) -> tuple[Path, list[Path]]:
    """The report of make_rows(), built once for the tests that read it: (run dir, files)."""
    tmp = tmp_path_factory.mktemp("full")
    run = write_run(tmp / "run-h100", make_rows())
    return run, build_report([run], tmp / "out")


def test_full_report(full_report):
    _, files = full_report
    out = files[0].parent
    names = {f.name for f in files}
    assert {"report.md", "report.html", "accuracy.png", "crash-boundary.png"} <= names
    assert {"tpot-v4-flash.png", "ttft-v4-flash.png"} <= names
    assert any(n.startswith("kernel-decode") for n in names)
    assert any(n.startswith("head-padding") for n in names)
    for f in files:
        assert f.exists() and f.parent == out
        if f.suffix == ".png":
            _check_png(f)
    md = (out / "report.md").read_text()
    assert "Backend instances side by side" in md and "**flashmla-b**: 2 of 2 cases ok" in md
    assert "flashmla v4-flash chunk 4K (events): decode-mixed wins at h <= 8" in md
    for section in (
        "Serving: TPOT",
        "Serving: TTFT",
        "Kernel throughput",
        "Accuracy",
        "Crash boundary",
        "Head-padding overhead",
        "Environment",
        "Failures and unsupported",
    ):
        assert section in md, section
    assert "Left out for lack of data" not in md
    # failures table carries the crash reason, the unsupported reason and the incorrect one
    assert "get_decoding_sched_meta.cu" in md
    assert "needs sm100 (trtllm-gen)" in md and "cos_diff 4e-05 > 5e-06" in md
    # crash boundary: measured limit, sglang's threshold, the predicted limit
    assert "11623" in md and "11673" in md and "11622" in md
    assert "NVIDIA H100 80GB HBM3" in md and "abc123def456" in md
    # serving points are traceable: point ids, failed points and their parts are listed
    assert "`ttft-v4-flash-L65536-C16384-decode-kernel`" in md
    assert "Failed TTFT points" in md and "`prefill-v4-flash-t16384-c3`" in md
    assert "Failed TPOT points" not in md
    # every image in the md is a written file
    for name in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md):
        assert (out / name).exists()
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == len([n for n in names if n.endswith(".png")])
    srcs = re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)""", page)
    assert all(s.startswith(("data:", "#")) for s in srcs), srcs
    assert "<link" not in page and "@import" not in page


def test_report_is_deterministic(tmp_path, full_report):
    run, a = full_report  # every section and figure kind, built a second time
    b = build_report([run], tmp_path / "b")
    assert [f.name for f in a] == [f.name for f in b]
    for fa, fb in zip(a, b, strict=True):
        assert fa.read_bytes() == fb.read_bytes(), fa.name


def test_sections_without_data_are_left_out(tmp_path):
    rows = [plausible_row("decode", "torch", status="crash", message=CRASH_MSG, ms=None)]
    run = write_run(tmp_path / "only-crash", rows)
    files = build_report([run], tmp_path / "out")
    md = (tmp_path / "out" / "report.md").read_text()
    assert "Left out for lack of data" in md
    assert "TPOT curves: no serving rows" in md
    assert "Kernel throughput:" in md and "## Kernel throughput" not in md
    assert "## Failures and unsupported cases" in md and "get_decoding_sched_meta.cu" in md
    assert all(f.suffix != ".png" for f in files)


def test_empty_run_and_missing_path(tmp_path):
    run = tmp_path / "empty"
    run.mkdir()
    (run / "results.jsonl").write_text("")
    files = build_report([run], tmp_path / "out")
    assert {f.name for f in files} == {"report.md", "report.html"}
    with pytest.raises(ReportInputError):
        build_report([tmp_path / "nope"], tmp_path / "out2")


def test_two_runs_are_told_apart(tmp_path):
    rows = [r for r in make_rows() if r["kind"] == "case" and r["op"] == "decode"][:12]
    a = write_run(tmp_path / "h100", rows)
    b = write_run(tmp_path / "h200", rows)
    build_report([a, b], tmp_path / "out")
    md = (tmp_path / "out" / "report.md").read_text()
    assert "[h100]" in md and "[h200]" in md


def test_pytest_benchmark_json(tmp_path):
    p = params("decode", batch_size=64)
    data = {
        "machine_info": {"python_version": "3.12.0", "node": "box"},
        "commit_info": {"id": "0123456789abcdef", "dirty": False},
        "benchmarks": [
            {
                "name": "test_kernel[flashmla-decode-b64]",
                "params": {"backend": "flashmla"},
                "stats": {
                    "median": 4.4e-5,
                    "min": 4.3e-5,
                    "max": 4.9e-5,
                    "q1": 4.35e-5,
                    "q3": 4.5e-5,
                    "rounds": 50,
                },
                "extra_info": {
                    "case_id": "decode-v4-b64",
                    "backend": "flashmla",
                    "op": "decode",
                    "params": p,
                    "status": "ok",
                    "accuracy": {"cos_diff": 2e-6, "lse_max_abs": 1e-7},
                },
            }
        ],
    }
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(data))
    [row] = load_rows(path)
    assert row["case_id"] == "decode-v4-b64" and row["backend"] == "flashmla"
    assert row["timing"]["median_ms"] == pytest.approx(0.044)
    assert row["timing"]["method"] == "pytest-benchmark" and row["timing"]["n"] == 50
    assert row["env"]["git_commit"] == "0123456789ab"
    files = build_report([path], tmp_path / "out")
    assert "accuracy.png" in {f.name for f in files}


def test_sparse_and_odd_rows_do_not_crash(tmp_path):
    odd = plausible_row(
        "decode", "triton", cos=float("inf"), status="incorrect", message="2 nonfinite"
    )
    nan = plausible_row("prefill", "triton", tokens=64, cos=float("nan"), status="incorrect")
    no_x = plausible_row("decode", "torch", batch_size=3)
    no_x["params"]["batch_size"] = None
    no_peak = plausible_row("decode", "torch", batch_size=4)
    no_peak["derived"]["peak_fraction"] = None
    rows = [  # sparse but rows; `{"kind": "case"}` is junk: tests/report/test_load_checks.py
        {"kind": "case", "case_id": "x", "backend": "b", "status": "ok", "timing": {}},
        {"kind": "something-new", "case_id": "y"},
        {"kind": "limit", "case_id": "limit-z", "backend": "flashmla", "status": "crash"},
        {"kind": "serving", "metric": "tpot", "backend": "flashmla", "value_ms": None},
        {"kind": "serving", "metric": "ttft", "backend": "flashmla", "value_ms": 1.0},
        odd,
        nan,
        no_x,
        no_peak,
    ]
    run = write_run(tmp_path / "odd", rows)
    files = build_report([run], tmp_path / "out")
    for f in files:
        if f.suffix == ".png":
            _check_png(f)
    assert "2 nonfinite" in (tmp_path / "out" / "report.md").read_text()


def test_legend_fits_the_figure(tmp_path):
    from dsv4bench.report import plots

    series = [
        plots.Series(f"backend-{i}, a rather long family label number {i} " * 2, [1, 2], [1, 2])
        for i in range(7)
    ]
    fig = plots.line_figure("t", [plots.Panel("p", "x", "y", series)])
    renderer = fig.canvas.get_renderer()
    [legend] = fig.legends
    box = legend.get_window_extent(renderer)
    assert box.x0 >= 0 and box.x1 <= fig.bbox.width
    _check_png(plots.save(fig, tmp_path / "legend.png"))


def test_kernel_lines_get_short_labels_and_serving_parts_are_not_drawn(tmp_path):
    rows = []
    for ratio, extra in ((4, 512), (128, 64)):
        for b in (1, 8, 64):
            rows.append(
                plausible_row(
                    "decode",
                    "flashmla",
                    batch_size=b,
                    compress_ratio=ratio,
                    extra_topk=extra,
                    context_len=8192,
                    window=128,
                )
            )
    for b in (2, 4):
        rows.append(
            plausible_row("decode", "flashmla", batch_size=b, context_len=65536, tags=["serving"])
        )
    build_report([write_run(tmp_path / "run", rows)], tmp_path / "out")
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| flashmla C4 |" in md and "| flashmla C128 |" in md
    assert "compress_ratio=4, extra_topk=512" in md  # the full family stays in the table
    assert "2 rows measured as parts of serving points" in md


def test_serving_routes_and_lines():
    from dsv4bench.report.fmt import route_order
    from dsv4bench.report.render import Report
    from dsv4bench.report.sections.serving import _route_title

    routes = ["threshold:11673", "safe", "decode-kernel", "sparse-prefill", "threshold:900"]
    assert sorted(routes, key=route_order) == [
        "sparse-prefill",
        "decode-kernel",
        "threshold:900",
        "threshold:11673",
        "safe",
    ]
    rows = [
        {"kind": "serving", "route": "safe", "threshold": 11622, "model": "v4-flash"},
        {"kind": "serving", "route": "decode-kernel", "model": "v4-flash"},
    ]
    rep = Report([], Path("."), [Path(".")])
    assert _route_title(rep, "safe", rows) == "safe (measured limit 11622)"
    assert _route_title(rep, "threshold:11673", rows) == "threshold:11673 (sglang DSv4)"
    assert _route_title(rep, "decode-kernel", rows) == "decode-kernel (b = chunk tokens)"
    limit = {
        "kind": "limit",
        "last_ok": 11600,
        "params": {"model": "v4-flash", "route": "decode-kernel"},
    }
    rep = Report([limit], Path("."), [Path(".")])
    assert _route_title(rep, "safe", rows[1:]) == "safe (measured limit 11600)"


def test_tpot_backends_from_several_scenarios(tmp_path):
    rows = []
    for backend, scenario, scale in (
        ("flashmla", "serving-a", 1),
        ("torch", "serving-oracle", 100),
        ("flashmla", "serving-b", 1.1),
    ):
        for b in (1, 8):
            rows.append(
                serving_row(
                    "tpot",
                    backend,
                    0.5 * b * scale,
                    [part(f"decode-{b}", backend)],
                    case_id=f"tpot-{scenario}-B{b}",
                    route="decode",
                    batch_size=b,
                    context_len=8192,
                    scenario=scenario,
                )
            )
    files = build_report([write_run(tmp_path / "run", rows)], tmp_path / "out")
    assert "tpot-v4-flash.png" in {f.name for f in files}
    md = (tmp_path / "out" / "report.md").read_text()
    assert "flashmla (serving-a)" in md and "flashmla (serving-b)" in md
    assert "| torch |" in md


@pytest.fixture
def kept_figures(monkeypatch) -> dict:
    """name.png -> the figure, for every figure the report saves."""
    from dsv4bench.report import plots

    figures = {}
    save = plots.save

    def keep(fig, path):
        figures[Path(path).name] = fig
        return save(fig, path)

    monkeypatch.setattr(plots, "save", keep)
    return figures


def test_a_cpu_run_has_no_empty_peak_panel_and_says_why(tmp_path, kept_figures):
    rows = []
    for heads in (8, 16):  # one batch size per family: points, not lines
        row = plausible_row("decode", "torch", num_heads=heads, batch_size=2)
        row["derived"]["peak_fraction"] = None
        row["env"] = {**H100_ENV, "gpu": None, "arch": "cpu"}
        rows.append(row)
    build_report([write_run(tmp_path / "cpu", rows)], tmp_path / "out")
    md = (tmp_path / "out" / "report.md").read_text()
    assert "No fraction-of-peak panel: these rows ran on cpu" in md
    fig = kept_figures["kernel-decode-v4-flash.png"]
    (ax,) = [a for a in fig.axes if a.get_visible()]  # the TFLOP/s panel alone
    assert ax.get_title() == "achieved TFLOP/s at batch size 2"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["torch 8 heads", "torch 16 heads"]


def test_ttft_shows_where_the_sglang_threshold_and_safe_part_ways(tmp_path, kept_figures):
    rows = []
    for route in ("threshold:11673", "safe"):
        for chunk in (8192, 11648):
            for prompt in (16384, 32768):
                crash = route != "safe" and chunk == 11648  # the decode kernel above 11622
                parts = [part(f"prefill-t{chunk}-{route}", "flashmla", "crash" if crash else "ok")]
                rows.append(
                    serving_row(
                        "ttft",
                        "flashmla",
                        None if crash else prompt * 1e-3,
                        parts,
                        case_id=f"ttft-L{prompt}-C{chunk}-{route}",
                        route=route,
                        threshold=11622 if route == "safe" else 11673,
                        prompt_len=prompt,
                        chunk_size=chunk,
                    )
                )
    build_report([write_run(tmp_path / "run", rows)], tmp_path / "out")
    md = (tmp_path / "out" / "report.md").read_text()
    assert (
        "Chunks of 11648 tokens lie between the measured decode-route limit (11622) and 11673: "
        "`threshold:11673` sends them to the decode kernel (2 of 2 points failed: crash), "
        "`safe` to sparse prefill (0 of 2 points failed)."
    ) in md
    threshold, safe = [a for a in kept_figures["ttft-v4-flash.png"].axes if a.get_visible()]
    marks = [ln for ln in threshold.get_lines() if ln.get_marker() == "x"]
    assert [list(ln.get_xdata()) for ln in marks] == [[16384, 32768]]  # chunk 11648 failed
    assert len([ln for ln in safe.get_lines() if len(ln.get_xdata()) == 2]) == 2  # both chunks
    rows = [r for r in rows if r["chunk_size"] == 8192]
    build_report([write_run(tmp_path / "old", rows)], tmp_path / "old-out")
    md = (tmp_path / "old-out" / "report.md").read_text()
    assert "`threshold:11673` and `safe` route every chunk alike here" in md
    # a last, shorter chunk can fall between them too: 28034 = 16384 + 11650
    for r in rows:
        r.update(prompt_len=28034, chunk_size=16384)
    build_report([write_run(tmp_path / "last", rows)], tmp_path / "last-out")
    md = (tmp_path / "last-out" / "report.md").read_text()
    assert "Chunks of 11650 tokens lie between the measured decode-route limit (11622)" in md


def test_head_padding_divides_by_the_timer_every_row_of_a_line_measured(tmp_path):
    rows = []
    for heads, events, makespan in ((64, 0.5, 0.25), (16, 0.4, 0.125)):
        r = plausible_row("decode", "flashmla", ms=events, num_heads=heads)
        r["timing"]["profiler_ms"] = makespan
        rows.append(r)
    run = write_run(tmp_path / "run", rows)
    build_report([run], tmp_path / "out")
    md = (tmp_path / "out" / "report.md").read_text()
    section = md[md.index("### Head padding") :]
    # ms/head by the makespan (0.125 / 16), the events median beside it
    assert "| 0.125 | profiler makespan | 0.4 | 0.00781" in section
    # 0.00781 / (0.25 / 64): per-head time over the per-head time at the most heads
    assert "| ms/head | ms/head / ms/head at most heads | useful |" in section
    assert "| 0.007812 | 2.00 |" in section


def test_a_case_written_twice_counts_once_by_its_last_row(tmp_path):
    """A re-judged or resumed run appends a case's row again: the status table counts cases
    (the last row of each), not rows, and says how many rows it left out."""
    first = plausible_row("prefill", "q8kv8", status="incorrect", message="cos_diff 0.02")
    again = {**first, "status": "ok", "message": ""}
    other = {**plausible_row("prefill", "q8kv8", status="incorrect"), "case_id": "another"}
    run = write_run(tmp_path / "rejudged", [first, other, again])
    build_report([run], tmp_path / "out")
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| q8kv8 | 1 | 1 | 2 |" in md
    assert "1 rows of a case written again" in md
    plain = write_run(tmp_path / "once", [first, other])
    build_report([plain], tmp_path / "out2")
    md = (tmp_path / "out2" / "report.md").read_text()
    assert "Rows per backend and status" in md and "| q8kv8 | 2 | 2 |" in md


def test_a_stored_no_work_row_is_shown_at_no_fraction_of_peak(tmp_path):
    """An older row of a 0-token chunk stored a bandwidth and a fraction of peak for a call
    that moved nothing: the kernel table shows neither (its TFLOP/s is a true 0)."""
    empty = plausible_row("prefill", "flashmla", ms=0.004, tokens=64)
    empty["case_id"] = "prefill-empty-chunk"
    empty["derived"].update(flops=0, tflops=0.0, gbps=1800.0, peak_fraction=0.55, bound="memory")
    real = plausible_row("prefill", "flashmla", ms=0.2, tokens=1024)
    build_report([write_run(tmp_path / "run", [empty, real])], tmp_path / "out")
    md = (tmp_path / "out" / "report.md").read_text()
    kernel_rows = md.split("## Kernel throughput", 1)[1].split("\n## ", 1)[0].splitlines()
    (line,) = [ln for ln in kernel_rows if "`prefill-empty-chunk`" in ln]
    assert "55.0%" not in line and "1800" not in line and "memory" not in line
    (line,) = [ln for ln in kernel_rows if f"`{real['case_id']}`" in ln]
    assert "compute" in line and "%" in line
