"""Figures for reports: plain data in (series, points, lines), one PNG out.

Matplotlib runs headless (Agg). Output is deterministic for the same input: fixed figure sizes
and dpi, no software/date metadata in the PNG, colors assigned from sorted labels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FuncFormatter, NullFormatter  # noqa: E402
from matplotlib.transforms import blended_transform_factory  # noqa: E402

DPI = 100
PANEL_W, PANEL_H = 5.6, 3.9  # inches per subplot
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")
LINESTYLES = ("-", "--", ":", "-.")
STATUS_ORDER = ("ok", "incorrect", "unsupported", "timeout", "oom", "crash", "error")
STATUS_COLORS = {
    "ok": "#2ca02c",
    "incorrect": "#ff7f0e",
    "unsupported": "#9e9e9e",
    "timeout": "#8c564b",
    "oom": "#9467bd",
    "crash": "#d62728",
    "error": "#e377c2",
}
STATUS_MARKERS = {
    "ok": "o",
    "incorrect": "D",
    "unsupported": "s",
    "timeout": "v",
    "oom": "P",
    "crash": "X",
    "error": "*",
}
FAILED_LABEL = "failed point (x at the bottom; see table)"
PAD_INCHES = 0.12
LEGEND_MAX_COLS = 6

plt.rcParams.update(
    {
        "font.size": 9,
        "axes.titlesize": 10,
        "axes.labelsize": 9,
        "legend.fontsize": 8,
        "axes.grid": True,
        "grid.alpha": 0.3,
        "grid.linewidth": 0.6,
    }
)


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


def colors_for(labels) -> dict[str, str]:
    """A stable color per distinct label (sorted), cycling the palette."""
    return {lab: PALETTE[i % len(PALETTE)] for i, lab in enumerate(sorted(set(labels)))}


def save(fig, path: Path) -> Path:
    """Write the PNG; the bounding box grows or shrinks to what was drawn (a legend, long tick
    labels), so nothing is cut at the edges."""
    fig.savefig(
        path, dpi=DPI, metadata={"Software": None}, bbox_inches="tight", pad_inches=PAD_INCHES
    )
    plt.close(fig)
    return path


def _spans(values, factor: float) -> bool:
    pos = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    return bool(pos) and max(pos) / min(pos) >= factor


def _plain(v, _pos=None) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1e6 or abs(v) < 1e-3:
        return f"{v:.0e}"
    return f"{v:g}"


def _percent(v, _pos=None) -> str:
    return f"{100 * v:.3g}%"


def _format_log_y(ax, fmt=_plain) -> None:
    """Label decades; over less than ~2.5 decades also the 2x and 5x minor ticks."""
    lo, hi = ax.get_ylim()
    ax.yaxis.set_major_formatter(FuncFormatter(fmt))
    if lo > 0 and hi / lo < 400:

        def minor(v, _pos=None):
            mantissa = round(v / 10 ** math.floor(math.log10(v)), 6)
            return fmt(v) if mantissa in (2, 5) else ""

        ax.yaxis.set_minor_formatter(FuncFormatter(minor))
    else:
        ax.yaxis.set_minor_formatter(NullFormatter())


def _setup_x(ax, xs, logx) -> None:
    if logx is None:
        logx = _spans(xs, 8)
    if logx:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(_plain))
        ax.xaxis.set_minor_formatter(NullFormatter())


def _grid(n: int, max_cols: int = 3) -> tuple[int, int]:
    ncols = max(1, min(n, max_cols))
    return math.ceil(max(n, 1) / ncols), ncols


def _figure(nrows: int, ncols: int, title: str, width=None, panel_w=None, sharey=False):
    w = width or (panel_w or PANEL_W) * ncols
    fig, axes = plt.subplots(
        nrows,
        ncols,
        figsize=(w, PANEL_H * nrows + 0.4),
        squeeze=False,
        sharey="row" if sharey else False,
        layout="constrained",
    )
    fig.suptitle(title, fontsize=12, fontweight="bold")
    return fig, [ax for row in axes for ax in row]


def _shared_legend(fig, handles: dict[str, object], max_cols: int = LEGEND_MAX_COLS) -> None:
    """One legend below the panels, as many columns as fit the figure's width (measured, not
    guessed), rows balanced; the figure grows by the legend's height so the panels keep theirs,
    and widens where a single entry is wider than it."""
    if not handles:
        return
    renderer = fig.canvas.get_renderer()
    width = fig.get_figwidth() * fig.dpi

    def place(ncols):
        return fig.legend(
            list(handles.values()),
            list(handles.keys()),
            loc="outside lower center",
            ncols=ncols,
            frameon=False,
        )

    n = len(handles)
    ncols = max(1, min(max_cols, n))
    while True:
        legend = place(ncols)
        box = legend.get_window_extent(renderer)
        if box.width <= 0.97 * width or ncols == 1:
            break
        legend.remove()
        ncols -= 1
    balanced = math.ceil(n / math.ceil(n / ncols))
    if balanced != ncols:
        legend.remove()
        legend = place(balanced)
        box = legend.get_window_extent(renderer)
    w_in, h_in = fig.get_size_inches()
    fig.set_size_inches(max(w_in, box.width / fig.dpi + 0.3), h_in + box.height / fig.dpi + 0.1)


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
    bottom edge in the series' color.

    ncols: panels per row (default: up to max_cols); sharey: one y axis per row of panels (log
    when any panel asks for it or the values together span 20x), tick labels on the left only;
    legend: {label: Line2D style} to show instead of one entry per series label (when color
    and line style encode two different things)."""
    if ncols:
        nrows = math.ceil(max(len(panels), 1) / ncols)
    else:
        nrows, ncols = _grid(len(panels), max_cols)
    labels = [s.label for p in panels for s in p.series]
    fig, axes = _figure(nrows, ncols, title, panel_w=panel_w, sharey=sharey)
    palette = colors_for(labels)
    handles: dict[str, object] = {}
    if legend:
        handles = {lab: Line2D([], [], **style) for lab, style in legend.items()}
    any_failed = False
    all_ys = [y for p in panels for s in p.series for y in s.ys]
    shared_logy = any(p.logy for p in panels) or (
        all(p.logy is None for p in panels) and _spans(all_ys, 20)
    )
    for k, (ax, panel) in enumerate(zip(axes, panels, strict=False)):
        failing = 0  # series with failed points so far: each gets its own row of x marks
        xs_all = [x for s in panel.series for x in (*s.xs, *s.failed_xs)]
        ys_all = [y for s in panel.series for y in s.ys]
        _setup_x(ax, xs_all, panel.logx)
        if sharey:
            logy = shared_logy
        else:
            logy = panel.logy if panel.logy is not None else _spans(ys_all, 20)
        for s in panel.series:
            color = s.color or palette[s.label]
            (line,) = ax.plot(
                s.xs, s.ys, marker=s.marker, linestyle=s.linestyle, color=color, ms=4.5, lw=1.4
            )
            if not legend:
                handles.setdefault(s.label, line)
            if s.failed_xs:
                any_failed = True
                trans = blended_transform_factory(ax.transData, ax.transAxes)
                ax.plot(
                    s.failed_xs,
                    [0.03 + 0.035 * (failing % 4)] * len(s.failed_xs),
                    linestyle="none",
                    marker="x",
                    ms=8,
                    mew=2,
                    color=color,
                    transform=trans,
                    clip_on=False,
                )
                failing += 1
        for y, label, color in panel.hlines:
            h = ax.axhline(y, color=color, linestyle="--", lw=1.2)
            handles.setdefault(label, h)
        fmt = _percent if panel.ypercent else _plain
        if logy:
            ax.set_yscale("log")
        elif panel.ypercent:
            ax.yaxis.set_major_formatter(FuncFormatter(fmt))
        if not panel.series:
            ax.text(
                0.5,
                0.5,
                panel.note or "no data",
                ha="center",
                va="center",
                transform=ax.transAxes,
                color="0.4",
            )
        ax.set_title(panel.title)
        ax.set_xlabel(panel.xlabel)
        if not sharey or k % ncols == 0:
            ax.set_ylabel(panel.ylabel)
    # log tick labels once every panel's data is in (a shared axis takes all rows' limits)
    for ax, panel in zip(axes, panels, strict=False):
        if ax.get_yscale() == "log":
            _format_log_y(ax, _percent if panel.ypercent else _plain)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    if any_failed:
        handles[FAILED_LABEL] = Line2D(
            [], [], linestyle="none", marker="x", mew=2, ms=8, color="0.3"
        )
    _shared_legend(fig, handles)
    return fig


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
        _format_log_y(ax)
        ax.set_title(ptitle)
        ax.set_ylabel(ylabel)
        ax.grid(axis="x", visible=False)
        for k in range(1, len(cats)):
            ax.axvline(k - 0.5, color="0.85", lw=0.8)
        if not any(p.value is not None for p in points):
            ax.text(
                0.5, 0.5, "no values", ha="center", va="center", transform=ax.transAxes, color="0.4"
            )
    axes[-1].set_xticks(
        range(len(cats)), cats, rotation=20 if rotate else 0, ha="right" if rotate else "center"
    )
    _shared_legend(fig, handles, max_cols=6)
    return fig


