"""Status lanes: which sizes ran and which failed, per backend and model, with thresholds."""

from __future__ import annotations

from dataclasses import dataclass

from matplotlib.ticker import FuncFormatter

from dsv4bench.report.plots import axes as ax_
from dsv4bench.report.plots import canvas
from dsv4bench.report.plots.style import (
    PANEL_W,
    STATUS_COLORS,
    STATUS_MARKERS,
    STATUS_ORDER,
    plt,
)


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
            ax.xaxis.set_major_formatter(FuncFormatter(ax_.plain))
        else:
            xs = [p.x for p in points] + [m.x for m in markers]
            ax_.setup_x(ax, xs, None)
            ax.set_title("all probed sizes")
        ax.set_xlabel(xlabel)
    canvas.shared_legend(fig, handles, max_cols=3)
    return fig
