"""TTFT and TPOT curves: serving rows (sums of measured kernel medians) per route and model.

Functions take `rep`, the report being built (dsv4bench.report.render.Report).
"""

from __future__ import annotations

from collections import defaultdict

from dsv4bench.report import plots
from dsv4bench.report.fmt import (
    code_span,
    fmt_num,
    is_num,
    kilo,
    make_slug,
    natural_text_key,
    route_order,
)
from dsv4bench.report.load import (
    param,
    short,
)
from dsv4bench.report.sections import indexer_share
from dsv4bench.rows import timers


def serving(rep) -> None:
    serving = [r for r in rep.rows if r["kind"] == "serving"]
    tpot = [r for r in serving if r.get("metric") == "tpot"]
    ttft = [r for r in serving if r.get("metric") == "ttft"]
    if tpot:
        tpot_curves(rep, tpot)
    else:
        rep.left_out.append("TPOT curves: no serving rows with metric `tpot`.")
    if ttft:
        ttft_curves(rep, ttft)
    else:
        rep.left_out.append("TTFT curves: no serving rows with metric `ttft`.")
    indexer_share.section(rep, serving)


def route_key(r: dict) -> tuple[str, str | None]:
    """A TTFT curve's route policy and its dequant mode where it is not the default "read"
    (sglang #25502's whole-pool dequant is drawn as its own panel)."""
    mode = r.get("dequant")
    return str(r.get("route")), (mode if mode not in (None, "read") else None)


def route_key_order(key: tuple[str, str | None]):
    return (route_order(key[0]), key[1] or "")


def route_key_title(rep, key: tuple[str, str | None], rows: list[dict]) -> str:
    title = _route_title(rep, key[0], rows)
    return title if key[1] is None else f"{title}, dequant {key[1]}"


def line_suffix(r: dict) -> str:
    """What sets a TPOT line apart beyond its backend: the C128 index-build mode."""
    mode = r.get("c128_index")
    return "" if mode in (None, "none") else f" (C128 index per {mode})"


def _label_line(rep, rows: list[dict]) -> str:
    labels = sorted({r["label"] for r in rows if r.get("label")})
    timed = sorted({timers.point_timer(r) for r in rows})
    how = f"kernel times by {' and '.join(timed)}"
    if timed != ["events"]:
        how += (
            " (the run's timer, the winners' rule; a point with a part that has none, such as "
            "the oracle's, sums events; column `timer`), the events sum beside"
        )
    return "; ".join([*labels, how])


def _part_events(r: dict, p: dict) -> float | None:
    """A part's events median: beside its time, or its time where the point sums events."""
    if "events_ms" in p:
        return p["events_ms"]
    return p.get("ms", p.get("median_ms")) if timers.point_timer(r) == "events" else None


def _parts_table(rep, points: list[tuple[str, dict]], caption: str) -> None:
    rep.doc.table(
        ["point", "case_id", "role", "row of", "multiplicity", "ms", "events ms", "status"],
        [
            [
                pid,
                code_span(p.get("case_id")),
                p.get("role") or "",
                p.get("backend") or "",
                p.get("multiplicity"),
                fmt_num(p.get("ms", p.get("median_ms"))),
                fmt_num(_part_events(r, p)),
                p.get("status"),
            ]
            for pid, r in points
            for p in r["parts"]
        ],
        caption=caption,
        folded=True,
    )


def _serving_figures(rows: list[dict]) -> list[tuple[str, str, list[dict]]]:
    """(title, file slug, rows) per model and heads per rank."""
    keys = sorted(
        {(str(r.get("model")), r.get("num_heads") or 0, r.get("tp") or 0) for r in rows},
        key=lambda k: (k[0], -k[1], k[2]),
    )
    several = len({k[0] for k in keys}) < len(keys)
    out = []
    for model, heads, tp in keys:
        title, slug = model, [model]
        if several or (tp and tp > 1):
            bits = [f"{heads} heads/rank" if heads else "", f"TP {tp}" if tp else ""]
            title += " (" + ", ".join(b for b in bits if b) + ")"
            slug += [f"h{heads}" if heads else "", f"tp{tp}" if tp else ""]
        sel = [
            r
            for r in rows
            if (str(r.get("model")), r.get("num_heads") or 0, r.get("tp") or 0)
            == (model, heads, tp)
        ]
        out.append((title, make_slug(*slug), sel))
    return out


