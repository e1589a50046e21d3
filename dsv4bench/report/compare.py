"""Compare two result sets (run dirs, results.jsonl or pytest-benchmark JSON): regressions in
time, accuracy, status and measured limits; compare.md and a PNG of time ratios.

Matching and the regression rules: compare_rules.py (RULES; any one makes the exit code 1);
the document: compare_doc.py. With `backends=(A, B)` two backend instances are compared
instead (one run may hold both, e.g. two FlashMLA builds): base is A's rows, new is B's,
matched by case_id under the name "A -> B". A case of BASE that NEW lacks is a regression (a
run that lost rows must not pass the gate) unless `partial`: NEW covers part of BASE by design
(a shard, a subset). Cases only in NEW are listed, never failures, unless `require_base`: then
each is a regression (a baseline that fell behind the scenario must not pass the gate).
"""

from __future__ import annotations

import sys
from pathlib import Path

from dsv4bench.report import compare_doc, plots
from dsv4bench.report.compare_rules import (  # noqa: F401 (time_change, accuracy_bad: the API)
    Entry,
    accuracy_bad,
    compare_rows,
    counts,
    time_change,
)
from dsv4bench.report.load import ReportInputError, load_rows

RATIO_PLOT_MAX = 40  # bars in the PNG
VERDICT_COLORS = {
    "regression": "#d62728",
    "slower, within noise": "#ff9f4a",
    "faster": "#2ca02c",
    "unchanged": "#9e9e9e",
}


# ----------------------------------------------------------------------------- output


def instance_rows(rows: list[dict], backend: str, label: str, where: Path) -> list[dict]:
    """The rows of one backend instance, renamed `label` so that two instances match."""
    picked = [{**r, "backend": label} for r in rows if r.get("backend") == backend]
    if not picked:
        found = sorted({str(r.get("backend")) for r in rows if r.get("backend")})
        raise ReportInputError(
            f"{where}: no rows of backend {backend!r} (has: {', '.join(found) or 'none'})"
        )
    return picked


def compare(
    base: Path,
    new: Path,
    out_dir: Path,
    *,
    time_threshold: float = 0.05,
    backends: tuple[str, str] | None = None,
    partial: bool = False,
    require_base: bool = False,
) -> tuple[int, list[Path]]:
    """Write compare.md (and compare-ratios.png) into out_dir; print a short summary.
    backends (A, B): compare instance A's rows of `base` with instance B's rows of `new`.
    Returns (1 if any regression else 0, written files)."""
    base, new, out_dir = Path(base), Path(new), Path(out_dir)
    base_rows, new_rows = load_rows(base, "base"), load_rows(new, "new")
    if not base_rows:  # every NEW row would be "only in new" and the compare would pass
        raise ReportInputError(
            f"{base}: holds no result rows; expected a BASE run with rows to compare against"
        )
    if not new_rows:  # as `report` refuses it: a run that wrote nothing is no comparison
        raise ReportInputError(
            f"{new}: holds no result rows; expected a NEW run with rows (a run killed before "
            "its first row, an emptied file)"
        )
    if backends is not None:
        label = f"{backends[0]} -> {backends[1]}"
        base_rows = instance_rows(base_rows, backends[0], label, base)
        new_rows = instance_rows(new_rows, backends[1], label, new)
    entries = compare_rows(
        base_rows, new_rows, time_threshold, partial=partial, require_base=require_base
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    files = []
    png = _ratio_png(entries, out_dir, time_threshold)
    doc = compare_doc.document(
        compare_doc.Comparison(
            entries, base, new, time_threshold, png, base_rows, new_rows, backends
        )
    )
    md = out_dir / "compare.md"
    md.write_text(doc.to_markdown())
    files.append(md)
    if png:
        files.append(png)
    print(f"compare: {compare_doc.devices_line(base_rows, new_rows)}")
    _print_summary(entries, md)
    return (1 if any(e.regressions for e in entries) else 0), files


def _verdict_class(e: Entry) -> str:
    if any(k == "time" for k, _ in e.regressions):
        return "regression"
    if e.verdict.startswith("slower"):
        return "slower, within noise"
    return "faster" if e.verdict == "faster" else "unchanged"


def _ratio_png(entries: list[Entry], out_dir: Path, threshold: float) -> Path | None:
    timed = [e for e in entries if e.ratio is not None]
    if not timed:
        return None
    timed.sort(key=lambda e: -e.ratio)
    shown = timed[:RATIO_PLOT_MAX]
    labels = [e.label if len(e.label) <= 80 else e.label[:79] + "…" for e in shown]
    classes = [_verdict_class(e) for e in shown]
    title = "Time ratio new / base, worst first"
    if len(timed) > len(shown):
        title += f" ({len(shown)} of {len(timed)})"
    legend = {
        ("slower beyond noise (regression)" if k == "regression" else k): v
        for k, v in VERDICT_COLORS.items()
        if k in classes
    }
    fig = plots.bar_ratio_figure(
        title,
        labels,
        [e.ratio for e in shown],
        [VERDICT_COLORS[c] for c in classes],
        threshold,
        legend,
    )
    return plots.save(fig, out_dir / "compare-ratios.png")


def _print_summary(entries: list[Entry], md: Path, stream=None) -> None:
    stream = stream or sys.stdout
    c = counts(entries)
    head = "REGRESSION" if c["regressions"] else "no regression"
    print(
        f"compare: {head}: {c['matched']} matched, {c['regressions']} regressed "
        f"({c['time']} time, {c['accuracy']} accuracy, {c['status']} status, {c['limit']} limit, "
        f"{c['missing']} missing, {c['unbaselined']} not in base), "
        f"{c['only_base']} only in base, {c['only_new']} only in new"
        + (
            f", {c['untimed']} ok on both sides with no timing (not time-gated)"
            if c["untimed"]
            else ""
        ),
        file=stream,
    )
    worst = [e for e in entries if e.regressions or e.ratio is not None][:10]
    for e in worst:
        ratio = f"x{e.ratio:.3f}" if e.ratio is not None else "     -"
        what = "; ".join(f"{k}: {d}" for k, d in e.regressions) or e.verdict
        print(f"  {ratio:>8}  {e.label}  {what}", file=stream)
    print(f"written: {md}", file=stream)
