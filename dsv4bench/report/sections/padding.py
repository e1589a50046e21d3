"""Head-padding overhead: the time padded heads cost against the useful heads.

Functions take `rep`, the report being built (dsv4bench.report.render.Report).
"""

from __future__ import annotations

from dsv4bench.report import grouping, plots
from dsv4bench.report.fmt import (
    code_span,
    fmt_num,
    make_slug,
    pct,
)
from dsv4bench.report.load import (
    param,
    timed_attention_rows,
)
from dsv4bench.rows import timers


def head_padding(rep) -> None:
    rows = [
        r
        for r in timed_attention_rows(rep.rows)
        if isinstance(param(r, "num_heads"), int) and param(r, "num_heads") > 0
    ]
    groups = grouping.line_groups(rep, rows, {"num_heads", "head_padding", "seed", "model"})
    groups = {k: v for k, v in groups.items() if len({param(r, "num_heads") for r in v}) > 1}
    if not groups:
        rep.left_out.append(
            "Head-padding overhead: no case family measured at more than one head count."
        )
        return
    d = rep.doc
    d.heading("Head-padding overhead")
    d.para(
        "Time per useful head = time / useful heads per rank, each line by the timer all its "
        "rows measured (the winners' rule: profiler makespan, else graph replay, else events; "
        "the table gives the events median beside it). Kernels pad heads "
        "(FP8 decode to 64 or 128), so below the padded count the time per useful head "
        "grows as heads shrink (tensor parallelism divides heads across ranks)."
    )
    models = sorted({str(param(r, "model")) for rs in groups.values() for r in rs})
    for model in models:
        mgroups = {k: v for k, v in groups.items() if str(param(v[0], "model")) == model}
        styled = grouping.line_styles(rep, mgroups)
        per_head, relative = [], []
        table = []
        for gkey, label, style, _full in styled:
            rs = sorted(mgroups[gkey], key=lambda r: param(r, "num_heads"))
            hs = [param(r, "num_heads") for r in rs]
            key, timer = timers.shared(rs) or (timers.EVENTS, "events")
            ms = [timers.value(r, key) or 0.0 for r in rs]
            ys = [t / h for t, h in zip(ms, hs, strict=True)]
            per_head.append(plots.Series(label, hs, ys, **style))
            if ys[-1] > 0:
                relative.append(plots.Series(label, hs, [y / ys[-1] for y in ys], **style))
            for r, h, t, y in zip(rs, hs, ms, ys, strict=True):
                padded = (r.get("info") or {}).get("padded_heads")
                table.append(
                    [
                        code_span(r["case_id"]),
                        label,
                        h,
                        padded or "",
                        fmt_num(t),
                        timer,
                        fmt_num(timers.events_ms(r)),
                        fmt_num(y),
                        f"{y / ys[-1]:.2f}" if ys[-1] > 0 else "",
                        pct(h / padded) if isinstance(padded, int) and padded else "",
                    ]
                )
        fig = plots.line_figure(
            f"Head-padding overhead: {model}", _panels(per_head, relative), max_cols=2
        )
        d.heading(f"Head padding: {model}", 3)
        d.image(rep.save(fig, make_slug("head-padding", model)), f"head padding {model}")
        d.table(
            [
                "case_id",
                "series",
                "heads",
                "padded heads",
                "ms",
                "timer",
                "events ms",
                "ms/head",
                "ms/head / ms/head at most heads",
                "useful",
            ],
            table,
            caption=f"Head-padding rows, {model}",
        )


def _panels(per_head: list, relative: list) -> list:
    """Time per useful head, and the same relative to the largest head count."""
    return [
        plots.Panel(
            "time per useful head",
            "useful heads per rank",
            "ms per useful head",
            per_head,
            logx=True,
        ),
        plots.Panel(
            "relative to the largest head count",
            "useful heads per rank",
            "time per head / time per head at most heads",
            relative,
            logx=True,
            hlines=[(1.0, "per-head cost at the most heads", "0.4")],
        ),
    ]