def _serving_lines(rep, rows: list[dict]) -> dict[int, str]:
    """Per row (by id), the name of its line: the backend, with the scenario where one
    backend's rows in this figure come from several scenarios."""
    scenarios = defaultdict(set)
    name = lambda r: rep.who(r) + line_suffix(r)  # noqa: E731
    for r in rows:
        scenarios[name(r)].add(str(r.get("scenario") or ""))
    return {
        id(r): (f"{name(r)} ({r.get('scenario')})" if len(scenarios[name(r)]) > 1 else name(r))
        for r in rows
    }


def _route_title(rep, route: str, rows: list[dict]) -> str:
    """A route and what it means: the threshold's source, the measured limit behind safe."""
    from dsv4bench.measure import hardware

    if route == "decode-kernel":
        return "decode-kernel (b = chunk tokens)"
    if route == "decode-mixed":
        return "decode-mixed (s_q = chunk tokens)"
    if route == "sparse-prefill":
        return "sparse-prefill (prefill kernel)"
    if route.startswith("threshold:"):
        n = route.split(":", 1)[1]
        if n == str(hardware.SGLANG_DSV4_THRESHOLD):
            return f"{route} (sglang DSv4)"
        return f"{route} (decode kernel up to {n} tokens)"
    if route == "safe":
        limits = {r.get("threshold") for r in rows if str(r.get("route")) == "safe"}
        limits = {v for v in limits if is_num(v)}
        if not limits:
            models = {str(r.get("model")) for r in rows}
            limits = {
                r["last_ok"]
                for r in rep.rows
                if r["kind"] == "limit"
                and is_num(r.get("last_ok"))
                and str(param(r, "model")) in models
                and param(r, "route") in (None, "decode-kernel")
            }
        if limits:
            return "safe (measured limit " + "/".join(str(v) for v in sorted(limits)) + ")"
        return "safe (threshold = measured limit)"
    return route


def _point_id(r: dict, i: int, prefix: str) -> str:
    return r.get("case_id") or f"{prefix}{i}"


def _helpers(r: dict) -> str:
    """The helper kernels a point sums (its dequant, remap and cache_write parts): role,
    backend, kernel."""
    took = {
        (x.get("role"), x.get("backend"), x.get("kernel") or "")
        for x in r.get("parts") or ()
        if x.get("role") in ("dequant", "remap", "cache_write") and x.get("backend")
    }
    return "; ".join(f"{role}: {b}" + (f" ({k})" if k else "") for role, b, k in sorted(took))


def _breakdown(r: dict) -> str:
    b = r.get("breakdown_ms")
    if not isinstance(b, dict):
        return ""
    return " / ".join(f"{k} {fmt_num(v)}" for k, v in b.items() if v)


def tpot_curves(rep, rows: list[dict]) -> None:
    d = rep.doc
    d.heading("Serving: TPOT (decode step, attention part)")
    label = _label_line(rep, rows)
    if label:
        d.para(
            f"What the numbers count: {label}. Color: context length; where several "
            "backends (or scenarios) are shown, line style and marker tell them apart and "
            "the y axis is logarithmic."
        )
    for title, slug, mrows in _serving_figures(rows):
        line_of = _tpot_figure(rep, title, slug, mrows)
        _tpot_tables(rep, title, mrows, line_of)


