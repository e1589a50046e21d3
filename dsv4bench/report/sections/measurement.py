"""What a kernel costs beyond its median: profiler agreement, launch overhead (eager vs CUDA
graph), device memory per call, determinism and batch invariance.

Functions take `rep`, the report being built (dsv4bench.report.render.Report).
"""

from __future__ import annotations

from dsv4bench.measure.timing import AGREEMENT
from dsv4bench.report import grouping, plots
from dsv4bench.report.fmt import code_span, fmt_num, pct
from dsv4bench.report.load import case_rows, median_ms, param

MIN_AGREEMENT_MS = 0.02  # below ~20 us the profiler's own resolution dominates the ratio
MIB = 2**20


def measurement(rep) -> None:
    rows = [r for r in case_rows(rep.rows) if r.get("status") == "ok"]
    parts = [
        _profiler_agreement(rep, rows),
        _launch_overhead(rep, rows),
        _memory(rep, rows),
        _invariance(rep, case_rows(rep.rows)),
    ]
    if not any(parts):
        rep.left_out.append(
            "Measurement: no row has a profiler figure, graph times, memory per call or "
            "determinism readings."
        )


def _timing(r: dict) -> dict:
    return r.get("timing") or {}


def _profiler_agreement(rep, rows: list[dict]) -> bool:
    have = [
        r
        for r in rows
        if _timing(r).get("events_vs_profiler") is not None
        and (_timing(r).get("profiler_ms") or 0) >= MIN_AGREEMENT_MS
        and not (r.get("info") or {}).get("reference_row")  # the oracle is host-bound
    ]
    if not have:
        return False
    d = rep.doc
    d.heading("Events against the profiler")
    agree = [r for r in have if abs(_timing(r)["events_vs_profiler"] - 1) <= AGREEMENT]
    summed = [
        r
        for r in have
        if _timing(r).get("profiler_sum_ms")
        and abs(median_ms(r) / _timing(r)["profiler_sum_ms"] - 1) <= AGREEMENT
    ]
    text = (
        f"CUDA-event medians within {pct(AGREEMENT)} of the profiler's kernel time (the "
        f"makespan of the kernels in each timed call: overlapping kernels once, gaps between "
        f"them included) for {len(agree)} of {len(have)} cases of "
        f"{MIN_AGREEMENT_MS * 1e3:.0f} us or more ({pct(len(agree) / len(have))}; the "
        "oracle's rows are left out: its GPU time is host-bound)."
    )
    if any(_timing(r).get("profiler_sum_ms") for r in have):
        text += (
            f" Against the plain sum of kernel durations (overlapping kernels counted twice): "
            f"{len(summed)} of {len(have)}."
        )
    overlapped = [
        r
        for r in have
        if (_timing(r).get("profiler_sum_ms") or 0)
        > 1.01 * (_timing(r).get("profiler_busy_ms") or 1e30)
    ]
    if overlapped:
        text += (
            f" In {len(overlapped)} cases the kernels of one call overlap (their summed "
            "durations exceed their union by more than 1%: programmatic dependent launch)."
        )
    d.para(text)
    outside = sorted(
        (r for r in have if r not in agree),
        key=lambda r: -abs(_timing(r)["events_vs_profiler"] - 1),
    )
    d.table(
        [
            "case_id",
            "backend",
            "events ms",
            "profiler ms",
            "busy ms",
            "sum ms",
            "events / profiler",
            "kernels",
        ],
        [
            [
                code_span(r["case_id"]),
                rep.who(r),
                fmt_num(median_ms(r)),
                fmt_num(_timing(r).get("profiler_ms")),
                fmt_num(_timing(r).get("profiler_busy_ms")),
                fmt_num(_timing(r).get("profiler_sum_ms")),
                f"{_timing(r)['events_vs_profiler']:.3f}",
                _kernels(_timing(r).get("kernels")),
            ]
            for r in outside
        ],
        caption="Cases where events and profiler disagree, worst first",
        folded=len(outside) > 10,
    )
    return True


def _kernels(kernels) -> str:
    if not kernels:
        return ""
    return ", ".join(f"{k['name'][:40]} x{k['count']:g} {k['ms'] * 1e3:.1f}us" for k in kernels[:3])


