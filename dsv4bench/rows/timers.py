"""Which of a row's times a report shows, ranks and divides: the same everywhere, the winners'.

A row may carry three figures of its timed call (timing): the profiler's kernel makespan, the
CUDA-graph replay and the CUDA-events median. A report uses the first of PREFERENCE that the rows
it sets side by side all measured, and shows the events median beside it (events sit ~2.8 us
above the makespan below 50 us: launch and event overhead). Reference rows of the oracle skip
the profiler pass, so they read by events.
"""

from __future__ import annotations

import math

# (timing key, name in a table), in order of preference
PREFERENCE = (
    ("profiler_ms", "profiler makespan"),
    ("graph_ms", "graph replay"),
    ("median_ms", "events"),
)
EVENTS = "median_ms"
NAMES = dict(PREFERENCE)  # timing key -> its name in a table


def value(row: dict | None, key: str) -> float | None:
    v = ((row or {}).get("timing") or {}).get(key)
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
    return float(v) if ok else None


def shared(rows: list[dict]) -> tuple[str, str] | None:
    """The first of PREFERENCE that every row measured (key, name), or None."""
    for key, name in PREFERENCE:
        if rows and all(value(r, key) is not None for r in rows):
            return key, name
    return None


def gpu_ms(row: dict) -> tuple[float, str] | None:
    """The row's time by its first timer, with that timer's name; None without a time."""
    found = shared([row])
    return (value(row, found[0]), found[1]) if found else None


def ms(row: dict) -> float | None:
    found = gpu_ms(row)
    return found[0] if found else None


def events_ms(row: dict | None) -> float | None:
    return value(row, EVENTS)


def point_timer(point: dict) -> str:
    """The name of the timer a serving point sums its parts by: its `timer`, a timing key
    (rows written before the key was stored hold the name itself; older ones none: events)."""
    timer = str(point.get("timer") or EVENTS)
    return NAMES.get(timer, timer)


def point_events_ms(point: dict) -> float | None:
    """A serving point's parts summed by their events medians: its `events_ms`, or its value
    where that is the events sum (older rows)."""
    if point.get("events_ms") is not None:
        return float(point["events_ms"])
    return point.get("value_ms") if point_timer(point) == NAMES[EVENTS] else None
