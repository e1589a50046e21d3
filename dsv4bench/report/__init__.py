"""Reports and comparisons of result rows.

- `build_report(run_dirs, out_dir) -> list[Path]`: report.md, report.html (self-contained) and
  the PNGs beside them (dsv4bench.report.render).
- `compare.compare(base, new, out_dir, time_threshold=0.05) -> (exit_code, files)`:
  compare.md and compare-ratios.png; exit code 1 on any regression (dsv4bench.report.compare;
  its matching and rules: compare_rules, its document: compare_doc).
- `load_rows(path)`: rows of a run dir, a results.jsonl or a pytest-benchmark JSON file;
  `ReportInputError` for a path that holds none of these.
"""

from __future__ import annotations

from dsv4bench.report.load import ReportInputError, load_rows, load_runs
from dsv4bench.report.render import build_report

__all__ = ["ReportInputError", "build_report", "load_rows", "load_runs"]
