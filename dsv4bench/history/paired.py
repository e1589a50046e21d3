"""The paired gate: a run against the comparable run just before it (the same scenarios on the
same device; in CI, two smoke runs minutes apart in one job), one verdict per backend, on a
time relative to the run itself.

A shared CPU slows a whole run, or stretches of it, by 10 % to 2x (other processes take a
core; torch's two threads then wait for each other), far past a 10 % change of one kernel. So
each case's time (its fastest call: neighbours only ever add time) is divided by the same
case's time on the run's other backends, measured just before or after it in the same run (the
geometric mean of theirs): what the machine adds to both cancels. A case's change is its
relative time now over its relative time in the base run,
and a backend regresses when the median of its cases' changes is beyond the threshold, over at
least MIN_CASES cases: a slowdown of most of a backend's cases, not of one case (one case's
relative time still moves 1.3x to 2x between two unplanted runs; docs/history.md has the
numbers). A slowdown every backend of a case shares (the machine, torch itself) cancels too:
this gate cannot see it, the window rule (trend.py) can.
"""

from __future__ import annotations

import math
import statistics

from dsv4bench.history.store import Entry, Point
from dsv4bench.history.trend import Verdict, comparable
from dsv4bench.report.compare_rules import MIN_SAMPLES

MIN_CASES = 5
FAMILY = "paired: time relative to the run's other backends"


def _timed(p: Point) -> bool:
    return p.status == "ok" and bool(p.p10_ms) and p.n >= MIN_SAMPLES


def has_fastest(entry: Entry) -> bool:
    """Every timed point keeps its fastest call (schema 2); schema 1 entries hold p10s alone."""
    return all(p.min_ms for p in entry.points if _timed(p))


def relative_times(entry: Entry, fastest: bool = True) -> dict[tuple[str, str], float]:
    """(case, backend) -> its time over the geometric mean of the same case's times on the
    entry's other backends; a case timed on one backend alone has none. Time: the fastest
    call (what neighbours added least to), or the p10 where `fastest` is False."""
    by_case: dict[str, dict[str, float]] = {}
    for p in entry.points:
        if _timed(p) and p.key.endswith(f" · {p.backend}"):
            case = p.key[: -len(f" · {p.backend}")]
            by_case.setdefault(case, {})[p.backend] = p.min_ms if fastest else p.p10_ms
    out = {}
    for case, times in by_case.items():
        for backend, t in times.items():
            others = [math.log(v) for b, v in times.items() if b != backend]
            if others:
                out[(case, backend)] = t / math.exp(sum(others) / len(others))
    return out


def base_of(history: list[Entry], entry: Entry) -> Entry | None:
    """The comparable entry just before `entry`: what the paired gate judges it against."""
    earlier = comparable(history, entry)
    return earlier[-1] if earlier else None


def judge_pair(base: Entry, new: Entry, threshold: float) -> list[Verdict]:
    """One verdict a backend (kind time on a regression), then one a case (never a
    regression alone: slower, faster or ok), with the change of its relative time."""
    fastest = has_fastest(base) and has_fastest(new)  # both sides by the same statistic
    before, now = relative_times(base, fastest), relative_times(new, fastest)
    changes: dict[str, dict[str, float]] = {}
    for key in sorted(before.keys() & now.keys()):
        case, backend = key
        changes.setdefault(backend, {})[case] = now[key] / before[key]
    out = []
    for backend, cases in sorted(changes.items()):
        ratio = statistics.median(cases.values())
        worst = max(cases, key=cases.get)
        detail = (
            f"median change of {len(cases)} cases' time relative to the run's other backends "
            f"(against {base.id}); most: x{cases[worst]:.3f} {worst}"
        )
        if len(cases) < MIN_CASES:
            kind, detail = "ok", f"{len(cases)} cases, fewer than {MIN_CASES}: not judged"
        elif ratio > 1 + threshold:
            kind = "time"
        else:
            kind = "faster" if ratio < 1 / (1 + threshold) else "ok"
        key = f"median of {len(cases)} cases · {backend}"
        out.append(Verdict(new.id, key, FAMILY, backend, ratio, kind, detail))
    for backend, cases in sorted(changes.items()):
        for case, change in sorted(cases.items()):
            kind = _kind(change, threshold)
            detail = f"relative time x{change:.3f} of {base.id}'s (one case: noise, not judged)"
            key = f"{case} · {backend}"
            out.append(Verdict(new.id, key, FAMILY, backend, change, kind, detail))
    return out


def _kind(ratio: float, threshold: float) -> str:
    if ratio > 1 + threshold:
        return "slower"
    return "faster" if ratio < 1 / (1 + threshold) else "ok"


def judge_entry(history: list[Entry], entry: Entry, threshold: float) -> list[Verdict]:
    """The paired verdicts of `entry` against the comparable entry before it; none where it
    has none (its gate line then says so)."""
    base = base_of(history, entry)
    return judge_pair(base, entry, threshold) if base else []


def pair_line(history: list[Entry], entry: Entry, verdicts: list[Verdict]) -> str:
    """What the paired gate compared: the base entry and each backend's median change."""
    base = base_of(history, entry)
    if base is None:
        return f"paired: no comparable entry before {entry.id}: nothing judged"
    backends = [v for v in verdicts if v.family == FAMILY and v.key.startswith("median of ")]
    each = ", ".join(f"{v.backend} x{v.ratio:.3f} ({v.kind})" for v in backends)
    return f"paired against {base.id}: {each or 'no case timed on two backends in both'}"


def page_rule(history: list[Entry], gated: list[Entry], threshold: float) -> str:
    """The page's paragraph on the paired rule, naming each gated entry's base."""
    pairs = "; ".join(
        f"{e.id} against {b.id if (b := base_of(history, e)) else 'nothing (no entry before it)'}"
        for e in gated
    )
    return (
        f"Paired gate (dsv4bench/history/paired.py): {pairs}. A case's time (its fastest call) "
        "is divided by the same case's time on the run's other backends, and a backend regresses "
        f"when the median change of that relative time over its cases is beyond {threshold:g} "
        f"(at least {MIN_CASES} cases). The gated entry's rows below give each case's change "
        "(its ratio); one case alone is not judged."
    )
