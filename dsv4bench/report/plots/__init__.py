"""Figures for reports: plain data in (series, points, lines), one PNG out.

Matplotlib runs headless (Agg). Output is deterministic for the same input: fixed figure sizes
and dpi, no software/date metadata in the PNG, colors assigned from sorted labels.

Modules, one job each: style (palette, markers, sizes), canvas (panel grid, shared legend,
save), axes (log or linear, tick labels, where an axis starts), lines (line panels), points
(the dot chart one-point series become), category (accuracy strip plots), status (status lanes
with thresholds), bars (compare's ratio bars).
"""

from __future__ import annotations

from dsv4bench.report.plots.bars import bar_ratio_figure
from dsv4bench.report.plots.canvas import figure, grid, save, shared_legend
from dsv4bench.report.plots.category import CatPoint, category_figure
from dsv4bench.report.plots.lines import Panel, Series, is_point_figure, line_figure
from dsv4bench.report.plots.status import Marker, Span, StatusPoint, status_figure
from dsv4bench.report.plots.style import (
    LINESTYLES,
    MARKERS,
    PALETTE,
    PANEL_W,
    STATUS_ORDER,
    colors_for,
)

__all__ = [
    "LINESTYLES",
    "MARKERS",
    "PALETTE",
    "PANEL_W",
    "STATUS_ORDER",
    "CatPoint",
    "Marker",
    "Panel",
    "Series",
    "Span",
    "StatusPoint",
    "bar_ratio_figure",
    "category_figure",
    "colors_for",
    "figure",
    "grid",
    "is_point_figure",
    "line_figure",
    "save",
    "shared_legend",
    "status_figure",
]