def _tpot_figure(rep, title: str, slug: list, mrows: list[dict]) -> dict[int, str]:
    """TPOT vs batch size, a line per (backend line, context); returns id(row) -> line."""
    line_of = _serving_lines(rep, mrows)
    lines = sorted(set(line_of.values()), key=natural_text_key)
    ctxs = sorted({r.get("context_len") or 0 for r in mrows})
    ctx_color = {c: plots.PALETTE[i % len(plots.PALETTE)] for i, c in enumerate(ctxs)}
    styled = len(lines) > 1
    series = []
    for li, line in enumerate(lines):
        brows = [r for r in mrows if line_of[id(r)] == line]
        for ctx in ctxs:
            pts = sorted(
                (r for r in brows if (r.get("context_len") or 0) == ctx),
                key=lambda r: r.get("batch_size") or 0,
            )
            if not pts:
                continue
            series.append(
                _serving_series(
                    pts,
                    "batch_size",
                    label=f"{line}, context {kilo(ctx)}",
                    color=ctx_color[ctx],
                    linestyle=plots.LINESTYLES[li % len(plots.LINESTYLES)],
                    marker=plots.MARKERS[li % len(plots.MARKERS)],
                )
            )
    legend = {f"context {kilo(c)}": {"color": ctx_color[c], "marker": "o", "ms": 4.5} for c in ctxs}
    if styled:  # backends as line style and marker, in black
        legend.update(
            {
                line: {
                    "color": "0.25",
                    "linestyle": plots.LINESTYLES[i % len(plots.LINESTYLES)],
                    "marker": plots.MARKERS[i % len(plots.MARKERS)],
                    "ms": 4.5,
                }
                for i, line in enumerate(lines)
            }
        )
    panel = plots.Panel(
        " vs ".join(lines) if styled else lines[0] if lines else "",
        "batch size (requests)",
        "TPOT attention part (ms)" + (", log" if styled else ""),
        series,
        logy=True if styled else None,
    )
    fig = plots.line_figure(
        f"TPOT vs batch size: {title}", [panel], panel_w=plots.PANEL_W * 1.35, legend=legend
    )
    rep.doc.heading(f"TPOT: {title}", 3)
    rep.doc.image(rep.save(fig, make_slug("tpot", slug)), f"TPOT vs batch size, {title}")
    return line_of


def _tpot_tables(rep, title: str, mrows: list[dict], line_of: dict[int, str]) -> None:
    """The points (failed ones first, in their own table) and the kernel rows behind them."""
    ordered = sorted(
        mrows,
        key=lambda r: (
            natural_text_key(line_of[id(r)]),
            r.get("context_len") or 0,
            r.get("batch_size") or 0,
        ),
    )
    points = [(_point_id(r, i, "P"), r) for i, r in enumerate(ordered, 1)]
    fields = {"context": "context_len", "batch": "batch_size"}
    who = lambda r, labels=line_of: labels[id(r)]  # noqa: E731 (the line label)
    _failed_points(rep.doc, points, who, fields, f"Failed TPOT points (x marks), {title}")
    rep.doc.table(
        [
            "point",
            "backend",
            "context",
            "batch",
            "TPOT ms",
            "timer",
            "events TPOT ms",
            "breakdown ms",
            "workspace MiB",
            "helper kernels",
            "status",
            "parts",
        ],
        [
            [
                code_span(pid),
                line_of[id(r)],
                r.get("context_len"),
                r.get("batch_size"),
                fmt_num(r.get("value_ms")),
                timers.point_timer(r),
                fmt_num(timers.point_events_ms(r)),
                _breakdown(r),
                fmt_num(r.get("workspace_mib")),
                _helpers(r),
                r.get("status"),
                len(r["parts"]),
            ]
            for pid, r in points
        ],
        caption=f"TPOT points, {title}",
    )
    _parts_table(rep, points, f"TPOT parts (kernel rows behind each point), {title}")


def ttft_curves(rep, rows: list[dict]) -> None:
    d = rep.doc
    d.heading("Serving: TTFT (prefill, attention part)")
    label = _label_line(rep, rows)
    if label:
        d.para(f"What the numbers count: {label}.")
    d.para(
        "One panel per route, y axis shared (log); color: chunk size, the same in every "
        "panel. A point whose part failed is an x at the panel's bottom edge and is listed "
        "below."
    )
    for title, slug, mrows in _serving_figures(rows):
        _ttft_figure(rep, title, slug, mrows)
        _routing_note(rep, mrows)
        _ttft_tables(rep, title, mrows)


