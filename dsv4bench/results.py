"""Result rows: one JSON object per (case, backend), appended as soon as it exists."""

from __future__ import annotations

import json
import os
from pathlib import Path

STATUSES = ("ok", "unsupported", "incorrect", "crash", "timeout", "oom", "error")
RESULTS_FILE = "results.jsonl"


def empty_row(case: dict, backend: str) -> dict:
    """A row with every field present; the runner fills what it learns."""
    return {
        "kind": "case",
        "scenario": case["scenario"],
        "case_id": case["case_id"],
        "op": case["op"],
        "params": case["params"],
        "tags": list(case.get("tags", [])),
        "backend": backend,
        "provider": None,
        "status": "error",
        "message": "",
        "accuracy": None,  # cos_diff, max_abs, max_rel, lse_max_abs, nonfinite
        "timing": None,  # median_ms, p10_ms, p90_ms, n, method, samples_ms, (profiler_ms)
        "derived": None,  # flops, bytes, tflops, gbps, peak_fraction
        "info": {},
        "env": None,
        "input_fingerprint": None,
    }


class ResultWriter:
    """Appends rows to RUN_DIR/results.jsonl, one line per row, flushed to disk each time."""

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / RESULTS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, row: dict) -> None:
        line = json.dumps(row, sort_keys=True, default=str)
        with open(self.path, "a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    def finished(self) -> set[tuple[str, str]]:
        """(case_id, backend) pairs already written, for --resume; limit rows count by id."""
        return {(r["case_id"], r["backend"]) for r in read_rows(self.path)}


def read_rows(path: str | Path) -> list[dict]:
    """Rows of a results.jsonl (or of RUN_DIR); a torn last line (killed writer) is skipped."""
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS_FILE
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows
