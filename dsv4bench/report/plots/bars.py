"""Horizontal ratio bars: compare's new/base time per case."""

from __future__ import annotations

from matplotlib.lines import Line2D

from dsv4bench.report.plots import canvas
from dsv4bench.report.plots.style import plt


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
    canvas.shared_legend(fig, handles, max_cols=4)
    return fig
