"""The static trend page: one folder (index.html and the trend PNGs beside it), no server, no
script. The gate's verdict on the latest entry heads it (a red banner on a regression); a table
of every entry; every regression of every entry against its own window (red rows); then a
section a case family (its figure and each point's latest value against the window), the
TTFT/TPOT families (serving points) last. Deterministic: the same history gives the same HTML.
"""

from __future__ import annotations

from collections import Counter
from html import escape
from pathlib import Path

from dsv4bench.history import figures
from dsv4bench.history.store import Entry
from dsv4bench.history.trend import Verdict

STYLE = """
body { font-family: sans-serif; margin: 1.5em; max-width: 1300px; }
table { border-collapse: collapse; font-size: 12px; margin: 0.5em 0 1.2em; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: left; }
.gate { padding: 0.7em 1em; font-size: 18px; font-weight: bold; border-radius: 4px; }
.gate.regression { background: #d62728; color: white; }
.gate.pass { background: #2ca02c; color: white; }
tr.regression td { background: #fde0e0; color: #8b0000; font-weight: bold; }
tr.slower td { background: #fff1e0; }
tr.faster td { background: #e6f4e6; }
img { max-width: 100%; border: 1px solid #eee; }
"""
SERVING = ("ttft/", "tpot/")


def gate_line(entry: Entry, verdicts: list[Verdict]) -> tuple[bool, str]:
    """(regressed, one line) for one gated entry."""
    bad = [v for v in verdicts if v.regression]
    kinds = Counter(v.kind for v in bad)
    if not bad:
        return False, f"no regression: {entry.id} against its comparable history"
    what = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    return True, f"REGRESSION: {entry.id}: {len(bad)} regressed ({what})"


def _banner(gated: list[Entry], verdicts: dict[str, list[Verdict]]) -> str:
    lines = [gate_line(e, verdicts[e.id]) for e in gated]
    cls = "regression" if any(bad for bad, _ in lines) else "pass"
    text = "<br>".join(escape(line) for _, line in lines)
    return f'<div id="gate" class="gate {cls}">{text}</div>'


def _table(head: list[str], rows: list[tuple[str, list[str]]], table_id: str) -> str:
    """rows: (css class, cells); cells are escaped here."""
    out = [
        f'<table id="{table_id}"><tr>' + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr>"
    ]
    for cls, cells in rows:
        tds = "".join(f"<td>{escape(c)}</td>" for c in cells)
        out.append(f'<tr class="{cls}">{tds}</tr>' if cls else f"<tr>{tds}</tr>")
    return "\n".join(out) + "</table>"


def _ratio(v: Verdict | None) -> str:
    return f"x{v.ratio:.3f}" if v and v.ratio else "-"


def _ms(x: float | None) -> str:
    return f"{x:.4g}" if x else "-"


def _entries_table(history: list[Entry], verdicts: dict[str, list[Verdict]]) -> str:
    rows = []
    for i, e in enumerate(history):
        n = sum(v.regression for v in verdicts[e.id])
        cells = [
            str(i),
            e.date,
            e.commit,
            e.device,
            e.host,
            e.build_key,
            e.label,
            ", ".join(e.scenarios),
            str(len(e.points)),
            str(n),
        ]
        rows.append(("regression" if n else "", cells))
    head = [
        "#",
        "date",
        "commit",
        "device",
        "host",
        "builds",
        "label",
        "scenarios",
        "points",
        "regressions",
    ]
    return _table(head, rows, "entries")


def _regressions_table(history: list[Entry], verdicts: dict[str, list[Verdict]]) -> str:
    rows = [
        ("regression", [e.id, v.key, v.kind, _ratio(v), v.detail])
        for e in reversed(history)
        for v in verdicts[e.id]
        if v.regression
    ]
    if not rows:
        return '<p id="regressions">No entry regressed against its window.</p>'
    return _table(["entry", "case · backend", "kind", "ratio", "detail"], rows, "regressions")


def _family_section(
    fam: str, png: Path, latest: Entry | None, verdicts: dict[str, list[Verdict]]
) -> str:
    parts = [
        f'<section class="family"><h3>{escape(fam)}</h3>',
        f'<img src="{png.name}" alt="trend of {escape(fam)}">',
    ]
    if latest is not None:
        judged = {v.key: v for v in verdicts[latest.id]}
        rows = []
        for p in (p for p in latest.points if p.family == fam):
            v = judged.get(p.key)
            cls = "regression" if v and v.regression else (v.kind if v else "")
            rows.append(
                (
                    cls,
                    [
                        p.key,
                        p.status,
                        _ms(p.median_ms),
                        _ratio(v),
                        v.kind if v else "-",
                        v.detail if v else "",
                    ],
                )
            )
        head = ["case · backend", "status", "median ms", "vs window", "verdict", "detail"]
        parts.append(_table(head, rows, f"latest-{figures.slug(fam)}"))
    return "\n".join(parts) + "</section>"


def write(
    history: list[Entry],
    verdicts: dict[str, list[Verdict]],
    out: Path,
    threshold: float,
    window: int,
    gated: list[Entry] | None = None,
    draw: bool = True,
    rule: str | None = None,
) -> Path:
    """index.html and the figures into `out`; returns index.html's path. `draw` False: the
    HTML alone (the figures' names as drawn), what CI compares with a committed page. `rule`:
    a paragraph on how the gated entries were judged, where not by the window (paired.py)."""
    out.mkdir(parents=True, exist_ok=True)
    if draw:
        for old in out.glob("trend-*.png"):
            old.unlink()
    pngs = figures.write_all(history, verdicts, out, draw=draw)
    body = [
        "<h1>dsv4bench trend</h1>",
        _banner(gated or history[-1:], verdicts),
        f"<p>{len(history)} entries. A point is judged against the same case and backend in "
        f"the last {window} entries of the same scenarios on the same device: time threshold "
        f"{threshold:g} "
        "(median and p10 both beyond it, and the p10 above every p10 of the window), status and "
        "accuracy in full (dsv4bench/history/trend.py).</p>",
        *([f'<p id="rule">{escape(rule)}</p>'] if rule else []),
        "<h2>Entries</h2>",
        _entries_table(history, verdicts),
        "<h2>Regressions</h2>",
        _regressions_table(history, verdicts),
    ]
    last_of = {p.family: e for e in history for p in e.points}  # the newest entry holding it
    kernel = [f for f in sorted(last_of) if not f.startswith(SERVING)]
    serving = [f for f in sorted(last_of) if f.startswith(SERVING)]
    body.append("<h2>Case families</h2>")
    body += [_family_section(f, pngs.get(f), last_of.get(f), verdicts) for f in kernel]
    body.append('<h2 id="serving">TTFT/TPOT curves</h2>')
    if not serving:
        body.append("<p>No serving points (TTFT/TPOT) in this history.</p>")
    body += [_family_section(f, pngs.get(f), last_of.get(f), verdicts) for f in serving]
    html = (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>dsv4bench trend</title>'
        f"<style>{STYLE}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )
    index = out / "index.html"
    index.write_text(html)
    return index
