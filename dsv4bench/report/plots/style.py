"""The look every figure shares: headless matplotlib, sizes, palette, markers, status colors."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

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
REPEATED_LABEL = "same x measured again (hollow; the line takes the lower median)"
NOTE_COLOR = "0.4"

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


def colors_for(labels) -> dict[str, str]:
    """A stable color per distinct label (sorted), cycling the palette."""
    return {lab: PALETTE[i % len(PALETTE)] for i, lab in enumerate(sorted(set(labels)))}
