"""Regressions against the rolling history: each point of an entry judged against the same
point (same case, backend) in the last WINDOW comparable entries before it (the same
scenarios on the same device).

The time rule is `dsv4bench compare`'s noise model for a shared CPU machine, with the history
standing in for one base run: neighbours only ever add time, and to the median first.
- the median is slower than the window's median of medians by more than the threshold, and
- the fast tail moved as much: p10 over the window's median p10 > 1 + threshold, and
- beyond the history's own noise: the new p10 is above every p10 of the window (a window of
  one entry: above its p10),
both sides holding >= MIN_SAMPLES timed calls. A serving point (a sum of medians, no spread)
regresses when its value is beyond the threshold over the window's median and above every
value of the window. Status and accuracy count in full, against the latest comparable entry:
ok there and not ok now, or the judge refusing an answer it took there.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from dsv4bench.history.store import Entry, Point
from dsv4bench.report.compare_rules import MIN_SAMPLES

WINDOW = 5


@dataclass
class Verdict:
    entry: str  # the entry's id
    key: str
    family: str
    backend: str
    ratio: float | None  # median / the window's median of medians
    kind: str  # time | accuracy | status | missing | new | ok | slower | faster
    detail: str

    @property
    def regression(self) -> bool:
        return self.kind in ("time", "accuracy", "status", "missing")


def comparable(history: list[Entry], entry: Entry) -> list[Entry]:
    """The entries before `entry` (in history order) of the same scenarios on the same
    device, newest last."""
    before = history[: history.index(entry)]
    same = (entry.device, entry.scenarios)
    return [e for e in before if (e.device, e.scenarios) == same]


def _time(new: Point, window: list[Point], threshold: float) -> tuple[float | None, str, str]:
    """(ratio, kind, detail) of one timed point against its window of earlier points."""
    timed = [p for p in window if p.status == "ok" and p.median_ms]
    if new.status != "ok" or not new.median_ms or not timed:
        return None, "ok", "no timing to compare"
    base = statistics.median(p.median_ms for p in timed)
    ratio = new.median_ms / base
    if ratio < 1 / (1 + threshold):
        return ratio, "faster", f"x{ratio:.3f} of the median of the last {len(timed)}"
    if ratio <= 1 + threshold:
        return ratio, "ok", "within threshold"
    if new.p10_ms is None:  # a serving point: the window's values are its noise
        highest = max(p.median_ms for p in timed)
        if new.median_ms > highest:
            return ratio, "time", f"x{ratio:.3f}, above every value of the last {len(timed)}"
        return ratio, "slower", f"x{ratio:.3f}, within the last {len(timed)} values"
    tails = [p.p10_ms for p in timed if p.p10_ms]
    if new.n < MIN_SAMPLES or min(p.n for p in timed) < MIN_SAMPLES or not tails:
        return ratio, "slower", f"x{ratio:.3f}, too few samples"
    tail_ratio = new.p10_ms / statistics.median(tails)
    if tail_ratio <= 1 + threshold:
        return ratio, "slower", f"x{ratio:.3f} median, p10 within threshold (x{tail_ratio:.3g})"
    if new.p10_ms <= max(tails):
        return ratio, "slower", f"x{ratio:.3f}, p10 within the history's p10s"
    why = f"p10 {new.p10_ms:.4g} ms > every p10 of the last {len(tails)} (max {max(tails):.4g})"
    return ratio, "time", f"x{ratio:.3f} over the median of {len(timed)}: {why}"


def judge_entry(
    history: list[Entry], entry: Entry, threshold: float, window: int = WINDOW
) -> list[Verdict]:
    """One verdict per point of the entry (and per point of the latest comparable entry the
    entry lacks: missing)."""
    earlier = comparable(history, entry)[-window:]
    out = []
    now = {p.key: p for p in entry.points}
    for p in entry.points:
        past = [q for e in earlier for q in e.points if q.key == p.key]
        if not past:
            out.append(Verdict(entry.id, p.key, p.family, p.backend, None, "new", "no history"))
            continue
        ratio, kind, detail = _time(p, past, threshold)
        last = past[-1]
        if last.status == "ok" and p.status not in ("ok", "incorrect"):
            kind, detail = "status", f"ok -> {p.status}"
        elif last.status == "ok" and not last.accuracy_bad and p.accuracy_bad:
            kind, detail = "accuracy", p.accuracy_bad
        out.append(Verdict(entry.id, p.key, p.family, p.backend, ratio, kind, detail))
    if earlier:
        for q in earlier[-1].points:
            if q.key not in now:
                why = f"in {earlier[-1].id}, not in this run"
                out.append(Verdict(entry.id, q.key, q.family, q.backend, None, "missing", why))
    return out


def judge_all(
    history: list[Entry], threshold: float, window: int = WINDOW
) -> dict[str, list[Verdict]]:
    """Verdicts of every entry against its own earlier window, by entry id."""
    return {e.id: judge_entry(history, e, threshold, window) for e in history}
