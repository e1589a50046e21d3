"""The serving-per-backend report section on synthetic rows: serving points planned and
aggregated from fake kernel rows of three backends (one crashes on the decode routes' long
chunks), drawn and tabulated per backend with the envelope (CPU, no GPU rows)."""

from __future__ import annotations

from pathlib import Path

from dsv4bench import serving as sv
from dsv4bench.report.render import Report
from dsv4bench.report.sections import serving, serving_backends
from tests.factories import CRASH_MSG, case_row

BACKENDS = ("flashmla", "triton", "flashinfer")
SPEED = {"flashmla": 1.0, "triton": 2.0, "flashinfer": 1.2}


def _rows(spec: sv.ServingSpec) -> list[dict]:
    """Serving rows of a spec from fake kernel rows: time ~ tokens x backend speed; flashmla
    crashes on decode-route chunks above 11622 tokens; flashinfer is fastest on c128 calls."""
    p = sv.plan(spec, safe_limit=11622)
    rows = []
    for c in p.cases:
        if c.op in ("prefill", "decode"):
            size = (c.tokens or c.batch_size) * (1 + c.extra_topk / 512)
            for b in BACKENDS:
                ms = (
                    size
                    * 1e-3
                    * SPEED[b]
                    * (0.5 if b == "flashinfer" and c.compress_ratio == 128 else 1)
                )
                crash = (
                    b == "flashmla"
                    and c.decode_shape is not None
                    and c.op == "prefill"
                    and c.tokens > 11622
                )
                if crash:
                    rows.append(case_row(c.case_id, b, None, "crash", message=CRASH_MSG))
                else:
                    rows.append(case_row(c.case_id, b, ms))
        else:
            rows.append(case_row(c.case_id, "triton", 1e-3 * c.context_len))
    serving_rows = sv.aggregate(p, rows)
    for r in serving_rows:
        r["_run"] = "run"
    return serving_rows


def _report(tmp_path: Path, rows: list[dict]) -> Report:
    rep = Report(rows, tmp_path, [tmp_path])
    serving_backends.serving_backends(rep)
    return rep


def test_ttft_per_backend_with_envelope_and_routes_side_by_side(tmp_path):
    spec = sv.spec_from_dict(
        {
            "model": "v4-flash",
            "tp": 8,
            "prompt_lens": [5602, 13302],
            "chunk_sizes": [8192, 32768],
            "routes": [
                "threshold:11673",
                "sparse-prefill",
                "decode-kernel",
                "decode-mixed",
                "safe",
            ],
            "dequant": ["read", "pool"],
            "backends": list(BACKENDS),
        }
    )
    rows = _rows(spec)
    assert {r["backend"] for r in rows} == {*BACKENDS, sv.ENVELOPE}
    rep = _report(tmp_path, rows)
    md = rep.doc.to_markdown()
    assert [p.name for p in rep.images] == ["ttft-backends-v4-flash-h8-tp8.png"]
    assert rep.images[0].stat().st_size > 10_000
    assert "TTFT per backend: v4-flash (8 heads/rank, TP 8)" in md

    def cells(prefix: str) -> list[str]:  # columns: flashinfer flashmla triton envelope fastest
        line = next(x for x in md.splitlines() if x.startswith(prefix))
        return [x.strip() for x in line.strip("|").split("|")][3:]

    # the 13302-token prompt in one 32768 chunk through the decode kernel crashes flashmla on
    # every layer kind: the envelope is flashinfer's row there
    fi, fm, tr, env, fastest = cells("| decode-kernel | 32768 | 13302 |")
    assert fm == "crash" and fastest == "flashinfer" and float(env) == float(fi) < float(tr)
    # on sparse-prefill flashmla wins the window and c4 calls, flashinfer the c128 ones: the
    # envelope beats both
    fi, fm, tr, env, fastest = cells("| sparse-prefill | 8192 | 13302 |")
    assert float(env) < min(float(fi), float(fm)) and fastest in ("flashmla", "flashinfer")
    # pool curves have their own rows and cost more than read ones on sparse-prefill
    pool = next(
        x
        for x in md.splitlines()
        if x.startswith("| sparse-prefill, dequant pool | 8192 | 13302 |")
    )
    read = next(x for x in md.splitlines() if x.startswith("| sparse-prefill | 8192 | 13302 |"))
    assert float(pool.split("|")[4]) > float(read.split("|")[4])
    # routes side by side per backend: on flashmla the decode kernel fails past 11622 tokens,
    # so threshold:11673 fails where safe (11622) does not
    assert (
        "TTFT by route on flashmla (ms by events)" in md
        and "TTFT by route on envelope (ms by events)" in md
    )
    by_route = md.split("TTFT by route on flashmla (ms by events)")[1]
    header = next(x for x in by_route.splitlines() if x.startswith("| chunk |"))
    assert "threshold:11673 ms" in header and "sparse-prefill (pool) ms" in header
    assert "decode-mixed ms" in header and header.rstrip(" |").endswith("fastest route")


