"""Trend figures: one PNG a case family, a column of panels a backend, time (median, log
scale) above and error (cos_diff against the oracle) below, over the entries of the history.
A regressed point is a red cross with its ratio beside it; an answer the judge refused, a red
cross on the error panel."""

from __future__ import annotations

import io
import re
from collections import defaultdict
from pathlib import Path

from matplotlib.ticker import FormatStrFormatter
from PIL import Image

from dsv4bench.history.store import Entry
from dsv4bench.history.trend import Verdict
from dsv4bench.report.plots import canvas
from dsv4bench.report.plots.style import colors_for, plt

RED = "#d62728"
MAX_LINES = 12  # cases drawn a panel; the table lists them all
DPI = 72  # small PNGs: a committed history's page stays well under 1 MiB
COLORS = 48


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-").lower()


def case_label(key: str) -> str:
    """A point's key without its backend, the case id's digest cut to 4 digits (two cases
    may differ only in a param the id's words leave out, e.g. s_q)."""
    case = key.split(" · ")[0]
    return re.sub(r"-([0-9a-f]{4})[0-9a-f]{6}\b", r" #\1", case)


def families(history: list[Entry]) -> dict[str, list[str]]:
    """family -> its backends with something to draw (a time or an error), sorted; a family
    of unsupported rows alone has no figure (its page section lists the rows)."""
    found: dict[str, set[str]] = defaultdict(set)
    for e in history:
        for p in e.points:
            if p.median_ms or p.cos_diff is not None:
                found[p.family].add(p.backend)
    return {f: sorted(b) for f, b in sorted(found.items())}


def figure(
    history: list[Entry],
    fam: str,
    backends: list[str],
    verdicts: dict[str, list[Verdict]],
    out: Path,
) -> Path:
    """The family's trend PNG, written into `out`."""
    fig, axes = canvas.figure(
        2, len(backends), f"{fam}: time and error over the history", panel_w=4.6, panel_h=2.6
    )
    ticks = [f"{i}\n{e.date[5:10]}\n{e.commit[:7]}" for i, e in enumerate(history)]
    for col, backend in enumerate(backends):
        time_ax, err_ax = axes[col], axes[len(backends) + col]
        series = _series(history, fam, backend, verdicts)
        colors = colors_for(sorted(series))
        for label in sorted(series)[:MAX_LINES]:
            _draw(time_ax, err_ax, series[label], colors[label], label)
        time_ax.set_title(f"{backend}: median ms", fontsize=9)
        err_ax.set_title(f"{backend}: cos_diff vs oracle", fontsize=9)
        for ax in (time_ax, err_ax):
            ax.set_xticks(range(len(history)), ticks, fontsize=6)
            ax.set_xlim(-0.5, len(history) - 0.5)
        if any(t for s in series.values() for _, t, _, _ in s):
            time_ax.set_yscale("log")
            time_ax.yaxis.set_major_formatter(FormatStrFormatter("%.3g"))
            time_ax.yaxis.set_minor_formatter(FormatStrFormatter("%.3g"))
            time_ax.tick_params(axis="y", which="both", labelsize=6)
        else:
            canvas.note(time_ax, "no timing (the oracle judges, or no row ran)")
        if any(y for s in series.values() for _, _, y, _ in s):
            err_ax.set_yscale("symlog", linthresh=1e-7)
        else:
            canvas.note(err_ax, "no accuracy (reference rows, or serving sums)")
        if len(series) > MAX_LINES:
            time_ax.text(
                0.01,
                0.98,
                f"{MAX_LINES} of {len(series)} cases",
                transform=time_ax.transAxes,
                fontsize=6,
                va="top",
            )
        time_ax.legend(fontsize=5, loc="lower left", ncols=2)
    return _save(fig, out / f"trend-{slug(fam)}.png")


def _save(fig, path: Path) -> Path:
    """The PNG with a palette of at most COLORS colors: a third of the bytes, same picture."""
    buf = io.BytesIO()
    fig.savefig(buf, dpi=DPI, format="png", bbox_inches="tight", pad_inches=0.1)
    plt.close(fig)
    image = Image.open(buf).convert("RGB").quantize(colors=COLORS, method=Image.Quantize.MEDIANCUT)
    image.save(path, format="PNG", optimize=True)
    return path


def _series(history, fam, backend, verdicts) -> dict[str, list[tuple]]:
    """case label -> [(x, median_ms, cos_diff, verdict)] of the family's points on backend."""
    out: dict[str, list[tuple]] = defaultdict(list)
    for x, e in enumerate(history):
        judged = {v.key: v for v in verdicts.get(e.id, [])}
        for p in e.points:
            if p.family == fam and p.backend == backend:
                out[case_label(p.key)].append((x, p.median_ms, p.cos_diff, judged.get(p.key)))
    return out


def _draw(time_ax, err_ax, points, color, label) -> None:
    xs = [x for x, t, _, _ in points if t]
    time_ax.plot(
        xs, [t for _, t, _, _ in points if t], marker="o", ms=3, lw=1, color=color, label=label
    )
    errs = [(x, c) for x, _, c, _ in points if c is not None]
    if errs:
        err_ax.plot([x for x, _ in errs], [c for _, c in errs], marker="o", ms=3, lw=1, color=color)
    for x, t, c, v in points:
        if v is None or not v.regression:
            continue
        if v.kind == "accuracy" and c is not None:
            err_ax.scatter([x], [c], marker="X", s=70, color=RED, zorder=5)
        elif t:
            time_ax.scatter([x], [t], marker="X", s=70, color=RED, zorder=5)
            if v.ratio:
                time_ax.annotate(
                    f"x{v.ratio:.2f}",
                    (x, t),
                    fontsize=6,
                    color=RED,
                    xytext=(4, 2),
                    textcoords="offset points",
                )


def write_all(
    history: list[Entry], verdicts: dict[str, list[Verdict]], out: Path, *, draw: bool = True
) -> dict[str, Path]:
    """family -> its PNG, every family of the history; `draw` False: the names alone."""
    out.mkdir(parents=True, exist_ok=True)
    if not draw:
        return {fam: out / f"trend-{slug(fam)}.png" for fam in families(history)}
    return {fam: figure(history, fam, b, verdicts, out) for fam, b in families(history).items()}
