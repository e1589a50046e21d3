"""Line panels: series of (x, y) points against a size axis, one shared legend.

A figure whose every series has a single point has no line to draw: it becomes a dot chart
(points.py), one labelled row per series with its value written beside it.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from matplotlib.lines import Line2D
from matplotlib.transforms import blended_transform_factory

from dsv4bench.report.plots import axes as ax_
from dsv4bench.report.plots import canvas
from dsv4bench.report.plots.style import FAILED_LABEL, REPEATED_LABEL, colors_for


@dataclass
class Series:
    """One line: points at (xs, ys); `failed_xs` are x values whose point has no value."""

    label: str
    xs: list[float]
    ys: list[float]
    failed_xs: list[float] = field(default_factory=list)
    color: str | None = None
    marker: str = "o"
    linestyle: str = "-"

    @property
    def single(self) -> bool:
        """At most one x value (measured or failed): nothing to draw a line through."""
        return len({*self.xs, *self.failed_xs}) <= 1


@dataclass
class Panel:
    title: str
    xlabel: str
    ylabel: str
    series: list[Series]
    logx: bool | None = None  # None: log (base 2) when x spans 8x or more
    logy: bool | None = None  # None: log when y spans 20x or more
    ypercent: bool = False  # y values are fractions shown as %
    hlines: list[tuple[float, str, str]] = field(default_factory=list)  # (y, label, color)
    note: str = ""  # shown in the panel when it has no series

    @property
    def ys(self) -> list[float]:
        return [y for s in self.series for y in s.ys]


def is_point_figure(panels: list[Panel]) -> bool:
    """Every series of every panel has a single point (and there is at least one)."""
    series = [s for p in panels for s in p.series]
    return bool(series) and all(s.single for s in series)


def line_figure(
    title: str,
    panels: list[Panel],
    max_cols: int = 3,
    *,
    ncols: int | None = None,
    panel_w: float | None = None,
    sharey: bool = False,
    legend: dict[str, dict] | None = None,
):
    """Panels of lines sharing one legend below them; failed points as x at each panel's
    bottom edge in the series' color; a point measured twice at one x is drawn hollow, the line
    taking the lower median, so no line runs up and down one x.

    ncols: panels per row (default: up to max_cols); sharey: one y axis per row of panels (log
    when any panel asks for it or the values together span 20x), tick labels on the left only;
    legend: {label: Line2D style} to show instead of one entry per series label (when color
    and line style encode two different things). One-point series everywhere: a dot chart."""
    if is_point_figure(panels):
        from dsv4bench.report.plots.points import point_figure

        return point_figure(title, panels, max_cols, ncols=ncols, legend=legend)
    if ncols:
        nrows = math.ceil(max(len(panels), 1) / ncols)
    else:
        nrows, ncols = canvas.grid(len(panels), max_cols)
    fig, axes = canvas.figure(nrows, ncols, title, panel_w=panel_w, sharey=sharey)
    palette = colors_for(s.label for p in panels for s in p.series)
    handles: dict[str, object] = {}
    if legend:
        handles = {lab: Line2D([], [], **style) for lab, style in legend.items()}
    marks: dict[str, object] = {}  # failed and repeated points: legend entries at the end
    shared_logy = any(p.logy for p in panels) or (
        all(p.logy is None for p in panels) and ax_.spans([y for p in panels for y in p.ys], 20)
    )
    for k, (ax, panel) in enumerate(zip(axes, panels, strict=False)):
        if sharey:
            logy = shared_logy
            row = panels[k - k % ncols : k - k % ncols + ncols]
            limit_ys = [y for p in row for y in p.ys]
        else:
            logy = panel.logy if panel.logy is not None else ax_.spans(panel.ys, 20)
            limit_ys = panel.ys
        _draw_panel(ax, panel, palette, handles, marks, own_legend=not legend)
        _value_axis(ax, panel, logy, limit_ys)
        if not sharey or k % ncols == 0:
            ax.set_ylabel(panel.ylabel)
    # log tick labels once every panel's data is in (a shared axis takes all rows' limits)
    for ax, panel in zip(axes, panels, strict=False):
        if ax.get_yscale() == "log":
            ax_.format_log_y(ax, ax_.percent if panel.ypercent else ax_.plain)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    canvas.shared_legend(fig, {**handles, **marks})
    return fig


def _draw_panel(ax, panel: Panel, palette: dict, handles: dict, marks: dict, own_legend: bool):
    ax_.setup_x(ax, [x for s in panel.series for x in (*s.xs, *s.failed_xs)], panel.logx)
    failing = 0  # series with failed points so far: each gets its own row of x marks
    for s in panel.series:
        color = s.color or palette[s.label]
        line = _draw_series(ax, s, color, marks)
        if own_legend:
            handles.setdefault(s.label, line)
        if s.failed_xs:
            failed_marks(ax, s.failed_xs, color, failing)
            marks.setdefault(FAILED_LABEL, legend_x())
            failing += 1
    for y, label, color in panel.hlines:
        handles.setdefault(label, ax.axhline(y, color=color, linestyle="--", lw=1.2))
    if not panel.series:
        canvas.note(ax, panel.note or "no data")
    ax.set_title(panel.title)
    ax.set_xlabel(panel.xlabel)


def _draw_series(ax, s: Series, color: str, marks: dict):
    """The line through one value per x (the lower median where an x repeats) and hollow
    markers for the other values at a repeated x; returns the line (a legend handle)."""
    by_x: dict[float, list[float]] = {}
    for x, y in zip(s.xs, s.ys, strict=True):
        by_x.setdefault(x, []).append(y)
    xs = sorted(by_x)
    ys = [statistics.median_low(by_x[x]) for x in xs]
    (line,) = ax.plot(xs, ys, marker=s.marker, linestyle=s.linestyle, color=color, ms=4.5, lw=1.4)
    extra = [(x, y) for x in xs for y in _without(by_x[x], statistics.median_low(by_x[x]))]
    if extra:
        ax.plot(
            [x for x, _ in extra],
            [y for _, y in extra],
            linestyle="none",
            marker=s.marker,
            mfc="none",
            color=color,
            ms=5.5,
        )
        marks.setdefault(
            REPEATED_LABEL, Line2D([], [], linestyle="none", marker="o", mfc="none", color="0.3")
        )
    return line


def _without(values: list[float], one: float) -> list[float]:
    rest = list(values)
    rest.remove(one)
    return rest


def failed_marks(ax, xs: list[float], color: str, row: int) -> None:
    """x marks at the panel's bottom edge (axes coordinates), one row per failing series."""
    trans = blended_transform_factory(ax.transData, ax.transAxes)
    ax.plot(
        xs,
        [0.03 + 0.035 * (row % 4)] * len(xs),
        linestyle="none",
        marker="x",
        ms=8,
        mew=2,
        color=color,
        transform=trans,
        clip_on=False,
    )


def legend_x() -> Line2D:
    return Line2D([], [], linestyle="none", marker="x", mew=2, ms=8, color="0.3")


def _value_axis(ax, panel: Panel, logy: bool, limit_ys: list[float]) -> None:
    if logy:
        ax.set_yscale("log")  # tick labels once all panels are drawn (format_log_y)
        return
    fmt = ax_.percent if panel.ypercent else ax_.plain
    values = [*limit_ys, *(y for y, _, _ in panel.hlines)]
    ax_.linear_values(ax.yaxis, ax.set_ylim, values, fmt)
