"""The support-envelope grid: a row of panels per grid (a backend, and its raw-heads cells
apart: report/envelope.grid), one panel per (phase, layout); x the top-k, y the heads (and s_q
for decode), each square colored by the cell's status."""

from __future__ import annotations

from pathlib import Path

from matplotlib.lines import Line2D

from dsv4bench.report.envelope import Cell, grid
from dsv4bench.report.plots import canvas
from dsv4bench.report.plots.style import STATUS_COLORS, STATUS_MARKERS

# planned: supported at plan time, not run; refused: the call raised (a row's `error`)
ENVELOPE_COLORS = {**STATUS_COLORS, "planned": "#c7e9c0", "refused": STATUS_COLORS["error"]}
_LABELS = {"planned": "supported (plan), not run", "refused": "refused (the call raised)"}


def _y_label(cell: Cell) -> str:
    return f"h{cell.num_heads}" if cell.phase == "prefill" else f"h{cell.num_heads} s{cell.s_q}"


def _panel(ax, cells: list[Cell], title: str) -> set[str]:
    xs = sorted({c.topk for c in cells})
    ys = sorted({(c.num_heads, c.s_q) for c in cells})
    labels = {(c.num_heads, c.s_q): _y_label(c) for c in cells}
    for c in cells:
        ax.scatter(
            xs.index(c.topk), ys.index((c.num_heads, c.s_q)),
            marker="s", s=60, color=ENVELOPE_COLORS[c.status], edgecolors="0.3", linewidths=0.3,
        )  # fmt: skip
    ax.set_xticks(range(len(xs)), [str(x) for x in xs], rotation=60)
    ax.set_yticks(range(len(ys)), [labels[y] for y in ys], fontsize=6)
    ax.set_xlabel("top-k (indexer width)")
    ax.set_title(title)
    ax.grid(False)
    return {c.status for c in cells}


def draw(cells: list[Cell], path: Path, title: str = "Support envelope") -> Path:
    """One PNG of every backend's grid; returns its path."""
    grids = list(dict.fromkeys(grid(c) for c in cells))
    panels = list(dict.fromkeys((c.phase, c.layout) for c in cells))
    if not grids:
        raise ValueError("no envelope cells to draw")
    fig, axes = canvas.figure(
        len(grids), len(panels), title, panel_w=3.2, panel_h=4.2
    )  # fmt: skip
    seen: set[str] = set()
    for i, name in enumerate(grids):
        for j, (phase, layout) in enumerate(panels):
            ax = axes[i * len(panels) + j]
            mine = [c for c in cells if grid(c) == name and (c.phase, c.layout) == (phase, layout)]
            if mine:
                seen |= _panel(ax, mine, f"{name}: {phase}, {layout}")
            else:
                ax.set_visible(False)
    handles = {
        _LABELS.get(s, s): Line2D(
            [],
            [],
            marker="s",
            linestyle="",
            color=ENVELOPE_COLORS[s],
            markeredgecolor="0.3",
            markersize=8,
        )  # fmt: skip
        for s in ENVELOPE_COLORS
        if s in seen and s in {*STATUS_MARKERS, "planned", "refused"}
    }
    canvas.shared_legend(fig, handles)
    path.parent.mkdir(parents=True, exist_ok=True)
    return canvas.save(fig, path)
