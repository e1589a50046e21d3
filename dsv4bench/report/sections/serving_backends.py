"""Serving curves per backend: the same TTFT/TPOT points from each backend's own kernel rows,
one line per backend, and the envelope (serving.ENVELOPE rows: every attention part on the
fastest backend that ran it). Tables put the backends, and the routes, side by side so a
point's numbers can be read off and compared.

Functions take `rep`, the report being built (dsv4bench.report.render.Report).
"""

from __future__ import annotations

from dsv4bench import backends as registry
from dsv4bench.report import plots
from dsv4bench.report.fmt import fmt_num, kilo, make_slug, natural_text_key
from dsv4bench.report.sections.serving import (
    _serving_figures,
    _serving_series,
    line_suffix,
    route_key,
    route_key_order,
    route_key_title,
)
from dsv4bench.rows import ORACLE_BACKENDS, timers
from dsv4bench.serving.aggregate import ENVELOPE

ENVELOPE_STYLE = {"color": "black", "linestyle": "--", "marker": "*"}
ORACLE_MARK = "†"
ORACLE_NOTE = (
    f"{ORACLE_MARK}: a dequant, remap or indexer part of this point is timed only on the oracle "
    "(a reference row: host-bound, not a kernel time) because its kernel row failed; the value "
    "is an upper bound, and the failed row is under Failures."
)


def serving_backends(rep) -> None:
    serving = [r for r in rep.rows if r["kind"] == "serving"]
    # the oracle's points are a baseline (the Serving curves draw them), never a candidate here
    rows = [r for r in serving if not _is_oracle(r.get("backend"))]
    oracle = sorted({r["backend"] for r in serving if _is_oracle(r.get("backend"))})
    drawn = False
    for title, slug, mrows in _serving_figures(rows):
        if len(_backends(rep, mrows)) < 2:
            continue
        if not drawn:
            rep.doc.heading("Serving per backend")
            rep.doc.para(
                "The same TTFT/TPOT points from each backend's own attention rows (dequant, "
                "remap and indexer parts: the fastest helper row, the same for every backend), "
                f"and the `{ENVELOPE}` (black, dashed): every attention call of every layer "
                "kind and chunk shape on the fastest backend that ran it ok, what an engine "
                "could reach by picking a kernel per call. Points a backend failed are x marks "
                "and show their status in the tables. Times are sums by the timer the captions "
                "name; the Serving tables above give each point's events sum beside."
                + (
                    f" The oracle ({', '.join(f'`{b}`' for b in oracle)}) is a baseline, not a "
                    "candidate: its points are in the Serving curves above, not here."
                    if oracle
                    else ""
                )
            )
            drawn = True
        tpot = [r for r in mrows if r.get("metric") == "tpot"]
        ttft = [r for r in mrows if r.get("metric") == "ttft"]
        if tpot:
            _tpot(rep, title, slug, tpot)
        if ttft:
            _ttft(rep, title, slug, ttft)
    if not drawn:
        rep.left_out.append("Serving per backend: no serving points from two or more backends.")


def _backends(rep, rows: list[dict]) -> list[str]:
    """The backends (lines) in `rows`, the envelope last."""
    names = {rep.who(r) for r in rows}
    return sorted(names - {ENVELOPE}, key=natural_text_key) + [b for b in [ENVELOPE] if b in names]


def _style(backends: list[str]) -> dict[str, dict]:
    colors = plots.colors_for([b for b in backends if b != ENVELOPE])
    return {
        b: (
            ENVELOPE_STYLE
            if b == ENVELOPE
            else {"color": colors[b], "linestyle": "-", "marker": "o"}
        )
        for b in backends
    }


def _is_oracle(backend: str | None) -> bool:
    if backend in ORACLE_BACKENDS:
        return True
    try:
        return bool(backend) and registry.get(backend).is_oracle
    except KeyError:  # a plugin's backend not loaded here
        return False