@dataclass
class StatusPoint:
    lane: str
    x: float
    status: str


@dataclass
class Marker:
    """A vertical line across all lanes (lane None) or a tick on one lane."""

    x: float
    label: str
    color: str
    lane: str | None = None
    style: str = "--"


@dataclass
class Span:
    """A shaded x range on one lane."""

    lane: str
    x0: float
    x1: float
    label: str
    color: str


def status_figure(
    title: str,
    points: list[StatusPoint],
    markers: list[Marker],
    xlabel: str,
    zoom: tuple[float, float] | None,
    spans: list[Span] = (),
):
    """Status of each probed x per lane (backend/model), with thresholds as vertical lines;
    a second, linear panel zooms into `zoom` where the thresholds sit close together."""
    lanes = sorted(
        {p.lane for p in points} | {m.lane for m in markers if m.lane} | {sp.lane for sp in spans}
    )
    ncols = 2 if zoom else 1
    height = max(2.6, 1.2 + 0.55 * len(lanes)) + 0.6
    fig, axes = plt.subplots(
        1, ncols, figsize=(PANEL_W * 1.25 * ncols, height), squeeze=False, layout="constrained"
    )
    axes = list(axes[0])
    fig.suptitle(title, fontsize=12, fontweight="bold")
    handles: dict[str, object] = {}
    statuses = [s for s in STATUS_ORDER if any(p.status == s for p in points)]
    statuses += sorted({p.status for p in points} - set(STATUS_ORDER))
    for k, ax in enumerate(axes):
        is_zoom = k == 1
        for st in statuses:
            pts = [p for p in points if p.status == st]
            if is_zoom:
                pts = [p for p in pts if zoom[0] <= p.x <= zoom[1]]
            if not pts:
                continue
            h = ax.scatter(
                [p.x for p in pts],
                [lanes.index(p.lane) for p in pts],
                color=STATUS_COLORS.get(st, "0.2"),
                marker=STATUS_MARKERS.get(st, "o"),
                s=40,
                zorder=3,
                edgecolors="white",
                linewidths=0.4,
            )
            handles.setdefault(st, h)
        for m in markers:
            if is_zoom and not zoom[0] <= m.x <= zoom[1]:
                continue
            if m.lane is None:
                h = ax.axvline(m.x, color=m.color, linestyle=m.style, lw=1.4, zorder=2)
            else:
                y = lanes.index(m.lane)
                h = ax.vlines(
                    m.x, y - 0.38, y + 0.38, colors=m.color, linestyles=m.style, lw=2.2, zorder=2
                )
            handles.setdefault(m.label, h)
        for sp in spans:
            y = lanes.index(sp.lane)
            h = ax.fill_between(
                [sp.x0, sp.x1], y - 0.3, y + 0.3, color=sp.color, alpha=0.18, linewidth=0, zorder=1
            )
            handles.setdefault(sp.label, h)
        ax.set_yticks(range(len(lanes)), lanes)
        ax.set_ylim(len(lanes) - 0.3, -0.7)  # first lane on top
        ax.grid(axis="y", visible=False)
        if is_zoom:
            ax.set_xlim(*zoom)
            ax.set_title(f"zoom: {zoom[0]:g} to {zoom[1]:g} (linear)")
            ax.tick_params(axis="y", labelleft=False)
            ax.xaxis.set_major_formatter(FuncFormatter(_plain))
        else:
            xs = [p.x for p in points] + [m.x for m in markers]
            _setup_x(ax, xs, None)
            ax.set_title("all probed sizes")
        ax.set_xlabel(xlabel)
    _shared_legend(fig, handles, max_cols=3)
    return fig


