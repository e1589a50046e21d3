"""What the figure modules share: a run's committed rows, pairing them, printing a figure."""

from __future__ import annotations

import statistics
from functools import cache
from pathlib import Path

from dsv4bench.report.load import load_rows
from dsv4bench.rows import timers

ROOT = Path(__file__).resolve().parents[2]
STUDIES = "results/sm90/studies"


@cache
def rows(path: str) -> list[dict]:
    return load_rows(ROOT / path)


def span(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}"


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}"


def _span3(values: list[float]) -> str:
    return f"{min(values):.3f}-{max(values):.2f}"


def _percent_span(values: list[float]) -> str:
    return f"{100 * min(values):.0f}-{100 * max(values):.0f}"


def _last_rows(path: str) -> list[dict]:
    """A run's case rows, the later row of a (case, backend) job winning (a resumed run)."""
    last = {(r["case_id"], r["backend"]): r for r in rows(path) if r.get("kind") == "case"}
    return list(last.values())


def _pair_ratios(path: str, a: str, b: str, where=None, **params) -> list[float]:
    """a's time / b's time per case both ran ok, by the first timer both rows measured; only
    rows with these params and, given `where`, for which where(row) holds."""
    by: dict[str, dict[str, dict]] = {}
    for r in _last_rows(path):
        if (
            r.get("status") == "ok"
            and all(r["params"].get(k) == v for k, v in params.items())
            and (where is None or where(r))
        ):
            by.setdefault(r["case_id"], {})[r["backend"]] = r
    out = []
    for pair in by.values():
        if a in pair and b in pair:
            key, _ = timers.shared([pair[a], pair[b]])
            out.append(timers.value(pair[a], key) / timers.value(pair[b], key))
    return out


def _gap_rows(path: str) -> str:
    """Rows whose profiler makespan is over 1.2x their busy time (a host gap between kernels)."""
    timed = [r for r in _last_rows(path) if timers.value(r, "profiler_busy_ms")]
    gapped = [
        r
        for r in timed
        if timers.value(r, "profiler_ms") > 1.2 * timers.value(r, "profiler_busy_ms")
    ]
    return f"{len(gapped)} of {len(timed)}"
