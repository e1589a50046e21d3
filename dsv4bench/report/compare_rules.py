"""Compare, step 1: the regression rules (RULES) and the matching of two row sets into judged
Entries. compare.py writes the result (compare_doc: compare.md; a PNG of time ratios).

Rows are matched by (case_id, backend); where one side holds the key twice (a resumed run),
its last row counts. Limit-probe rows are not matched one by one: their limit rows are, by
lane (every param but the searched axis), several searches of one lane joined.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dsv4bench.measure.timing import percentile
from dsv4bench.report.limit_lanes import lane_id, merge_limits
from dsv4bench.report.load import accuracy_failure, is_probe, short

MIN_SAMPLES = 5
RULES = (
    "**time**: median ratio new/base > 1 + threshold, both sides have n >= 5 timed samples, "
    "the fast tails moved as much (new p10 / base p10 > 1 + threshold: contention on a shared "
    "machine inflates medians first), and the change is beyond the noise: new p10 > base p90 "
    "(the new run's fast tail is slower than the base run's slow tail; percentiles from "
    "`samples_ms` when a row has >= 5 of them, else its `p10_ms`/`p90_ms`, else the quartiles "
    "q1/q3 pytest-benchmark reports). A slower median with overlapping spreads, too few samples "
    "or no known spread is listed, not failed. An ok new row with no timing (no finite "
    "median) where the base row had one regresses: the gate cannot pass what it cannot judge.",
    "**accuracy**: the new row is `incorrect` or beyond its tolerance (cos_diff, lse error, "
    "non-finite values) while the base row was ok and within it.",
    "**status**: the base row was ok and the new one is not (crash, timeout, oom, error, "
    "unsupported).",
    "**limit**: the new run fails at a size the base run passed (new first_fail <= base last_ok).",
    "**missing**: a case (or limit lane) of base has no row in new (a run that lost rows); "
    "`--partial` lists them instead, for a new run that covers part of base by design. A new "
    "run with no row at all is no comparison: exit 2, as `report` says.",
    "**unbaselined**: with `--require-base`, a case (or limit lane) of new has no row in base: "
    "the baseline fell behind the scenario; the change that adds a job refreshes the baseline.",
    "Cases only in new are otherwise listed, never failures; limit-probe rows are judged "
    "through their limit rows.",
)


@dataclass
class Entry:
    case_id: str
    backend: str
    base: dict | None
    new: dict | None
    ratio: float | None = None
    verdict: str = ""  # time verdict, one short phrase
    regressions: list[tuple[str, str]] = field(default_factory=list)  # (kind, detail)

    @property
    def label(self) -> str:
        return f"{self.case_id} · {self.backend}"


# ----------------------------------------------------------------------------- rules


def sample_count(timing: dict) -> int:
    n = timing.get("n")
    samples = timing.get("samples_ms") or []
    return int(n) if isinstance(n, (int, float)) else len(samples)


def spread(timing: dict) -> tuple[float | None, float | None, str]:
    """(low, high) tail of a timing: p10/p90 from samples or the row, else q1/q3."""
    samples = [s for s in timing.get("samples_ms") or [] if isinstance(s, (int, float))]
    if len(samples) >= MIN_SAMPLES:
        return percentile(samples, 10), percentile(samples, 90), "p10/p90 of samples"
    if timing.get("p10_ms") is not None and timing.get("p90_ms") is not None:
        return float(timing["p10_ms"]), float(timing["p90_ms"]), "p10/p90"
    if timing.get("q1_ms") is not None and timing.get("q3_ms") is not None:
        return float(timing["q1_ms"]), float(timing["q3_ms"]), "q1/q3"
    return None, None, ""


def time_change(base: dict, new: dict, threshold: float) -> tuple[float | None, str, bool]:
    """(ratio new/base, verdict, is_regression) for two timings (the rows' `timing` dicts)."""
    bm, nm = base.get("median_ms"), new.get("median_ms")
    if not all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in (bm, nm)):
        return None, "no timing", False
    ratio = nm / bm
    b_lo, b_hi, how = spread(base)
    n_lo, n_hi, _ = spread(new)
    nb, nn = sample_count(base), sample_count(new)
    if ratio > 1 + threshold:
        if min(nb, nn) < MIN_SAMPLES:
            return ratio, f"slower, too few samples (n {nb}/{nn})", False
        if b_hi is None or n_lo is None:
            return ratio, "slower, spread unknown", False
        lo_name, hi_name = ("q1", "q3") if how == "q1/q3" else ("p10", "p90")
        # Neighbours on a shared machine only add time, and to the median first: the fast
        # tail must be slower by the threshold too, or the slowdown is the machine's.
        if b_lo > 0 and n_lo / b_lo <= 1 + threshold:
            return ratio, f"slower median, {lo_name} within threshold (x{n_lo / b_lo:.3g})", False
        if n_lo > b_hi:
            why = f"new {lo_name} {n_lo:.4g} ms > base {hi_name} {b_hi:.4g} ms"
            return ratio, f"slower beyond noise: {why}", True
        return ratio, "slower, within noise", False
    if ratio < 1 / (1 + threshold) and n_hi is not None and b_lo is not None and n_hi < b_lo:
        return ratio, "faster", False
    return ratio, "unchanged", False