def test_tpot_per_backend_with_c128_index_step(tmp_path):
    spec = sv.spec_from_dict(
        {
            "model": "v4-flash",
            "batch_sizes": [1, 8, 32],
            "contexts": [8192, 65536],
            "c128_index": "step",
            "backends": list(BACKENDS),
        }
    )
    rows = _rows(spec)
    env = [r for r in rows if r["backend"] == sv.ENVELOPE]
    assert len(env) == 6 and all(r["status"] == "ok" for r in env)
    # the envelope takes flashinfer's c128 calls and flashmla's others: faster than either
    for e in env:
        same = [r for r in rows if r["case_id"] == e["case_id"] and r["backend"] != sv.ENVELOPE]
        assert e["value_ms"] < min(r["value_ms"] for r in same)
        used = {x["backend"] for x in e["parts"] if x["role"] == "attention"}
        assert used == {"flashmla", "flashinfer"}
    rep = _report(tmp_path, rows)
    md = rep.doc.to_markdown()
    assert [p.name for p in rep.images] == ["tpot-backends-v4-flash.png"]
    assert "| 64K (C128 index per step) | 32 |" in md
    assert (
        "| context | batch | flashinfer ms | flashmla ms | triton ms | envelope ms | fastest |"
        in md
    )


def test_the_oracle_is_a_baseline_never_a_column_or_the_fastest(tmp_path):
    spec = sv.spec_from_dict(
        {
            "model": "v4-flash",
            "batch_sizes": [1, 8],
            "contexts": [8192],
            "backends": ["flashmla", "triton", "torch"],
        }
    )
    p = sv.plan(spec)
    speed = {"flashmla": 1.0, "triton": 2.0, "torch": 0.1}  # the oracle the fastest
    rows = sv.aggregate(p, [case_row(c.case_id, b, t) for c in p.cases for b, t in speed.items()])
    assert "torch" in {r["backend"] for r in rows}
    md = _report(tmp_path, rows).doc.to_markdown()
    assert "| context | batch | flashmla ms | triton ms | envelope ms | fastest |" in md
    table = [x for x in md.splitlines() if x.startswith("| 8K |")]
    assert len(table) == 2 and all(x.rstrip(" |").endswith("| flashmla") for x in table)
    assert "The oracle (`torch`) is a baseline, not a candidate" in md
    # the oracle beside one candidate: nothing to compare
    one = [r for r in rows if r["backend"] in ("flashmla", "torch")]
    rep = _report(tmp_path / "one", one)
    assert rep.left_out == ["Serving per backend: no serving points from two or more backends."]


def test_points_sum_the_winners_timer_with_the_events_sum_beside(tmp_path):
    """Kernel rows with a makespan: the points sum it (the oracle's point, which has none,
    sums events and says so), the tables name the timer and give the events sum beside; the
    fastest of a point is never picked across timers."""
    spec = sv.spec_from_dict(
        {
            "model": "v3.2",
            "batch_sizes": [1],
            "contexts": [8192],
            "backends": ["flashmla", "triton", "torch"],
        }
    )
    p = sv.plan(spec)
    (case,) = p.cases
    rows = []
    for b, events, makespan in (("flashmla", 0.5, 0.3), ("triton", 0.4, 0.35), ("torch", 9, None)):
        r = case_row(case.case_id, b, events)
        if makespan:
            r["timing"]["profiler_ms"] = makespan
        rows.append(r)
    points = {r["backend"]: r for r in sv.aggregate(p, rows)}
    for r in points.values():
        r["_run"] = "run"
    rep = Report(list(points.values()), tmp_path, [tmp_path])
    serving.serving(rep)
    serving_backends.serving_backends(rep)
    md = rep.doc.to_markdown()
    assert "kernel times by events and profiler makespan (the run's timer" in md
    assert "| TPOT ms | timer | events TPOT ms | breakdown ms |" in md
    # 61 layers: 61 x 0.3 by makespan, 61 x 0.5 by events
    assert "| flashmla | 8192 | 1 | 18.3 | profiler makespan | 30.5 |" in md
    assert "| torch | 8192 | 1 | 549 | events | 549 |" in md
    assert "| ms | events ms | status |" in md and "| 61 | 0.3 | 0.5 | ok |" in md
    assert "TPOT per backend (ms by profiler makespan), v3.2" in md
    # by one timer: flashmla's makespan sum (18.3) under triton's (21.35)
    assert serving_backends._fastest(rep, [points["flashmla"], points["triton"]]) == "flashmla"
    # triton by events (20) against flashmla by makespan (18.3): ranked by events (30.5)
    by_events = {**points["triton"], "timer": "events", "value_ms": 20.0, "events_ms": 20.0}
    assert serving_backends._fastest(rep, [points["flashmla"], by_events]) == "triton"