def _routing_note(rep, rows: list[dict]) -> None:
    """Where a threshold route and `safe` part ways: the points with a chunk (a last, shorter
    one included) between the measured limit and the threshold, and what became of them on
    each route; or that no point has one."""
    safe = {r.get("threshold") for r in rows if str(r.get("route")) == "safe"}
    safe = sorted(v for v in safe if is_num(v))
    thresholds = sorted(
        {str(r.get("route")) for r in rows if str(r.get("route")).startswith("threshold:")}
    )
    if len(safe) != 1 or not thresholds:
        return
    limit = safe[0]
    for route in thresholds:
        n = int(route.split(":", 1)[1])
        if n <= limit:
            continue
        between = {
            id(r): sizes
            for r in rows
            if str(r.get("route")) in (route, "safe") and (sizes := _chunks_between(r, limit, n))
        }
        if not between:
            rep.doc.para(
                f"`{route}` and `safe` route every chunk alike here: no point has a chunk "
                f"between the measured decode-route limit ({limit}) and {n} tokens, the only "
                "sizes where they differ."
            )
            continue
        sizes = sorted({t for ts in between.values() for t in ts})
        shown = ", ".join(str(t) for t in sizes[:6]) + (", ..." if len(sizes) > 6 else "")
        rep.doc.para(
            f"Chunks of {shown} tokens lie between the measured decode-route limit ({limit}) "
            f"and {n}: `{route}` sends them to the decode kernel "
            f"({_tally(rows, route, between)}), `safe` to sparse prefill "
            f"({_tally(rows, 'safe', between)})."
        )


def _chunks_between(row: dict, lo: int, hi: int) -> list[int]:
    """The chunk lengths of a TTFT point in (lo, hi]."""
    from dsv4bench.serving import chunks

    prompt, size = row.get("prompt_len"), row.get("chunk_size")
    if not (is_num(prompt) and is_num(size)) or prompt <= 0 or size <= 0:
        return []
    return [c.tokens for c in chunks(int(prompt), int(size)) if lo < c.tokens <= hi]


def _ttft_figure(rep, title: str, slug: list, mrows: list[dict]) -> None:
    """TTFT vs prompt length: a panel per route (and backend), a line per chunk size."""
    chunks = sorted({r.get("chunk_size") or 0 for r in mrows})
    chunk_color = {c: plots.PALETTE[i % len(plots.PALETTE)] for i, c in enumerate(chunks)}
    routes = sorted({route_key(r) for r in mrows}, key=route_key_order)
    whos = sorted({rep.who(r) for r in mrows})
    panels = []
    for who in whos:
        brows = [r for r in mrows if rep.who(r) == who]
        for route in routes:
            series = []
            for ci, chunk in enumerate(chunks):
                pts = sorted(
                    (
                        r
                        for r in brows
                        if route_key(r) == route and (r.get("chunk_size") or 0) == chunk
                    ),
                    key=lambda r: r.get("prompt_len") or 0,
                )
                if not pts:
                    continue
                series.append(
                    _serving_series(
                        pts,
                        "prompt_len",
                        label=f"chunk {chunk}",
                        color=chunk_color[chunk],
                        marker=plots.MARKERS[ci % len(plots.MARKERS)],
                    )
                )
            route_title = route_key_title(rep, route, mrows)
            panels.append(
                plots.Panel(
                    f"{who}: {route_title}" if len(whos) > 1 else route_title,
                    "prompt length (tokens)",
                    "TTFT attention part (ms, log)",
                    series,
                    logx=True,
                    logy=True,
                    note=f"no {route_title} rows for {who}",
                )
            )
    legend = {
        f"chunk {c}": {
            "color": chunk_color[c],
            "marker": plots.MARKERS[i % len(plots.MARKERS)],
            "ms": 4.5,
        }
        for i, c in enumerate(chunks)
    }
    if len(whos) > 1:  # a row of panels per backend, a column per route
        layout = {"ncols": len(routes), "panel_w": plots.PANEL_W * 0.8}
    else:
        layout = {"ncols": 2 if len(routes) in (2, 4) else min(3, len(routes))}
    fig = plots.line_figure(
        f"TTFT vs prompt length: {title}", panels, sharey=True, legend=legend, **layout
    )
    rep.doc.heading(f"TTFT: {title}", 3)
    rep.doc.image(rep.save(fig, make_slug("ttft", slug)), f"TTFT vs prompt length, {title}")


