"""Figures of the H100 baseline run, the workloads and FA3 studies, the failures study and the
committed envelope."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable

from dsv4bench.report.load import is_probe, load_runs
from dsv4bench.report.sections import winners
from dsv4bench.report.sections.workloads import ragged_ratios

from .common import ROOT, STUDIES, _gap_rows, _last_rows, rows, span

WORKLOADS = "results/sm90/studies/workloads"
BASELINE = "results/sm90/baseline-h100"
FA3_RUNS = (
    "results/sm90/studies/engine-kernels/compare",
    "results/sm90/studies/engine-kernels/flashinfer-fa3",
)


def workload_rows() -> str:
    return str(len(rows(WORKLOADS)))


def ragged_ratio_range() -> str:
    """ragged time / uniform time over every ragged case row with a uniform twin."""
    return span([ratio for _, ratio in ragged_ratios(rows(WORKLOADS))])


def ragged_ratio_max_at() -> str:
    row, _ = max(ragged_ratios(rows(WORKLOADS)), key=lambda t: t[1])
    p = row["params"]
    return f"{row['backend']}, {p['model']} C{p['compress_ratio']} {p['op']}"


def _fa3_ratios(op: str) -> list[float]:
    """fa3 time / FlashMLA time on V4 at 64 and 128 heads, per run (the winners' rule)."""
    shapes = winners.shapes(load_runs([ROOT / p for p in FA3_RUNS]))
    return [
        s.ratio("fa3")
        for s in shapes
        if s.params.get("op") == op
        and str(s.params.get("model")).startswith("v4")
        and s.params.get("num_heads") in (64, 128)
        and s.ratio("fa3")
    ]


def fa3_v4_decode_ratio() -> str:
    return span(_fa3_ratios("decode"))


def fa3_v4_prefill_ratio() -> str:
    return span(_fa3_ratios("prefill"))


def baseline_case_rows() -> str:
    return str(sum(r.get("kind") == "case" for r in rows(BASELINE)))


def baseline_limit_rows() -> str:
    return str(sum(r.get("kind") == "limit" for r in rows(BASELINE)))


def baseline_jobs() -> str:
    """Case jobs the run made (limit probes are the limit searches' own)."""
    return str(sum(r.get("kind") == "case" and not is_probe(r) for r in rows(BASELINE)))


def baseline_wall_s() -> str:
    """The command's wall time in seconds: the sum of bench.log's `wall_s=` lines (one per
    invocation of a run resumed across GPU calls)."""
    text = (ROOT / BASELINE / "bench.log").read_text()
    pieces = [int(s) for s in re.findall(r"^rc=\d+ wall_s=(\d+)$", text, re.M)]
    return str(sum(pieces)) if pieces else "?"


def baseline_ok_by_backend() -> str:
    ok = Counter(r["backend"] for r in rows(BASELINE) if r.get("status") == "ok")
    return ", ".join(f"{b} {n} ok" for b, n in sorted(ok.items(), key=lambda t: (-t[1], t[0])))


def _status_count(status: str) -> str:
    return str(sum(r.get("kind") == "case" and r.get("status") == status for r in rows(BASELINE)))


def _failures_statuses() -> str:
    n = Counter(r["status"] for r in _last_rows(f"{STUDIES}/failures/shapes"))
    return ", ".join(f"{k} {n[k]}" for k in ("ok", "incorrect", "error", "crash", "unsupported"))


def _limit_161k() -> str:
    """'N of M': the context-limit searches that probed the engine issue's 161K (164864) and
    found it ok, of those that probed it."""
    last = {
        (r["case_id"], r["backend"]): r
        for r in rows(f"{STUDIES}/failures/context-limits")
        if r.get("kind") == "limit"
    }
    probed = [r["probes"]["164864"] for r in last.values() if "164864" in (r.get("probes") or {})]
    return f"{probed.count('ok')} of {len(probed)}"


def _envelope(status: str) -> str:
    """Cells of the committed sm90 envelope (dsv4bench envelope's envelope.jsonl, committed
    gzipped) of a status."""
    import gzip
    import json

    path = ROOT / "results/envelope/sm90-h100/envelope.jsonl.gz"
    text = gzip.decompress(path.read_bytes()).decode()
    cells = [json.loads(line) for line in text.splitlines() if line.strip()]
    return str(len(cells) if status == "all" else sum(c["status"] == status for c in cells))


FIGURES: dict[str, Callable[[], str]] = {
    "workload_rows": workload_rows,
    "ragged_ratio_range": ragged_ratio_range,
    "ragged_ratio_max_at": ragged_ratio_max_at,
    "fa3_v4_decode_ratio": fa3_v4_decode_ratio,
    "fa3_v4_prefill_ratio": fa3_v4_prefill_ratio,
    "baseline_case_rows": baseline_case_rows,
    "baseline_limit_rows": baseline_limit_rows,
    "baseline_jobs": baseline_jobs,
    "baseline_wall_s": baseline_wall_s,
    "baseline_ok_by_backend": baseline_ok_by_backend,
    "baseline_unsupported": lambda: _status_count("unsupported"),
    "baseline_crash": lambda: _status_count("crash"),
    "baseline_gap_rows": lambda: _gap_rows(BASELINE),
    "failures_statuses": _failures_statuses,
    "limit_161k": _limit_161k,
    "envelope_cells": lambda: _envelope("all"),
    "envelope_ok": lambda: _envelope("ok"),
    "envelope_unsupported": lambda: _envelope("unsupported"),
    "envelope_incorrect": lambda: _envelope("incorrect"),
    "envelope_refused": lambda: _envelope("refused"),
    "envelope_crash": lambda: _envelope("crash"),
    "envelope_planned": lambda: _envelope("planned"),
}