def _x_of(r: dict) -> int | None:
    """batch x s_q for decode, tokens for prefill; None when the row lacks them."""
    if r.get("op") == "prefill":
        x = param(r, "tokens")
        return x if isinstance(x, int) else None
    b, s_q = param(r, "batch_size"), param(r, "s_q") or 1
    return b * s_q if isinstance(b, int) and isinstance(s_q, int) else None


def _series_by_family(rep, rows, value) -> dict[str, list[plots.Series]]:
    """One panel per op and model, one line per backend and case family (the params other
    than the size differ: context, heads, route, s_q), so no line joins two families; x: batch
    x s_q (decode) or tokens (prefill). Drawn: families measured at two sizes or more, and rows
    made as parts of serving points (a scatter of shapes) only where nothing else was
    measured; a panel without such a family is left to the table (an empty list)."""
    by_panel: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("op") in ("decode", "prefill") and value(r) is not None and _x_of(r):
            by_panel.setdefault(f"{r.get('op')} {param(r, 'model')}", []).append(r)
    panels = {}
    for key, prows in sorted(by_panel.items()):
        prows = [r for r in prows if "serving" not in (r.get("tags") or [])] or prows
        groups = grouping.line_groups(rep, prows, {"batch_size", "tokens", "seed", "model"})
        lines = {g: rs for g, rs in groups.items() if len({_x_of(r) for r in rs}) > 1}
        series = []
        for gkey, label, style, _full in grouping.line_styles(rep, lines):
            pts = sorted((_x_of(r), value(r)) for r in lines[gkey])
            series.append(plots.Series(label, [x for x, _ in pts], [y for _, y in pts], **style))
        panels[key] = series
    return panels


def _left_to_table(d, drawn: dict[str, list], rows: list[dict]) -> None:
    """Say which ops and models the figure leaves to the table, and why."""
    one_size = sorted(k for k, series in drawn.items() if not series)
    others = sorted({str(r.get("op")) for r in rows} - {"decode", "prefill"})
    bits = []
    if one_size:
        bits.append(f"{', '.join(one_size)}: every family at one size")
    if others:
        bits.append(f"{', '.join(others)}: the figure draws decode and prefill calls only")
    if bits:
        d.para("In the table only: " + "; ".join(bits) + ".")


def _launch_overhead(rep, rows: list[dict]) -> bool:
    have = [r for r in rows if "graph_ms" in _timing(r) or "graph_error" in _timing(r)]
    if not have:
        return False
    d = rep.doc
    d.heading("Eager against CUDA graph")
    d.para(
        "Engines replay decode from CUDA graphs. `graph ms` is the replay's CUDA-event median "
        "(cold L2, as the eager median); `eager loop` and `graph loop` are host wall time per "
        "call over back-to-back calls (warm L2): their difference is the launch overhead a "
        "graph removes, largest at small batches. A capture that failed is shown with its "
        "message (an engine bug class)."
    )
    overhead = _series_by_family(
        rep,
        [r for r in have if r.get("op") == "decode"],
        lambda r: (
            (_timing(r).get("eager_loop_ms") or 0) - (_timing(r).get("graph_loop_ms") or 0)
            if "graph_loop_ms" in _timing(r)
            else None
        ),
    )
    panels = [
        plots.Panel(key, "batch x s_q", "eager loop - graph loop (ms per call)", series)
        for key, series in overhead.items()
        if series
    ]
    if panels:
        fig = plots.line_figure("Launch overhead removed by a CUDA graph", panels)
        d.image(rep.save(fig, "launch-overhead"), "launch overhead")
    _left_to_table(d, overhead, [])
    d.table(
        ["case_id", "backend", "eager ms", "graph ms", "eager loop", "graph loop", "capture"],
        [
            [
                code_span(r["case_id"]),
                rep.who(r),
                fmt_num(median_ms(r)),
                fmt_num(_timing(r).get("graph_ms")),
                fmt_num(_timing(r).get("eager_loop_ms")),
                fmt_num(_timing(r).get("graph_loop_ms")),
                _timing(r).get("graph_error", "ok")[:120],
            ]
            for r in have
        ],
        caption="Eager and graph times per case",
        folded=len(have) > 25,
    )
    return True


