"""Figures as a whole: the grid of panels, the one legend below them, writing the PNG."""

from __future__ import annotations

import math
from pathlib import Path

from dsv4bench.report.plots.style import DPI, NOTE_COLOR, PANEL_H, PANEL_W, plt

PAD_INCHES = 0.12
LEGEND_MAX_COLS = 6


def grid(n: int, max_cols: int = 3) -> tuple[int, int]:
    """(rows, columns) for n panels, at most max_cols per row."""
    ncols = max(1, min(n, max_cols))
    return math.ceil(max(n, 1) / ncols), ncols


def figure(
    nrows: int,
    ncols: int,
    title: str,
    width=None,
    panel_w=None,
    sharey=False,
    panel_h: float = PANEL_H,
):
    """A titled figure of nrows x ncols panels; returns (fig, axes as one flat list)."""
    w = width or (panel_w or PANEL_W) * ncols
    fig, axes = plt.subplots(
        nrows,
        ncols,
        figsize=(w, panel_h * nrows + 0.4),
        squeeze=False,
        sharey="row" if sharey else False,
        layout="constrained",
    )
    fig.suptitle(title, fontsize=12, fontweight="bold")
    return fig, [ax for row in axes for ax in row]


def shared_legend(fig, handles: dict[str, object], max_cols: int = LEGEND_MAX_COLS) -> None:
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


def note(ax, text: str) -> None:
    """Grey text in the middle of a panel that has nothing to draw, saying why."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color=NOTE_COLOR)


def save(fig, path: Path) -> Path:
    """Write the PNG; the bounding box grows or shrinks to what was drawn (a legend, long tick
    labels), so nothing is cut at the edges."""
    fig.savefig(
        path, dpi=DPI, metadata={"Software": None}, bbox_inches="tight", pad_inches=PAD_INCHES
    )
    plt.close(fig)
    return path
