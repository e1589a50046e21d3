"""The indexer's share of TTFT/TPOT: serving rows whose points include indexer parts
(`indexer: true` specs) carry breakdown_ms["indexer"]; this section plots indexer / total
(and, where split, its top-k part / total).
Where the indexer rows split their time (measure/split.py), breakdown_ms holds
"indexer_logits" and "indexer_topk", adding up to "indexer", and the table shows both; where
the run also has `topk` rows of the same shapes, "topk_alone" is the fastest top-k kernel on its
own (serving.aggregate.topk_alone_ms; rows before the split called it "indexer_topk")."""

from __future__ import annotations

from dsv4bench.report import plots


def share(row: dict) -> float | None:
    """indexer ms / total ms of one ok serving row, or None when it has no indexer part."""
    b = row.get("breakdown_ms") or {}
    total = row.get("value_ms")
    ix = b.get("indexer")
    if not ix or not total:
        return None
    return ix / total


def stages(row: dict) -> tuple[float, float] | None:
    """(logits ms, top-k ms) of the indexer's own time, or None when its rows had no split."""
    b = row.get("breakdown_ms") or {}
    if b.get("indexer_logits") is None or b.get("indexer_topk") is None:
        return None
    return b["indexer_logits"], b["indexer_topk"]


def topk_alone(row: dict) -> float | None:
    """The fastest top-k kernel alone (ms) for the row's indexer parts, or None. Rows written
    before the split held it as "indexer_topk" (with no "indexer_logits")."""
    b = row.get("breakdown_ms") or {}
    if b.get("topk_alone") is not None:
        return b["topk_alone"]
    return b.get("indexer_topk") if b.get("indexer_logits") is None else None


def topk_share(row: dict) -> float | None:
    """The indexer's own top-k / its whole time where it is split, else None."""
    found, ix = stages(row), (row.get("breakdown_ms") or {}).get("indexer")
    return found[1] / ix if found and ix else None


def topk_part(row: dict) -> float | None:
    """The indexer's own top-k / the point's total, where the indexer's time is split."""
    found, total = stages(row), row.get("value_ms")
    return found[1] / total if found and total else None


def alone_share(row: dict) -> float | None:
    """top-k alone / the indexer's whole time (nothing subtracted), or None."""
    alone, ix = topk_alone(row), (row.get("breakdown_ms") or {}).get("indexer")
    return alone / ix if alone is not None and ix else None


def rows_with_indexer(serving: list[dict]) -> list[dict]:
    return [r for r in serving if share(r) is not None]


def section(report, serving: list[dict]) -> None:
    """Add the section (heading, one figure, one table) to a report.Report."""
    rows = rows_with_indexer(serving)
    if not rows:
        return
    d = report.doc
    d.heading("Serving: the lightning indexer's share")
    d.para(
        "Indexer (FP8 logits + top-k, timed on the fastest helper backend) as a fraction of "
        "each TTFT / TPOT point that includes it (V3.2: every layer; V4: the C4 layers). "
        "TTFT: x prompt length, one line per (model, chunk, route); TPOT: x batch size, one "
        "line per (model, context). Where the indexer rows split their time, a dashed line of "
        "the same color is its top-k part (top-k ms / total ms): the gap between the two "
        "lines is the logits."
    )
    panels = [
        _panel(report, rows, metric, x_key, xlabel)
        for metric, x_key, xlabel in (
            ("ttft", "prompt_len", "prompt length (tokens)"),
            ("tpot", "batch_size", "batch size"),
        )
    ]
    fig = plots.line_figure("Lightning indexer share of TTFT and TPOT", panels, max_cols=2)
    d.image(report.save(fig, "indexer-share"), "indexer share of TTFT and TPOT")
    split = any(stages(r) is not None for r in rows)
    alone = any(topk_alone(r) is not None for r in rows)
    if split:
        d.para(
            "logits ms, top-k ms: the indexer rows' own time split, their FP8 logits timed "
            "alone and the top-k the rest of the call (the same timer): the two add up to "
            "indexer ms; top-k / indexer = top-k ms / indexer ms."
        )
    if alone:
        d.para(
            "top-k alone ms: the fastest `topk` row (plain form) of each indexer part's "
            "shape, a top-k kernel timed on its own; alone / indexer = that time divided by "
            "the indexer's whole time, nothing subtracted."
        )
    table = [
        [
            r.get("metric"),
            r.get("model"),
            report.who(r),
            r.get("route"),
            r.get("prompt_len") or "",
            r.get("chunk_size") or "",
            r.get("batch_size") or "",
            r.get("context_len") or "",
            f"{r['breakdown_ms']['indexer']:.3f}",
            f"{r['value_ms']:.3f}",
            f"{100 * share(r):.1f}%",
            *(_split_cells(r) if split else ()),
            *(_alone_cells(r) if alone else ()),
        ]
        for r in rows
    ]
    d.table(
        [
            "metric",
            "model",
            "backend",
            "route",
            "prompt",
            "chunk",
            "batch",
            "context",
            "indexer ms",
            "total ms",
            "share",
            *(("logits ms", "top-k ms", "top-k / indexer") if split else ()),
            *(("top-k alone ms", "alone / indexer") if alone else ()),
        ],
        table,
        folded=True,
    )


def _split_cells(row: dict) -> tuple[str, str, str]:
    found = stages(row)
    if found is None:
        return "", "", ""
    return f"{found[0]:.3f}", f"{found[1]:.3f}", f"{100 * topk_share(row):.1f}%"


def _alone_cells(row: dict) -> tuple[str, str]:
    top = alone_share(row)
    if top is None:
        return "", ""
    return f"{topk_alone(row):.3f}", f"{100 * top:.1f}%"


def _panel(report, rows: list[dict], metric: str, x_key: str, xlabel: str):
    """One metric's panel: the indexer's share along x_key, a line per model and shape."""
    groups: dict[str, list[dict]] = {}
    for r in (r for r in rows if r.get("metric") == metric):
        if metric == "ttft":
            key = f"{r.get('model')} chunk {r.get('chunk_size')} {r.get('route')}"
        else:
            key = f"{r.get('model')} S={r.get('context_len')}"
        groups.setdefault(f"{key} [{report.who(r)}]", []).append(r)
    series = []
    for i, (label, pts) in enumerate(sorted(groups.items())):
        pts = sorted(pts, key=lambda r: r.get(x_key) or 0)
        marker, color = plots.MARKERS[i % len(plots.MARKERS)], f"C{i % 10}"
        xs = [r[x_key] for r in pts]
        series.append(plots.Series(label, xs, [share(r) for r in pts], color=color, marker=marker))
        if all(stages(r) is not None for r in pts):  # the same points, the top-k part alone
            series.append(
                plots.Series(
                    f"{label}: its top-k",
                    xs,
                    [topk_part(r) for r in pts],
                    color=color,
                    marker=marker,
                    linestyle="--",
                )
            )
    return plots.Panel(
        f"{metric.upper()}: indexer share",
        xlabel,
        "indexer / total",
        series,
        logx=True,
        logy=False,
        ypercent=True,
        note=f"no {metric} rows with an indexer part",
    )