def _memory(rep, rows: list[dict]) -> bool:
    have = [r for r in rows if _timing(r).get("memory")]
    if not have:
        return False
    d = rep.doc
    d.heading("Device memory per call")
    d.para(
        "Peak device memory during one call beyond what existed before it (inputs, "
        "preallocated outputs, workspaces made outside the timed call) and beyond what the call "
        "leaves allocated (`scratch`); `outputs` is what it leaves allocated. Counted by "
        "torch's allocator: memory a library takes with its own cudaMalloc is not seen."
    )
    scratch = _series_by_family(
        rep, have, lambda r: _timing(r)["memory"].get("scratch_bytes", 0) / MIB
    )
    zero = sorted(
        k for k, series in scratch.items() if series and not any(y for s in series for y in s.ys)
    )
    panels = [
        plots.Panel(key, "batch x s_q (decode), tokens (prefill)", "scratch MiB", series)
        for key, series in scratch.items()
        if series and key not in zero
    ]
    if panels:
        fig = plots.line_figure("Scratch memory per call", panels)
        d.image(rep.save(fig, "memory-per-call"), "memory per call")
    if zero:
        d.para(
            "Not drawn, every call 0 MiB of scratch: "
            + "; ".join(f"{k} ({', '.join(s.label for s in scratch[k])})" for k in zero)
            + "."
        )
    _left_to_table(d, scratch, have)
    d.table(
        ["case_id", "backend", "s_q", "scratch MiB", "outputs MiB"],
        [
            [
                code_span(r["case_id"]),
                rep.who(r),
                param(r, "s_q", ""),
                fmt_num(_timing(r)["memory"].get("scratch_bytes", 0) / MIB),
                fmt_num(_timing(r)["memory"].get("output_bytes", 0) / MIB),
            ]
            for r in have
        ],
        caption="Memory per call",
        folded=len(have) > 25,
    )
    return True


def _invariance(rep, rows: list[dict]) -> bool:
    have = [
        r
        for r in rows
        if (r.get("accuracy") or {}).get("determinism")
        or (r.get("accuracy") or {}).get("batch_invariance")
    ]
    if not have:
        return False
    d = rep.doc
    d.heading("Determinism and batch invariance")
    d.para(
        "Determinism: the call run twice more on the same inputs (outputs poisoned between "
        "runs), bitwise equal or not. Batch invariance: the first, middle and last request "
        "run alone (a prefill token alone) against the same request inside the batch: the "
        "largest difference in bf16 units in the last place, and how many (query, head) rows "
        "change the argmax of their output."
    )
    table = []
    for r in have:
        acc = r["accuracy"]
        det = acc.get("determinism") or {}
        inv = acc.get("batch_invariance") or {}
        table.append(
            [
                code_span(r["case_id"]),
                rep.who(r),
                {True: "yes", False: "no"}.get(det.get("bitwise_equal"), ""),
                fmt_num(det.get("max_abs")) if det else "",
                inv.get("error") or _ulps(inv.get("max_ulps")),
                f"{inv['argmax_changed']} / {inv['rows']}" if "rows" in inv else "",
            ]
        )
    nondet = sum(
        1 for r in have if (r["accuracy"].get("determinism") or {}).get("bitwise_equal") is False
    )
    variant = sum(
        1 for r in have if ((r["accuracy"].get("batch_invariance") or {}).get("max_ulps") or 0) > 0
    )
    d.bullets(
        [
            f"{nondet} of {len(have)} rows not bitwise deterministic.",
            f"{variant} of {len(have)} rows not batch invariant (a request alone differs).",
        ]
    )
    d.table(
        [
            "case_id",
            "backend",
            "bitwise equal",
            "max abs (2 runs)",
            "max ULPs alone",
            "argmax changed",
        ],
        table,
        caption="Determinism and batch invariance",
        folded=len(table) > 25,
    )
    return True


def _ulps(v) -> str:
    return "NaN" if v is None else str(v)