def oracle_helper(r: dict) -> bool:
    """Whether a helper part (not attention) of serving row `r` came from the oracle."""
    return any(
        p.get("role") != "attention" and p.get("status") == "ok" and _is_oracle(p.get("backend"))
        for p in r.get("parts") or []
    )


def _cell(r: dict | None) -> str:
    if r is None:
        return ""
    if r.get("value_ms") is None:
        return str(r.get("status"))
    return fmt_num(r["value_ms"]) + (f" {ORACLE_MARK}" if oracle_helper(r) else "")


def _fastest(rep, rows: list[dict]) -> str:
    """The backend (not the envelope) with the smallest value among `rows`: by their timer
    where they share one, else by their events sums (a time of one timer is never ranked
    against another's)."""
    ok = [r for r in rows if r.get("value_ms") is not None and rep.who(r) != ENVELOPE]
    if len({timers.point_timer(r) for r in ok}) > 1:
        ok = [r for r in ok if timers.point_events_ms(r) is not None]
        return rep.who(min(ok, key=timers.point_events_ms)) if ok else ""
    return rep.who(min(ok, key=lambda r: r["value_ms"])) if ok else ""


def _timed(rows: list[dict]) -> str:
    """What a table's times are: the timers its points sum by."""
    return "ms by " + " and ".join(sorted({timers.point_timer(r) for r in rows}))


# ---- TPOT -----------------------------------------------------------------------------------


def _tpot(rep, title: str, slug: str, rows: list[dict]) -> None:
    backends = _backends(rep, rows)
    style = _style(backends)
    keys = sorted({(r.get("context_len") or 0, line_suffix(r)) for r in rows})
    panels = []
    for ctx, suffix in keys:
        series = []
        for b in backends:
            pts = sorted(
                (
                    r
                    for r in rows
                    if rep.who(r) == b
                    and ((r.get("context_len") or 0), line_suffix(r)) == (ctx, suffix)
                ),
                key=lambda r: r.get("batch_size") or 0,
            )
            if pts:
                series.append(_serving_series(pts, "batch_size", label=b, **style[b]))
        panels.append(
            plots.Panel(
                f"context {kilo(ctx)}{suffix}",
                "batch size (requests)",
                "TPOT attention part (ms)",
                series,
                note="no points",
            )
        )
    fig = plots.line_figure(
        f"TPOT per backend: {title}",
        panels,
        sharey=True,
        legend={b: {**style[b], "ms": 4.5} for b in backends},
    )
    rep.doc.heading(f"TPOT per backend: {title}", 3)
    rep.doc.image(rep.save(fig, make_slug("tpot-backends", slug)), f"TPOT per backend, {title}")
    table = []
    for ctx, suffix in keys:
        for bs in sorted({r.get("batch_size") or 0 for r in rows}):
            at = [
                r
                for r in rows
                if ((r.get("context_len") or 0), line_suffix(r), r.get("batch_size") or 0)
                == (ctx, suffix, bs)
            ]
            if not at:
                continue
            by = {rep.who(r): r for r in at}
            table.append(
                [
                    f"{kilo(ctx)}{suffix}",
                    bs,
                    *[_cell(by.get(b)) for b in backends],
                    _fastest(rep, at),
                ]
            )
    rep.doc.table(
        ["context", "batch", *[f"{b} ms" for b in backends], "fastest"],
        table,
        caption=f"TPOT per backend ({_timed(rows)}), {title}",
    )
    if any(oracle_helper(r) for r in rows):
        rep.doc.para(ORACLE_NOTE)


# ---- TTFT -----------------------------------------------------------------------------------