def bar_ratio_figure(
    title: str,
    labels: list[str],
    ratios: list[float],
    colors: list[str],
    threshold: float,
    legend: dict[str, str],
):
    """Horizontal bars of new/base time ratios, first label on top; lines at 1 and 1+threshold."""
    n = len(labels)
    fig, ax = plt.subplots(figsize=(10.5, 1.0 + 0.26 * max(n, 3)), layout="constrained")
    fig.suptitle(title, fontsize=12, fontweight="bold")
    ys = list(range(n))[::-1]
    ax.barh(ys, [r - 1 for r in ratios], left=1, color=colors, height=0.7)
    ax.set_yticks(ys, labels, fontsize=7)
    ax.axvline(1.0, color="0.2", lw=1)
    ax.axvline(1 + threshold, color="#d62728", linestyle="--", lw=1.2)
    for y, r in zip(ys, ratios, strict=True):
        ax.text(
            r,
            y,
            f" {r:.3f}" if r >= 1 else f"{r:.3f} ",
            va="center",
            ha="left" if r >= 1 else "right",
            fontsize=7,
        )
    lo, hi = min([*ratios, 1.0]), max([*ratios, 1 + threshold])
    pad = (hi - lo) * 0.12 + 0.02
    ax.set_xlim(lo - pad, hi + pad)
    ax.set_ylim(-0.7, n - 0.3)
    ax.set_xlabel("median time ratio new / base (> 1: slower)")
    ax.grid(axis="y", visible=False)
    handles = {lab: plt.Rectangle((0, 0), 1, 1, color=c) for lab, c in legend.items()}
    handles[f"threshold 1 + {threshold:g}"] = Line2D([], [], color="#d62728", linestyle="--")
    _shared_legend(fig, handles, max_cols=4)
    return fig
