"""Dot charts: the form a line figure takes when every series has one point.

One row per series, its label on the axis and its value written beside the marker; the value
runs along x, the single size the points share goes into the panel title. A series whose one
point failed is an x at the row's left end.
"""

from __future__ import annotations

from matplotlib.lines import Line2D
from matplotlib.transforms import blended_transform_factory

from dsv4bench.report.plots import axes as ax_
from dsv4bench.report.plots import canvas
from dsv4bench.report.plots.axes import percent
from dsv4bench.report.plots.style import FAILED_LABEL, PANEL_H, PANEL_W, colors_for

ROW_H = 0.28  # inches per series row
CHAR_W = 0.068  # inches per character of a row label (font.size 9)


def point_figure(title: str, panels, max_cols: int = 3, *, ncols=None, legend=None):
    """Panels (lines.Panel) whose series have at most one point each, as dot charts. Where
    every panel has the same rows, only the first column names them; the figure is as wide
    as its panels plus their row labels (long labels collapsed the panels to nothing)."""
    ncols = min(ncols or max_cols, max(len(panels), 1))
    nrows = -(-max(len(panels), 1) // ncols)
    rows = max((len(p.series) for p in panels), default=1)
    height = max(PANEL_H * 0.75, 1.3 + ROW_H * rows)
    labels = [_row_labels(p, bool(_at(p))) for p in panels]
    shared = len({tuple(lab) for lab in labels}) == 1
    label_w = CHAR_W * max((len(x) for lab in labels for x in lab), default=0)
    width = ncols * PANEL_W + label_w * (1 if shared else ncols)
    fig, axes = canvas.figure(nrows, ncols, title, width=width, panel_h=height)
    palette = colors_for(s.label for p in panels for s in p.series)
    handles: dict[str, object] = {}
    if legend:  # what colors and markers mean beyond the labels on the axis
        handles = {
            lab: Line2D([], [], **{"linestyle": "none", **style}) for lab, style in legend.items()
        }
    for i, (ax, panel) in enumerate(zip(axes, panels, strict=False)):
        _dot_panel(ax, panel, palette, handles)
        if shared and i % ncols:
            ax.tick_params(labelleft=False)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    canvas.shared_legend(fig, handles)
    return fig


def values_text(ys: list[float], fmt) -> str:
    """What a row writes beside its markers: each distinct value once, lowest first (several
    values written at their own markers overlapped), a range past three."""
    distinct = sorted(set(ys))
    if len(distinct) > 3:
        return f"{fmt(distinct[0])} .. {fmt(distinct[-1])} ({len(ys)} values)"
    return ", ".join(fmt(y) for y in distinct)


def _at(panel) -> str:
    """' at batch size 2' when every point of the panel shares one x, else ''."""
    xs = {x for s in panel.series for x in (*s.xs, *s.failed_xs)}
    if len(xs) != 1:
        return ""
    return f" at {panel.xlabel.split(' (')[0]} {ax_.plain(xs.pop())}"


STYLE_WORDS = {"-": "solid", "--": "dashed", ":": "dotted", "-.": "dash-dot"}


def _row_labels(panel, shared: bool) -> list[str]:
    """A row's label: the series', with its size where sizes differ, and with the line style
    it would have had where two series share a label (what told them apart as lines)."""
    labels = []
    for s in panel.series:
        x = next(iter([*s.xs, *s.failed_xs]), None)
        labels.append(
            s.label
            if shared or x is None
            else f"{s.label} ({panel.xlabel.split(' (')[0]} {ax_.plain(x)})"
        )
    shared_labels = {lab for lab in labels if labels.count(lab) > 1}
    return [
        f"{lab} ({STYLE_WORDS.get(s.linestyle, s.linestyle)} line)" if lab in shared_labels else lab
        for lab, s in zip(labels, panel.series, strict=True)
    ]


def _dot_panel(ax, panel, palette: dict, handles: dict) -> None:
    at = _at(panel)
    fmt = ax_.percent if panel.ypercent else ax_.plain
    ax.set_title(panel.title + at)
    ax.set_xlabel(panel.ylabel)
    ax.grid(axis="y", visible=False)
    if not panel.series:
        canvas.note(ax, panel.note or "no data")
        ax.set_yticks([])
        return
    labels = _row_labels(panel, bool(at))
    failed_at = blended_transform_factory(ax.transAxes, ax.transData)
    for i, s in enumerate(panel.series):
        color = s.color or palette[s.label]
        for y in s.ys:
            ax.plot([y], [i], linestyle="none", marker=s.marker, color=color, ms=6.5)
        if s.ys:  # one text a row, beside its rightmost marker
            ax.annotate(
                values_text(s.ys, percent if panel.ypercent else (lambda y: f"{y:.3g}")),
                (max(s.ys), i),
                xytext=(5, 0),
                textcoords="offset points",
                va="center",
                fontsize=8,
                color=color,
            )
        if s.failed_xs:
            ax.plot(
                [0.02],
                [i],
                marker="x",
                ms=8,
                mew=2,
                color=color,
                transform=failed_at,
                clip_on=False,
            )
            handles.setdefault(
                FAILED_LABEL.replace("at the bottom", "at the left"),
                Line2D([], [], linestyle="none", marker="x", mew=2, ms=8, color="0.3"),
            )
    for x, label, color in panel.hlines:
        handles.setdefault(label, ax.axvline(x, color=color, linestyle="--", lw=1.2))
    ax.set_yticks(range(len(labels)), labels)
    ax.set_ylim(len(labels) - 0.5, -0.5)  # the first series on top
    values = panel.ys + [x for x, _, _ in panel.hlines]
    logx = panel.logy if panel.logy is not None else ax_.spans(values, 20)
    if logx:
        ax.set_xscale("log")
        lo, hi = ax.get_xlim()
        ax.set_xlim(lo, hi * 1.6)  # room for the written values
        ax_.format_log_x(ax, fmt)
    else:
        ax_.linear_values(ax.xaxis, ax.set_xlim, values, fmt)
        lo, hi = ax.get_xlim()
        ax.set_xlim(lo, hi + 0.12 * (hi - lo))
