"""Rows for reports and comparisons: from run dirs, results.jsonl files or pytest-benchmark JSON.

Every row comes back normalized: all fields of its kind present (missing ones None/empty), plus
`_run`, a short label of the run it came from, so rows of several runs can be told apart.
"""

from __future__ import annotations

import json
import math
from dataclasses import fields
from pathlib import Path

from dsv4bench import rows
from dsv4bench.cases.case import Tolerance
from dsv4bench.measure import judge
from dsv4bench.measure.timing import percentile
from dsv4bench.rows.results import PACKED_FILE, RESULTS_FILE, read_checked, rows_file

CASE_FIELDS = [f.name for f in fields(rows.CaseRow) if f.name != "extra"]

SERVING_FILE = "serving.jsonl"  # where serving rows may live beside results.jsonl


class ReportInputError(ValueError):
    """A path that holds no results, or a file that is not one of the accepted formats."""


def load_rows(path: str | Path, run: str | None = None) -> list[dict]:
    """Normalized rows of one run: a run dir (results.jsonl, serving.jsonl, pytest-benchmark
    *.json), a results.jsonl file, or a pytest-benchmark --benchmark-json file."""
    path = Path(path)
    run = run or run_label(path)
    if not path.exists():
        raise ReportInputError(f"{path}: no such file or directory")
    if path.is_dir():
        results = rows_file(path)
        raw = _checked(results) + _checked(path / SERVING_FILE)
        if not results.exists():
            for f in sorted(path.glob("*.json")):
                raw += _benchmark_rows(f, strict=False)
        if not raw and not results.exists():
            raise ReportInputError(f"{path}: holds no {RESULTS_FILE} nor pytest-benchmark JSON")
    elif path.suffix == ".json":
        raw = _benchmark_rows(path, strict=True)
    else:
        raw = _checked(path)
    return [normalize(r, run) for r in raw if isinstance(r, dict)]


def _checked(path: Path) -> list[dict]:
    """The rows of a results file; junk or a row no run could write is refused in one line."""
    try:
        return list(read_checked(path, torn_tail_ok=True))
    except rows.RowError as e:
        raise ReportInputError(str(e)) from None


def run_labels(paths: list[str | Path]) -> list[str]:
    """Distinct labels for several runs (a repeated dir name gets primes)."""
    labels: list[str] = []
    for p in paths:
        label = run_label(Path(p))
        while label in labels:
            label = f"{label}'"
        labels.append(label)
    return labels


def load_runs(paths: list[str | Path]) -> list[dict]:
    """Rows of several runs, each labelled with a distinct `_run` (see run_labels)."""
    rows: list[dict] = []
    for p, label in zip(paths, run_labels(paths), strict=True):
        rows += load_rows(p, label)
    return rows


def run_label(path: Path) -> str:
    """A short name for a run: its dir name (the parent's for RUN_DIR/results.jsonl)."""
    path = Path(path)
    if path.is_file() and path.name in (RESULTS_FILE, PACKED_FILE, SERVING_FILE):
        return path.resolve().parent.name
    return path.stem if path.is_file() else path.resolve().name


def normalize(row: dict, run: str) -> dict:
    """Every field of the row's kind present (dsv4bench.rows), plus `_run`."""
    if row.get("kind", "case") in rows.KINDS:  # a kind of a later version stays as it is
        row = rows.from_dict(row).to_dict()
        row["tags"] = list(row.get("tags") or [])
    else:
        row = dict(row)
    if row.get("kind", "case") in ("case", "limit"):
        _as_judged_today(row)
    row["_run"] = run
    return row


ORACLE_BACKENDS = rows.ORACLE_BACKENDS  # the oracle as a kernel: its rows are reference rows


def _as_judged_today(row: dict) -> None:
    """Older rows read as today's are written: a failed row credits no time or derived figure
    (kept aside in info.not_credited), and the oracle's own rows are reference rows with no
    accuracy (an old `torch` row's cos_diff 0.0 compared the oracle with itself)."""
    if row.get("status") != "ok" and (row.get("timing") or row.get("derived")):
        row["info"] = {
            **(row.get("info") or {}),
            "not_credited": {"timing": row.get("timing"), "derived": row.get("derived")},
        }
        row["timing"] = row["derived"] = None
    info = row.get("info") or {}
    stale = row.get("accuracy") is not None and not info.get("reference_row")
    if rows.is_oracle_row(row) and stale:
        row["info"] = {**info, "reference_row": "the oracle itself (an older row): no accuracy"}
        row["accuracy"] = row["tolerance"] = None


# ----------------------------------------------------------------------------- pytest-benchmark


def _benchmark_rows(path: Path, *, strict: bool) -> list[dict]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        if strict:
            raise ReportInputError(f"{path}: not readable JSON ({e})") from None
        return []
    if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list):
        if strict:
            raise ReportInputError(f"{path}: no 'benchmarks' list (pytest-benchmark JSON)")
        return []
    env = _benchmark_env(data)
    return [benchmark_to_row(b, env) for b in data["benchmarks"] if isinstance(b, dict)]


def _benchmark_env(data: dict) -> dict:
    machine = data.get("machine_info") or {}
    commit = data.get("commit_info") or {}
    commit_id = commit.get("id")
    if commit_id and commit.get("dirty"):
        commit_id = f"{commit_id[:12]}+dirty"
    elif commit_id:
        commit_id = commit_id[:12]
    return {
        "python": machine.get("python_version"),
        "host": machine.get("node"),
        "cpu": (machine.get("cpu") or {}).get("brand_raw")
        if isinstance(machine.get("cpu"), dict)
        else machine.get("cpu"),
        "git_commit": commit_id,
    }


