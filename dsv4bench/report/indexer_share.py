"""The indexer's share of TTFT/TPOT: serving rows whose points include indexer parts
(`indexer: true` specs) carry breakdown_ms["indexer"]; this section plots indexer / total.
Where the run also has `topk` rows of the same shapes, breakdown_ms["indexer_topk"] holds the
top-k alone (serving.aggregate.indexer_topk_ms) and the table adds top-k / indexer."""

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


def topk_share(row: dict) -> float | None:
    """top-k ms (the topk rows) / indexer ms (the indexer rows: logits + their own top-k), or
    None when the row has no top-k part."""
    b = row.get("breakdown_ms") or {}
    ix, top = b.get("indexer"), b.get("indexer_topk")
    if not ix or top is None:
        return None
    return top / ix


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
        "line per (model, context)."
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
    split = any(topk_share(r) is not None for r in rows)
    if split:
        d.para(
            "top-k ms: the indexer's top-k alone, the fastest `topk` row (plain form) of each "
            "indexer part's shape; top-k / indexer = that time divided by the indexer rows' "
            "whole time (FP8 logits + their own top-k), nothing subtracted: the logits' share "
            "is at most 1 - top-k / indexer when the indexer rows' top-k is the same kernel."
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
            *(_topk_cells(r) if split else ()),
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
            *(("top-k ms", "top-k / indexer") if split else ()),
        ],
        table,
        folded=True,
    )


def _topk_cells(row: dict) -> tuple[str, str]:
    top = topk_share(row)
    if top is None:
        return "", ""
    return f"{row['breakdown_ms']['indexer_topk']:.3f}", f"{100 * top:.1f}%"


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
        series.append(
            plots.Series(
                label=label,
                xs=[r[x_key] for r in pts],
                ys=[share(r) for r in pts],
                marker=plots.MARKERS[i % len(plots.MARKERS)],
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
