"""Strip plots per category on a log axis: accuracy per case family and backend."""

from __future__ import annotations

import math
from dataclasses import dataclass

from matplotlib.lines import Line2D
from matplotlib.transforms import blended_transform_factory

from dsv4bench.report.plots import axes as ax_
from dsv4bench.report.plots import canvas
from dsv4bench.report.plots.style import MARKERS, PANEL_W, colors_for, plt


@dataclass
class CatPoint:
    """One value in a category plot (accuracy): `bad` draws a red ring around it."""

    category: str
    series: str
    value: float | None
    bad: bool = False


def _category_series(ax, s: str, i: int, points, cats, offsets, slot, color, floor, handles):
    """One series' points on a category panel: values, exact zeros on the floor, non-finite
    ones at the top edge, and rings on those beyond tolerance."""
    pts = sorted(
        (p for p in points if p.series == s and p.value is not None),
        key=lambda p: (p.category, p.value),
    )
    if not pts:
        return
    col, mk = color, MARKERS[i % len(MARKERS)]
    xs, rank = [], {}
    for p in pts:  # spread a column's points a little so that counts stay visible
        j = rank.get(p.category, 0)
        rank[p.category] = j + 1
        xs.append(cats.index(p.category) + offsets[s] + ((j % 5) - 2) * slot * 0.12)
    normal = [(x, p.value) for x, p in zip(xs, pts, strict=True) if 0 < p.value < math.inf]
    exact = [x for x, p in zip(xs, pts, strict=True) if p.value <= 0]
    nonfinite = [x for x, p in zip(xs, pts, strict=True) if not math.isfinite(p.value)]
    if normal:
        h = ax.scatter(
            [x for x, _ in normal],
            [y for _, y in normal],
            color=col,
            marker=mk,
            s=22,
            alpha=0.85,
            zorder=3,
        )
        handles.setdefault(s, h)
    if exact:
        h = ax.scatter(
            exact,
            [floor] * len(exact),
            facecolors="none",
            edgecolors=col,
            marker=mk,
            s=22,
            zorder=3,
        )
        handles.setdefault(s, h)
        handles.setdefault(
            "exact (0): hollow, on the bottom line",
            Line2D([], [], linestyle="none", marker="o", mfc="none", color="0.3"),
        )
    if nonfinite:
        trans = blended_transform_factory(ax.transData, ax.transAxes)
        ax.plot(
            nonfinite,
            [0.97] * len(nonfinite),
            "x",
            color=col,
            mew=2,
            ms=8,
            transform=trans,
            clip_on=False,
        )
        handles.setdefault(
            "non-finite: x at the top",
            Line2D([], [], linestyle="none", marker="x", mew=2, color="0.3"),
        )
    _rings(ax, xs, pts, floor, handles)


def _rings(ax, xs: list, pts: list, floor: float, handles: dict) -> None:
    """Red rings on the finite points beyond tolerance."""
    bad = [
        (x, min(max(p.value, floor), 1e300))
        for x, p in zip(xs, pts, strict=True)
        if p.bad and math.isfinite(p.value)
    ]
    if bad:
        ax.scatter(
            [b[0] for b in bad],
            [b[1] for b in bad],
            s=90,
            facecolors="none",
            edgecolors="#d62728",
            linewidths=1.5,
            zorder=4,
        )
        handles.setdefault(
            "beyond tolerance",
            Line2D(
                [],
                [],
                linestyle="none",
                marker="o",
                ms=9,
                mfc="none",
                mec="#d62728",
                mew=1.5,
            ),
        )


def category_figure(
    title: str,
    panels: list[tuple[str, str, list[CatPoint]]],
    tolerances: list[dict[str, float]],
):
    """Strip plots on a log y axis, one column of points per category and series; a short
    dashed segment per category marks its tolerance. panels: (panel title, y label, points);
    tolerances: per panel, {category: tolerance}. Exact values (0) sit on a floor a decade
    below the smallest value, hollow; non-finite ones are an x at the top edge."""
    cats = sorted({p.category for _, _, pts in panels for p in pts})
    series = sorted({p.series for _, _, pts in panels for p in pts})
    width = max(PANEL_W * 1.5, min(22.0, 2.4 + 1.1 * len(cats) * max(1, len(series)) ** 0.5))
    rotate = len(cats) > 3 or max((len(c) for c in cats), default=0) * len(cats) > 90
    label_h = 0.075 * max((len(c) for c in cats), default=4) if rotate else 0.3
    fig, axes = plt.subplots(
        len(panels),
        1,
        figsize=(width, 2.9 * len(panels) + 0.6 + label_h),
        squeeze=False,
        sharex=True,
        layout="constrained",
    )
    axes = [row[0] for row in axes]
    fig.suptitle(title, fontsize=12, fontweight="bold")
    palette = colors_for(series)
    handles: dict[str, object] = {}
    n = max(1, len(series))
    slot = min(0.8 / n, 0.25)
    offsets = {s: (i - (n - 1) / 2) * slot for i, s in enumerate(series)}
    for ax, (ptitle, ylabel, points), tol in zip(axes, panels, tolerances, strict=True):
        ax.set_yscale("log")
        finite = [p.value for p in points if p.value is not None and 0 < p.value < math.inf]
        finite += [v for v in tol.values() if v]
        floor = 10 ** (math.floor(math.log10(min(finite))) - 1) if finite else 1e-12
        for i, s in enumerate(series):
            args = (points, cats, offsets, slot, palette[s], floor, handles)
            _category_series(ax, s, i, *args)
        for cat, value in tol.items():
            if cat in cats and value:
                i = cats.index(cat)
                h = ax.hlines(
                    value, i - 0.45, i + 0.45, colors="#d62728", linestyles="--", lw=1.3, zorder=2
                )
                handles.setdefault("tolerance", h)
        ax.set_xlim(-0.6, len(cats) - 0.4)
        lo, hi = ax.get_ylim()
        ax.set_ylim(min(lo, floor / 1.6), hi)
        ax_.format_log_y(ax)
        ax.set_title(ptitle)
        ax.set_ylabel(ylabel)
        ax.grid(axis="x", visible=False)
        for k in range(1, len(cats)):
            ax.axvline(k - 0.5, color="0.85", lw=0.8)
        if not any(p.value is not None for p in points):
            canvas.note(ax, "no values")
    axes[-1].set_xticks(
        range(len(cats)), cats, rotation=20 if rotate else 0, ha="right" if rotate else "center"
    )
    canvas.shared_legend(fig, handles, max_cols=6)
    return fig