def test_one_backend_is_left_out(tmp_path):
    spec = sv.spec_from_dict(
        {"model": "v4-flash", "batch_sizes": [1], "contexts": [8192], "backends": ["flashmla"]}
    )
    p = sv.plan(spec)
    rows = sv.aggregate(p, [case_row(c.case_id, "flashmla", 1.0) for c in p.cases])
    rep = _report(tmp_path, rows)
    assert not rep.images and rep.left_out == [
        "Serving per backend: no serving points from two or more backends."
    ]


def test_route_keys_and_line_names():
    assert serving.route_key({"route": "sparse-prefill", "dequant": "read"}) == (
        "sparse-prefill",
        None,
    )
    assert serving.route_key({"route": "sparse-prefill", "dequant": "pool"}) == (
        "sparse-prefill",
        "pool",
    )
    assert serving.route_key({"route": "decode-mixed", "dequant": None}) == ("decode-mixed", None)
    keys = [
        ("safe", None),
        ("decode-mixed", None),
        ("sparse-prefill", "pool"),
        ("sparse-prefill", None),
    ]
    assert sorted(keys, key=serving.route_key_order) == [
        ("sparse-prefill", None),
        ("sparse-prefill", "pool"),
        ("decode-mixed", None),
        ("safe", None),
    ]
    assert serving.line_suffix({"c128_index": "step"}) == " (C128 index per step)"
    assert serving.line_suffix({"c128_index": "none"}) == serving.line_suffix({}) == ""


def test_a_point_with_an_oracle_helper_part_is_marked(tmp_path):
    # the H200 engines run: Triton's dequant rows were lost, the points took the oracle's
    # (torch, host-bound) dequant times, 10-30x a kernel's: those cells say so
    spec = sv.spec_from_dict(
        {
            "model": "v4-flash",
            "tp": 8,
            "prompt_lens": [5602],
            "chunk_sizes": [8192],
            "routes": ["sparse-prefill", "decode-kernel"],
            "backends": ["flashmla", "triton"],
        }
    )
    p = sv.plan(spec, safe_limit=11622)
    rows = []
    for c in p.cases:
        if c.op in ("prefill", "decode"):
            rows += [case_row(c.case_id, b, 1.0) for b in ("flashmla", "triton")]
        else:
            rows += [
                case_row(c.case_id, "triton", None, "crash", message=CRASH_MSG),
                case_row(c.case_id, "torch", 0.3),
            ]
    serving_rows = sv.aggregate(p, rows)
    for r in serving_rows:
        r["_run"] = "run"
    md = _report(tmp_path, serving_rows).doc.to_markdown()
    prefill = next(x for x in md.splitlines() if x.startswith("| sparse-prefill | 8192 | 5602 |"))
    decode = next(x for x in md.splitlines() if x.startswith("| decode-kernel | 8192 | 5602 |"))
    assert serving_backends.ORACLE_MARK in prefill
    assert serving_backends.ORACLE_MARK not in decode  # no helper part on the decode route
    assert serving_backends.ORACLE_NOTE in md


def test_ttft_tables_carry_the_workspace_and_name_the_helper_kernels(tmp_path):
    spec = sv.spec_from_dict(
        {
            "model": "v3.2",
            "prompt_lens": [4096],
            "chunk_sizes": [4096],
            "routes": ["sparse-prefill"],
            "backends": ["flashmla"],
        }
    )
    p = sv.plan(spec)
    rows = []
    for c in p.cases:
        if c.op == "prefill":
            rows.append(case_row(c.case_id, "flashmla", 1.0))
        else:
            kernel = {"dequant": "vllm cp_gather_and_upconvert_fp8_kv_cache"}.get(c.op, "")
            backend = "vllm-ops-0.33.0" if kernel else "triton"
            rows.append(case_row(c.case_id, backend, 0.1, info={"kernel": kernel or "remap"}))
    points = sv.aggregate(p, rows)
    for r in points:
        r["_run"] = "run"
    rep = Report(points, tmp_path, [tmp_path])
    serving.serving(rep)
    md = rep.doc.to_markdown()
    assert "| breakdown ms | workspace MiB | helper kernels | status | parts |" in md
    workspace = (4096 * 576 * 2 + 4096 * 2048 * 4) / 2**20  # 36.5 MiB
    helpers = (
        "dequant: vllm-ops-0.33.0 (vllm cp_gather_and_upconvert_fp8_kv_cache); "
        "remap: triton (remap)"
    )
    assert f"| {workspace:g} | {helpers} | ok |" in md
