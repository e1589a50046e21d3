"""Result rows: one JSON object per (case, backend), appended as soon as it exists."""

from __future__ import annotations

import gzip
import json
import os
import sys
import zlib
from pathlib import Path

from dsv4bench import rows

RESULTS_FILE = "results.jsonl"
PACKED_FILE = RESULTS_FILE + ".gz"  # a committed run's rows, compressed: read, never written
RETRIED = ("incorrect", "crash", "timeout", "oom", "error")  # what --retry-failed runs again


class ResultWriter:
    """Appends rows to RUN_DIR/results.jsonl, one line per row, flushed to disk each time.

    A writer killed mid-row leaves a torn last line; appending after it would glue the next row
    onto the fragment. So a writer opening an existing file first repairs its tail: a fragment
    that is a whole row only lacks its newline; anything else moves to results.jsonl.torn."""

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / RESULTS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.torn: Path | None = None  # the side file, if this writer moved a fragment there
        self._repair_tail()

    def _repair_tail(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, "rb+") as f:
            data = f.read()
            if not data or data.endswith(b"\n"):
                return
            start = data.rfind(b"\n") + 1
            fragment = data[start:]
            try:
                whole = isinstance(json.loads(fragment), dict)
            except ValueError:
                whole = False
            if whole:
                f.write(b"\n")
            else:
                self.torn = self.path.with_name(RESULTS_FILE + ".torn")
                with open(self.torn, "ab") as side:
                    side.write(fragment + b"\n")
                    side.flush()
                    os.fsync(side.fileno())
                f.truncate(start)
            f.flush()
            os.fsync(f.fileno())

    def append(self, row: dict) -> None:
        """Write a row (a dict or a dsv4bench.rows record) after checking its kind's invariants."""
        record = row if isinstance(row, rows.Row) else rows.from_dict(row)
        line = json.dumps(record.checked(), sort_keys=True, default=str)
        with open(self.path, "a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    def finished(self, *, retry_failed: bool = False) -> set[tuple[str, str]]:
        """(case_id, backend) pairs already written, for --resume; limit rows count by id.
        With `retry_failed`, a case whose last row failed (not a limit probe) counts as not done."""
        last = {(r["case_id"], r["backend"]): r for r in read_rows(self.path)}
        return {
            key
            for key, r in last.items()
            if not (
                retry_failed
                and r.get("kind") == "case"
                and r.get("status") in RETRIED
                and "limit-probe" not in (r.get("tags") or [])
            )
        }


class Rows(list):
    """Rows read from a results file; `unreadable` holds the line numbers that were not rows,
    `lines` each row's line number, `torn_tail` whether the last line lacks its newline (a
    writer killed mid-row)."""

    unreadable: tuple[int, ...] = ()
    lines: tuple[int, ...] = ()
    torn_tail: bool = False


def rows_file(run_dir: str | Path) -> Path:
    """RUN_DIR's rows: results.jsonl, else a committed results.jsonl.gz (else the path
    results.jsonl would have)."""
    plain, packed = Path(run_dir) / RESULTS_FILE, Path(run_dir) / PACKED_FILE
    return packed if packed.exists() and not plain.exists() else plain


def read_checked(path: str | Path, *, torn_tail_ok: bool = False) -> Rows:
    """read_rows, refusing (RowError, one line) what is not this suite's rows: an unreadable
    line (but a torn last line when `torn_tail_ok`) or a row that breaks
    `rows.stored_problems`."""
    found = read_rows(path, quiet=True)
    where = rows_file(path) if Path(path).is_dir() else Path(path)
    bad = list(found.unreadable)
    torn = torn_tail_ok and found.torn_tail and bad and bad[-1] > max(found.lines, default=0)
    if torn:
        bad.pop()
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise rows.RowError(f"{where}:{bad[0]}: not a JSON object{more}: not a results file?")
    for number, row in zip(found.lines, found, strict=True):
        problems = rows.stored_problems(row)
        if problems:
            raise rows.RowError(f"{where}:{number}: not a result row: {'; '.join(problems)}")
    if torn:
        print(f"dsv4bench: {where}: torn last line {found.unreadable[-1]} skipped", file=sys.stderr)
    unknown = rows.unknown_kinds(found)
    if unknown:
        counted = ", ".join(f"{n} of kind {kind!r}" for kind, n in sorted(unknown.items()))
        print(
            f"dsv4bench: {where}: rows this version does not know ignored: {counted} "
            "(written by a newer dsv4bench?)",
            file=sys.stderr,
        )
    return found


def read_rows(path: str | Path, *, quiet: bool = False) -> Rows:
    """Rows of a results.jsonl (or of RUN_DIR). Lines that are not JSON objects (a torn line
    of a killed writer, a hand edit) are counted in `.unreadable` and reported on stderr
    unless `quiet`."""
    path = Path(path)
    if path.is_dir():
        path = rows_file(path)
    if not path.exists():
        return Rows()
    if path.name.endswith(".gz"):
        try:
            text = gzip.decompress(path.read_bytes()).decode(errors="replace")
        except (OSError, EOFError, zlib.error) as e:
            raise rows.RowError(f"{path}: not a readable gzip file ({e})") from None
    else:
        text = path.read_text(errors="replace")
    found = Rows()
    bad, numbers = [], []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if isinstance(row, dict):
            found.append(row)
            numbers.append(number)
        else:
            bad.append(number)
    found.unreadable, found.lines = tuple(bad), tuple(numbers)
    found.torn_tail = bool(text) and not text.endswith("\n")
    if bad and not quiet:
        shown = ", ".join(map(str, bad[:5])) + (", ..." if len(bad) > 5 else "")
        what = f"{len(bad)} unreadable line(s) skipped (line {shown})"
        print(f"dsv4bench: {path}: {what}", file=sys.stderr)
    return found