def _tally(rows: list[dict], route: str, points: dict) -> str:
    """How many of a route's points among `points` (by id) failed, and how."""
    pts = [r for r in rows if str(r.get("route")) == route and id(r) in points]
    failed = [r for r in pts if r.get("value_ms") is None]
    states = sorted({str(r.get("status")) for r in failed})
    return f"{len(failed)} of {len(pts)} points failed" + (
        f": {', '.join(states)}" if states else ""
    )


def _ttft_tables(rep, title: str, mrows: list[dict]) -> None:
    """The points (failed ones first, in their own table) and the kernel rows behind them."""
    ordered = sorted(
        mrows,
        key=lambda r: (
            rep.who(r),
            route_key_order(route_key(r)),
            r.get("chunk_size") or 0,
            r.get("prompt_len") or 0,
        ),
    )
    points = [(_point_id(r, i, "F"), r) for i, r in enumerate(ordered, 1)]
    fields = {"route": "route", "dequant": "dequant", "chunk": "chunk_size", "prompt": "prompt_len"}
    caption = f"Failed TTFT points (x marks), {title}"
    _failed_points(rep.doc, points, rep.who, fields, caption)
    rep.doc.table(
        [
            "point",
            "backend",
            "route",
            "dequant",
            "chunk",
            "prompt",
            "TTFT ms",
            "timer",
            "events TTFT ms",
            "breakdown ms",
            "workspace MiB",
            "helper kernels",
            "status",
            "parts",
        ],
        [
            [
                code_span(pid),
                rep.who(r),
                r.get("route"),
                r.get("dequant") or "",
                r.get("chunk_size"),
                r.get("prompt_len"),
                fmt_num(r.get("value_ms")),
                timers.point_timer(r),
                fmt_num(timers.point_events_ms(r)),
                _breakdown(r),
                fmt_num(r.get("workspace_mib")),
                _helpers(r),
                r.get("status"),
                len(r["parts"]),
            ]
            for pid, r in points
        ],
        caption=f"TTFT points, {title}",
    )
    _parts_table(rep, points, f"TTFT parts (kernel rows behind each point), {title}")


def _failed_points(doc, points, who, fields: dict[str, str], caption: str) -> None:
    """The points without a value (x marks on the plot), with the reason; `fields`: column
    header -> row key."""
    failed = [(pid, r) for pid, r in points if r.get("value_ms") is None]
    if not failed:
        return
    doc.table(
        ["point", "backend", *fields, "status", "message"],
        [
            [code_span(pid), who(r), *[r.get(k) for k in fields.values()]]
            + [r.get("status"), short(r.get("message"))]
            for pid, r in failed
        ],
        caption=caption,
    )


def _serving_series(pts: list[dict], x_key: str, **style) -> plots.Series:
    """Serving points along x_key: measured ones as a line, failed ones (no value) as marks."""
    placed = [r for r in pts if is_num(r.get(x_key))]
    ok = [r for r in placed if r.get("value_ms") is not None]
    return plots.Series(
        xs=[r[x_key] for r in ok],
        ys=[r["value_ms"] for r in ok],
        failed_xs=[r[x_key] for r in placed if r.get("value_ms") is None],
        **style,
    )