def _ttft(rep, title: str, slug: str, rows: list[dict]) -> None:
    backends = _backends(rep, rows)
    style = _style(backends)
    routes = sorted({route_key(r) for r in rows}, key=route_key_order)
    chunks = sorted({r.get("chunk_size") or 0 for r in rows})
    dashes = {c: plots.LINESTYLES[i % len(plots.LINESTYLES)] for i, c in enumerate(chunks)}
    markers = {c: plots.MARKERS[i % len(plots.MARKERS)] for i, c in enumerate(chunks)}
    panels = []
    for key in routes:
        series = []
        for b in backends:
            for c in chunks:
                pts = sorted(
                    (
                        r
                        for r in rows
                        if rep.who(r) == b
                        and route_key(r) == key
                        and (r.get("chunk_size") or 0) == c
                    ),
                    key=lambda r: r.get("prompt_len") or 0,
                )
                if pts:
                    line = {
                        "color": style[b]["color"],
                        "linestyle": dashes[c],
                        "marker": markers[c],
                    }
                    series.append(
                        _serving_series(pts, "prompt_len", label=f"{b}, chunk {c}", **line)
                    )
        panels.append(
            plots.Panel(
                route_key_title(rep, key, rows),
                "prompt length (tokens)",
                "TTFT attention part (ms, log)",
                series,
                logx=True,
                logy=True,
                note="no points",
            )
        )
    legend = {b: {"color": style[b]["color"], "linestyle": "-", "ms": 4.5} for b in backends}
    legend.update(
        {
            f"chunk {c}": {"color": "0.35", "linestyle": dashes[c], "marker": markers[c], "ms": 4.5}
            for c in chunks
        }
    )
    fig = plots.line_figure(
        f"TTFT per backend: {title}", panels, sharey=True, legend=legend, max_cols=4
    )
    rep.doc.heading(f"TTFT per backend: {title}", 3)
    rep.doc.image(rep.save(fig, make_slug("ttft-backends", slug)), f"TTFT per backend, {title}")
    _ttft_by_backend(rep, title, rows, backends, routes, chunks)
    _ttft_by_route(rep, title, rows, backends, routes, chunks)
    if any(oracle_helper(r) for r in rows):
        rep.doc.para(ORACLE_NOTE)


def _prompts(rows: list[dict]) -> list[int]:
    return sorted({r.get("prompt_len") or 0 for r in rows})


def _ttft_by_backend(rep, title, rows, backends, routes, chunks) -> None:
    table = []
    for key in routes:
        for c in chunks:
            for L in _prompts(rows):
                at = [
                    r
                    for r in rows
                    if route_key(r) == key
                    and (r.get("chunk_size") or 0) == c
                    and (r.get("prompt_len") or 0) == L
                ]
                if not at:
                    continue
                by = {rep.who(r): r for r in at}
                label = key[0] + (f", dequant {key[1]}" if key[1] else "")
                table.append(
                    [label, c, L, *[_cell(by.get(b)) for b in backends], _fastest(rep, at)]
                )
    rep.doc.table(
        ["route", "chunk", "prompt", *[f"{b} ms" for b in backends], "fastest"],
        table,
        caption=f"TTFT per backend ({_timed(rows)}), {title}",
    )


def _ttft_by_route(rep, title, rows, backends, routes, chunks) -> None:
    """Per backend, the routes side by side: which route wins at each (chunk, prompt)."""
    labels = [k[0] + (f" ({k[1]})" if k[1] else "") for k in routes]
    for b in backends:
        table = []
        for c in chunks:
            for L in _prompts(rows):
                at = {
                    route_key(r): r
                    for r in rows
                    if rep.who(r) == b
                    and (r.get("chunk_size") or 0) == c
                    and (r.get("prompt_len") or 0) == L
                }
                if not at:
                    continue
                ok = {k: r["value_ms"] for k, r in at.items() if r.get("value_ms") is not None}
                best = min(ok, key=ok.get) if ok else None
                cells = [_cell(at.get(k)) for k in routes]
                best_label = labels[routes.index(best)] if best else ""
                table.append([c, L, *cells, best_label])
        rep.doc.table(
            ["chunk", "prompt", *[f"{lab} ms" for lab in labels], "fastest route"],
            table,
            caption=f"TTFT by route on {b} ({_timed(rows)}), {title}",
        )
