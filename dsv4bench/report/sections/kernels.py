"""Kernel throughput: GPU time, TFLOP/s and fraction of peak per case family, all by the timer
the winners rank by (rows/timers.py: the profiler's makespan where a row has it), the events
median beside.

Functions take `rep`, the report being built (dsv4bench.report.render.Report).
"""

from __future__ import annotations

from dsv4bench.measure.metrics import DERIVED, NO_WORK_FIGURES, derived_at, does_no_work
from dsv4bench.report import grouping, plots
from dsv4bench.report.fmt import (
    code_span,
    fmt_num,
    is_num,
    make_slug,
    natural_key,
    natural_text_key,
)
from dsv4bench.report.load import (
    param,
    timed_attention_rows,
)
from dsv4bench.rows import timers


def kernels(rep) -> None:
    rows = [
        r
        for r in timed_attention_rows(rep.rows)
        if (r.get("derived") or {}).get("tflops") is not None
    ]
    if not rows:
        rep.left_out.append("Kernel throughput: no ok decode/prefill rows with TFLOP/s.")
        return
    d = rep.doc
    d.heading("Kernel throughput")
    d.para(
        "TFLOP/s counts useful heads only (`2 * tokens * heads * topk * (d_qk + d_v)`, "
        "FlashMLA's count). Fraction of peak is the larger of compute/peak bf16 and "
        "bytes/peak bandwidth (the binding roof, column `bound`). Times, plots and rates use "
        "each row's GPU time by the winners' timer (column `timer`: the profiler's makespan "
        "where the row has it), the events median beside."
    )
    for op, xkey, xlabel in (
        ("decode", "batch_size", "batch size (requests)"),
        ("prefill", "tokens", "chunk tokens"),
    ):
        orows = [r for r in rows if r["op"] == op]
        for model in sorted({str(param(r, "model")) for r in orows}):
            mrows = [r for r in orows if str(param(r, "model")) == model]
            label_of = _figure(rep, op, model, mrows, xkey, xlabel)
            _table(rep, op, model, mrows, xkey, label_of)


def _figure(rep, op: str, model: str, mrows: list[dict], xkey: str, xlabel: str) -> dict:
    """The TFLOP/s and fraction-of-peak plot of one op and model; returns id(row) -> (line
    label, full label) of the rows it draws."""
    d = rep.doc
    # rows measured only as parts of serving points (tag `serving`) are a scatter
    # of shapes, one line each: drawn only when the model has nothing else
    serving = [r for r in mrows if "serving" in (r.get("tags") or [])]
    sweep = [r for r in mrows if "serving" not in (r.get("tags") or [])]
    plotted = [r for r in (sweep or mrows) if is_num(param(r, xkey))]
    groups = grouping.line_groups(rep, plotted, {xkey, "seed", "model"})
    lines = {g: rs for g, rs in groups.items() if len({param(r, xkey) for r in rs}) > 1}
    single = len(groups) - len(lines) if lines else 0
    tf_series, pk_series = [], []
    label_of: dict[int, tuple[str, str]] = {}
    for gkey, label, style, full in grouping.line_styles(rep, lines or groups):
        for r in groups[gkey]:
            label_of[id(r)] = (label, full)
        rs = sorted(groups[gkey], key=lambda r: param(r, xkey) or 0)
        xs = [param(r, xkey) for r in rs]
        tf_series.append(plots.Series(label, xs, [_derived(r)["tflops"] for r in rs], **style))
        pk = [(param(r, xkey), _derived(r).get("peak_fraction")) for r in rs]
        pk = [(x, y) for x, y in pk if y is not None]
        if pk:
            pk_series.append(plots.Series(label, [x for x, _ in pk], [y for _, y in pk], **style))
    panels = [plots.Panel("achieved TFLOP/s", xlabel, "TFLOP/s (useful heads)", tf_series)]
    if pk_series:
        reaches_peak = any(y >= 1.0 for s in pk_series for y in s.ys)
        panels.append(
            plots.Panel(
                "fraction of peak (binding roof)",
                xlabel,
                "fraction of peak",
                pk_series,
                ypercent=True,
                hlines=[(1.0, "100% of peak", "0.4")] if reaches_peak else [],
            )
        )
    fig = plots.line_figure(f"{op} kernel throughput vs {xlabel}: {model}", panels, max_cols=2)
    d.heading(f"{op}: {model}", 3)
    d.image(rep.save(fig, make_slug("kernel", op, model)), f"{op} throughput {model}")
    if not pk_series:
        devices = sorted({str((r.get("env") or {}).get("gpu") or "cpu") for r in plotted})
        d.para(
            f"No fraction-of-peak panel: these rows ran on {', '.join(devices)}, which has no "
            "known peak bf16 rate or bandwidth (measure/hardware.py lists the GPUs it knows)."
        )
    if single:
        d.para(
            f"{single} {'family' if single == 1 else 'families'} measured at a single {xkey} "
            f"value {'is' if single == 1 else 'are'} not drawn "
            "as lines; their rows are in the table."
        )
    if serving and sweep:
        d.para(
            f"{len(serving)} rows measured as parts of serving points (tag "
            "`serving`, every layer shape of every point) are not drawn; they are "
            "in the table and in the serving parts tables."
        )
    return label_of


def _table(rep, op: str, model: str, mrows: list[dict], xkey: str, label_of: dict) -> None:
    """Every row of one op and model, the drawn ones first, with the registered metrics."""
    columns = [m for m in DERIVED.values() if m.column]
    table = []
    for r in sorted(
        mrows,
        key=lambda r: (
            id(r) not in label_of,  # the drawn rows first, line by line
            rep.who(r),
            natural_text_key(label_of.get(id(r), ("", ""))[0]),
            natural_key(param(r, xkey)),
            r["case_id"],
        ),
    ):
        label, full = label_of.get(id(r), ("", ""))
        ms, timer = timers.gpu_ms(r)
        table.append(
            [code_span(r["case_id"]), rep.who(r), label, full, param(r, xkey)]
            + [fmt_num(ms), timer, fmt_num(timers.events_ms(r))]
            + [m.show(_derived(r).get(m.name)) for m in columns]
        )
    head = ["case_id", "backend", "line (plot label)", "line params", xkey, "ms", "timer"]
    head.append("events ms")
    rep.doc.table([*head, *[m.column for m in columns]], table, caption=f"{op} rows, {model}")


def _derived(row: dict) -> dict:
    """The row's derived metrics (computed at run time from the events median) at its GPU time
    by the winners' timer; a call that did no work (a 0-token chunk) has no rate of bytes and
    no fraction of peak, whatever an older row stored."""
    out = derived_at(row["derived"], timers.events_ms(row), timers.ms(row))
    if does_no_work(row.get("op"), out):
        out.update(dict.fromkeys(NO_WORK_FIGURES))
    return out
