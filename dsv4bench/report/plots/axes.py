"""One axis at a time: when it is logarithmic, how its ticks read, where it starts.

Tick labels are plain numbers ("0.0098", "4096", "1e-05"), never matplotlib's offset notation
("1e-3 + 9.8"), which a reader cannot take in at a glance.
"""

from __future__ import annotations

import math

from matplotlib.ticker import FuncFormatter, NullFormatter


def finite(values) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


def spans(values, factor: float) -> bool:
    """Whether the positive values span `factor` times or more (then a log axis reads better)."""
    pos = [v for v in finite(values) if v > 0]
    return bool(pos) and max(pos) / min(pos) >= factor


def plain(v, _pos=None) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1e6 or abs(v) < 1e-3:
        return f"{v:.0e}"
    return f"{v:g}"


def percent(v, _pos=None) -> str:
    return f"{100 * v:.3g}%"


def format_log(axis, lo: float, fmt=plain, hi: float | None = None) -> None:
    """Label decades; over less than ~2.5 decades also the 2x and 5x minor ticks."""
    axis.set_major_formatter(FuncFormatter(fmt))
    if lo > 0 and hi is not None and hi / lo < 400:

        def minor(v, _pos=None):
            mantissa = round(v / 10 ** math.floor(math.log10(v)), 6)
            return fmt(v) if mantissa in (2, 5) else ""

        axis.set_minor_formatter(FuncFormatter(minor))
    else:
        axis.set_minor_formatter(NullFormatter())


def format_log_y(ax, fmt=plain) -> None:
    lo, hi = ax.get_ylim()
    format_log(ax.yaxis, lo, fmt, hi)


def format_log_x(ax, fmt=plain) -> None:
    lo, hi = ax.get_xlim()
    format_log(ax.xaxis, lo, fmt, hi)


def setup_x(ax, xs, logx: bool | None) -> None:
    """The x axis of a line panel: log base 2 when asked or when x spans 8x or more; a single
    x value gets one tick and a margin around it instead of a range of made-up ticks."""
    xs = finite(xs)
    if logx is None:
        logx = spans(xs, 8)
    distinct = sorted(set(xs))
    if logx or (len(distinct) == 1 and distinct[0] > 0):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(plain))
        ax.xaxis.set_minor_formatter(NullFormatter())
    else:
        ax.xaxis.set_major_formatter(FuncFormatter(plain))
    if len(distinct) == 1:
        x = distinct[0]
        ax.set_xticks([x])
        if x > 0:
            ax.set_xlim(x / 2, x * 2)
        else:
            ax.set_xlim(x - 1, x + 1)


def linear_values(axis, set_lim, values, fmt=plain) -> None:
    """A linear value axis: plain tick labels; magnitudes that are never negative start at 0
    (an all-zero series sits on the floor of a 0..1 axis, not in the middle of -0.05..0.05)."""
    axis.set_major_formatter(FuncFormatter(fmt))
    vals = finite(values)
    if vals and min(vals) >= 0:
        if max(vals) == 0:
            set_lim(0, 1)
        else:
            set_lim(0, None)