def benchmark_to_row(bench: dict, env: dict | None = None) -> dict:
    """One pytest-benchmark entry as a case row. extra_info keys named like a case row's fields
    (case_id, backend, op, params, accuracy, status, ...) are taken as they are."""
    extra = dict(bench.get("extra_info") or {})
    stats = bench.get("stats") or {}
    bparams = bench.get("params") or {}
    row: dict = {"kind": "case"}
    for key in CASE_FIELDS:
        if key in extra:
            row[key] = extra[key]
    row.setdefault("case_id", bench.get("name") or bench.get("fullname"))
    row.setdefault("backend", bparams.get("backend") or "unknown")
    row.setdefault("params", {k: v for k, v in bparams.items() if k != "backend"})
    row.setdefault("op", row["params"].get("op") if isinstance(row["params"], dict) else None)
    row.setdefault("status", "ok")
    row.setdefault("env", env)
    if "timing" not in extra and stats.get("median") is not None:
        row["timing"] = _benchmark_timing(stats)
    return row


def _benchmark_timing(stats: dict) -> dict:
    ms = lambda key: stats[key] * 1e3 if isinstance(stats.get(key), (int, float)) else None
    data = stats.get("data")
    samples = [float(x) * 1e3 for x in data] if isinstance(data, list) and data else None
    timing = {
        "median_ms": ms("median"),
        "p10_ms": percentile(samples, 10) if samples else None,
        "p90_ms": percentile(samples, 90) if samples else None,
        "q1_ms": ms("q1"),
        "q3_ms": ms("q3"),
        "min_ms": ms("min"),
        "max_ms": ms("max"),
        "n": stats.get("rounds") or (len(samples) if samples else None),
        "method": "pytest-benchmark",
    }
    if samples:
        timing["samples_ms"] = samples
    return timing


# ----------------------------------------------------------------------------- row helpers


def case_rows(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r.get("kind") == "case"]


def last_case_rows(rows: list[dict]) -> list[dict]:
    """One row per case: of a (run, case, backend) written twice (a resumed or re-judged run
    appends), the last, where the first stood."""
    last: dict[tuple, dict] = {}
    for r in case_rows(rows):
        last[(r.get("_run"), r["case_id"], r.get("backend"))] = r
    return list(last.values())


def timed_attention_rows(rows: list[dict]) -> list[dict]:
    """ok decode/prefill case rows with a median time (limit probes left out)."""
    return [
        r
        for r in case_rows(rows)
        if r["status"] == "ok"
        and not is_probe(r)
        and r.get("op") in ("decode", "prefill")
        and median_ms(r) is not None
    ]


def is_probe(row: dict) -> bool:
    return "limit-probe" in (row.get("tags") or [])


def param(row: dict, key: str, default=None):
    return (row.get("params") or {}).get(key, default)


def median_ms(row: dict) -> float | None:
    v = (row.get("timing") or {}).get("median_ms")
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def family(row: dict) -> str:
    """The case family accuracy is grouped by: op/model/layout (and the route of a prefill)."""
    parts = [row.get("op") or "?", param(row, "model") or "?", param(row, "layout") or "?"]
    if row.get("op") == "prefill" and param(row, "route"):
        parts.append(param(row, "route"))
    return "/".join(str(p) for p in parts)


def tolerance(row: dict) -> dict:
    """{cos_diff, lse_abs} the row was judged with: its own (rows carry it since the typed
    rows; older ones may hold it in params or info), else the Case default for its op; and
    the optional bounds where its backend declared them."""
    found: dict = {}
    for holder in (row.get("params") or {}, row.get("info") or {}, row):
        tol = holder.get("tolerance")
        if isinstance(tol, dict):
            found = {**tol, **found}
    default = Tolerance().resolved(row.get("op"))
    declared = {k: found[k] for k in OPTIONAL_BOUNDS if found.get(k) is not None}
    return {
        "cos_diff": found.get("cos_diff", default.cos_diff),
        "lse_abs": found.get("lse_abs", default.lse_abs),
        **declared,
    }


# the optional bounds (Tolerance), declared by a lossy backend: a row carries them where it did
OPTIONAL_BOUNDS = ("max_logits_abs", "exact_cos_diff", "exact_lse_abs")


def accuracy_failure(row: dict) -> str | None:
    """Why the row's answer is not correct by the run's own judge (tolerance, and the top-k
    picks of an indexer row), or None when it is (or the row has no accuracy)."""
    return judge.problem(row.get("accuracy") or {}, tolerance(row))


def short(text, limit: int = 160) -> str:
    """A message on one line of at most about `limit` characters; for several lines the first
    and the last (a crash's useful part is often its last line, the CUDA error)."""
    lines = [ln.strip() for ln in str(text or "").splitlines() if ln.strip()]
    if not lines:
        return ""
    cut = lambda s, n: s if len(s) <= n else s[: n - 1] + "…"
    if len(lines) == 1:
        return cut(lines[0], limit)
    last = lines[-1] if len(lines[-1]) <= limit // 2 else "…" + lines[-1][-(limit // 2) :]
    return f"{cut(lines[0], limit // 2)} … {last}"