def timed(row: dict) -> bool:
    """The row carries a finite positive median (what the time rule compares)."""
    m = (row.get("timing") or {}).get("median_ms")
    return isinstance(m, (int, float)) and math.isfinite(m) and m > 0


def _is_ok(row: dict) -> bool:
    return row.get("status") == "ok"


def accuracy_bad(row: dict) -> str | None:
    if row.get("status") == "incorrect":
        return short(row.get("message"), 100) or "incorrect"
    return accuracy_failure(row) if row.get("status") == "ok" else None


def judge(
    entry: Entry, threshold: float, *, partial: bool = False, require_base: bool = False
) -> None:
    b, n = entry.base, entry.new
    if b is not None and n is None and not partial:
        entry.regressions.append(("missing", f"base has a {b.get('status')} row; new has none"))
    if b is None and n is not None and require_base:
        why = f"new has a {n.get('status')} row; base has none (refresh the baseline)"
        entry.regressions.append(("unbaselined", why))
    if b is None or n is None:
        return
    if b.get("kind") == "limit":
        bo, nf = b.get("last_ok"), n.get("first_fail")
        if bo is not None and nf is not None and nf <= bo:
            entry.regressions.append(
                ("limit", f"fails at {nf} ({n.get('status')}); base passed up to {bo}")
            )
        return
    if _is_ok(b) and _is_ok(n):
        entry.ratio, entry.verdict, slower = time_change(
            b.get("timing") or {}, n.get("timing") or {}, threshold
        )
        if slower:
            entry.regressions.append(("time", f"x{entry.ratio:.3f}: {entry.verdict}"))
        elif entry.ratio is None and timed(b) and not timed(n):
            entry.verdict = "new row untimed"
            entry.regressions.append(("time", "ok but no timing in new (base has a median)"))
    if _is_ok(b) and accuracy_bad(b) is None:
        why = accuracy_bad(n)
        if why:
            entry.regressions.append(("accuracy", why))
    if _is_ok(b) and n.get("status") not in ("ok", "incorrect"):
        entry.regressions.append(
            ("status", f"ok -> {n.get('status')}: {short(n.get('message'), 120)}")
        )


# ----------------------------------------------------------------------------- matching


def _keyed(rows: list[dict]) -> dict[tuple[str, str], dict]:
    """Case rows by (case_id, backend); limit rows by (lane, backend), a lane's searches joined
    (dsv4bench.report.limit_lanes), so searches that started at different sizes still match."""
    out: dict[tuple[str, str], dict] = {}
    for r in merge_limits(rows):
        if r.get("kind") == "limit":
            out[(lane_id(r), str(r.get("backend")))] = r
        elif r.get("kind") == "case" and not is_probe(r):
            out[(str(r.get("case_id")), str(r.get("backend")))] = r
    return out


def compare_rows(
    base_rows: list[dict],
    new_rows: list[dict],
    threshold: float,
    *,
    partial: bool = False,
    require_base: bool = False,
) -> list[Entry]:
    """One entry per (case_id, backend) of either side, judged; worst first: regressions,
    then by time ratio, then the rest. `partial`: cases missing from new are not regressions;
    `require_base`: cases missing from base are."""
    base, new = _keyed(base_rows), _keyed(new_rows)
    entries = []
    for key in sorted(set(base) | set(new)):
        e = Entry(key[0], key[1], base.get(key), new.get(key))
        judge(e, threshold, partial=partial, require_base=require_base)
        entries.append(e)
    entries.sort(key=lambda e: (not e.regressions, -(e.ratio or 0.0), e.case_id, e.backend))
    return entries


def counts(entries: list[Entry]) -> dict[str, int]:
    c = {"matched": 0, "only_base": 0, "only_new": 0, "regressions": 0}
    for e in entries:
        if e.base is not None and e.new is not None:
            c["matched"] += 1
        elif e.base is not None:
            c["only_base"] += 1
        else:
            c["only_new"] += 1
        c["regressions"] += bool(e.regressions)
    for kind in ("time", "accuracy", "status", "limit", "missing", "unbaselined"):
        c[kind] = sum(1 for e in entries for k, _ in e.regressions if k == kind)
    # matched ok rows the time rule could not look at (neither side timed): said, not failed
    c["untimed"] = sum(1 for e in entries if e.verdict == "no timing")
    return c
