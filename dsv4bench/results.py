"""Result rows: one JSON object per (case, backend), appended as soon as it exists."""

from __future__ import annotations

import json
import os
from pathlib import Path

from dsv4bench import rows

RESULTS_FILE = "results.jsonl"


class ResultWriter:
    """Appends rows to RUN_DIR/results.jsonl, one line per row, flushed to disk each time."""

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / RESULTS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, row: dict) -> None:
        """Write a row (a dict or a dsv4bench.rows record) after checking its kind's invariants."""
        record = row if isinstance(row, rows.Row) else rows.from_dict(row)
        line = json.dumps(record.checked(), sort_keys=True, default=str)
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
