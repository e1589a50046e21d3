"""report.md + report.html (+ PNGs) from the rows of one or more runs.

The report is a list of sections (SECTIONS, in order), each a function of the Report being
built that writes into `rep.doc` and, when the runs hold no rows for it, adds one line to
`rep.left_out` instead. Adding a plot or a table means adding a section module under
report/sections/ and one entry here. The run summary (run_info.intro) goes first, written last
so that it can list what was left out.
"""

from __future__ import annotations

import warnings
from collections import Counter
from pathlib import Path

from dsv4bench.report import plots
from dsv4bench.report.doc import Doc
from dsv4bench.report.load import load_runs, run_labels
from dsv4bench.report.sections import (
    accuracy,
    builds,
    crossover,
    failures,
    kernels,
    limits,
    measurement,
    padding,
    presets,
    run_info,
    serving,
    serving_backends,
    winners,
    workloads,
)


def _winners(rep) -> None:
    rep.images += winners.add_section(rep.doc, rep.rows, rep.out_dir)


SECTIONS = (
    serving.serving,  # TPOT and TTFT curves, the indexer's share
    serving_backends.serving_backends,  # the same points per backend, and the envelope
    presets.engine_presets,  # engines' defaults against the envelope (issue 19)
    kernels.kernels,  # kernel throughput
    _winners,  # which backend is fastest per shape (report/sections/winners.py)
    accuracy.accuracy,
    limits.crash_boundary,
    builds.builds,  # instances of one backend side by side (two FlashMLA builds)
    crossover.crossover,  # TP x route crossover: decode routes vs sparse prefill
    padding.head_padding,
    workloads.workloads,  # time vs index locality, ragged vs uniform, the long-context curve
    measurement.measurement,  # profiler agreement, graph vs eager, memory, determinism
    run_info.environment,
    failures.failures,
)


def build_report(run_dirs: list[Path], out_dir: Path) -> list[Path]:
    """Write report.md, report.html and their PNGs into out_dir; returns the written files."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = load_runs([Path(p) for p in run_dirs])
    report = Report(rows, out_dir, [Path(p) for p in run_dirs])
    doc = report.build()
    md = out_dir / "report.md"
    md.write_text(doc.to_markdown())
    page = out_dir / "report.html"
    page.write_text(doc.to_html())
    return [md, page, *report.images]


class Report:
    """What every section reads (rows, runs) and writes (doc, images, left_out)."""

    def __init__(self, rows: list[dict], out_dir: Path, paths: list[Path]):
        self.rows = rows
        self.out_dir = out_dir
        self.paths = paths
        self.images: list[Path] = []
        self.runs = run_labels(paths)
        self.multi_run = len({p.resolve() for p in paths}) > 1
        self.left_out: list[str] = []
        self.doc = Doc("dsv4bench report")

    def who(self, row: dict) -> str:
        """Backend name, with the run when several runs are shown together."""
        b = row.get("backend") or "?"
        return f"{b} [{row['_run']}]" if self.multi_run else b

    def save(self, fig, name: str) -> Path:
        path = self.out_dir / f"{name}.png"
        plots.save(fig, path)
        self.images.append(path)
        return path

    def build(self) -> Doc:
        body = Doc(self.doc.title)
        self.doc = body
        # what matplotlib warns of (a layout it could not apply) goes into the report, not onto
        # the terminal of a command that succeeded
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            for section in SECTIONS:
                section(self)
        said = Counter(f"{w.category.__name__}: {w.message}" for w in warned)
        for text, n in said.items():
            self.left_out.append(f"Plots: matplotlib warned {n}x: {text}")
        intro = Doc(body.title)
        self.doc = intro
        run_info.intro(self)
        intro.blocks += body.blocks
        return intro
