"""`dsv4bench report`, `compare`, `backends` and `env`: the commands that read what exists."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

from dsv4bench.commands.common import UsageError, setup_backends

# where report and compare write unless told: a folder of the current directory, never the run
# they read (a committed run stays as it was committed); --in-place writes beside the rows
REPORTS = Path("reports")


def cmd_backends(args) -> int:
    from dsv4bench import backends
    from dsv4bench.commands.found import kernels_found
    from dsv4bench.commands.isolated import Isolated, in_process

    setup_backends(args)
    table = []
    child = Isolated(args.plugin)  # kernel libraries load there: one may end its process
    try:
        for name in backends.names():
            b = backends.get(name)
            layouts = "any" if b.layouts is None else ",".join(b.layouts) or "-"
            found = kernels_found(b) if in_process(b) else child.found(name)
            table.append((name, ",".join(b.archs), ",".join(b.ops), layouts, found))
    finally:
        child.close()
    head = ("backend", "archs", "ops", "layouts", "kernels found")
    widths = [max(len(r[i]) for r in [head, *table]) for i in range(4)]
    for r in [head, *table]:
        print("  ".join(f"{c:<{w}}" for c, w in zip(r, widths, strict=False)) + "  " + r[4])
    return 0


def cmd_recommend(args) -> int:
    from dsv4bench.report import ReportInputError
    from dsv4bench.report.load import load_runs
    from dsv4bench.serving import recommend

    if args.tp < 1:
        raise UsageError(f"--tp {args.tp}: expected a positive tensor-parallel size")
    try:
        rows = load_runs([Path(p) for p in args.run_dir])
    except ReportInputError as e:
        raise UsageError(str(e)) from None
    try:
        text = recommend.lines(rows, args.model, args.tp)
    except recommend.NothingToRank as e:
        if e.detail:
            print("\n".join(e.detail))
        raise UsageError(str(e)) from None
    print("\n".join(text))
    return 0


def cmd_report(args) -> int:
    from dsv4bench.report import ReportInputError, build_report
    from dsv4bench.report.load import run_label

    for path in args.run_dir:
        if holds_no_rows(Path(path)):  # a report of nothing would pass for a report
            raise UsageError(f"{path}: holds no result rows (an empty results file)")
    first = Path(args.run_dir[0])
    if args.in_place:
        out = first.parent if first.is_file() else first
    else:
        out = Path(args.out) if args.out else REPORTS / run_label(first)
    try:
        files = build_report([Path(p) for p in args.run_dir], out)
    except ReportInputError as e:
        raise UsageError(str(e)) from None
    print("\n".join(str(f) for f in files if f.suffix in (".md", ".html")))
    return 0


def holds_no_rows(path: Path) -> bool:
    """A results file (or a run directory whose results files are) without a single line: a
    run killed before its first row, an emptied file. A report has nothing to say of one, and
    compare refuses one as BASE or NEW (report/compare.py): exit 2 either way."""
    from dsv4bench.report.load import SERVING_FILE
    from dsv4bench.rows.results import rows_file

    files = [rows_file(path), path / SERVING_FILE] if path.is_dir() else [path]
    present = [f for f in files if f.is_file()]
    if not present or any(f.name.endswith(".json") for f in present):
        return False  # nothing there (load says so), or a pytest-benchmark file
    return not any(_text(f).strip() for f in present)


def _text(path: Path) -> bytes:
    """A results file's bytes, a .gz one unpacked (a 0-byte .gz holds none); a damaged .gz
    reads as holding something: the loader names what is wrong with it."""
    if not path.name.endswith(".gz"):
        return path.read_bytes()
    try:
        with gzip.open(path) as f:
            return f.read()
    except (OSError, EOFError):
        return b"damaged"


def cmd_compare(args) -> int:
    from dsv4bench.report import ReportInputError
    from dsv4bench.report.compare import compare

    if not math.isfinite(args.time_threshold) or args.time_threshold <= 0:
        # nan compares false with everything: it would turn the time gate off
        raise UsageError(
            f"--time-threshold {args.time_threshold}: expected a finite positive fraction"
        )
    if args.new is None and not args.backends:
        raise UsageError("compare: NEW is needed unless --backends A B compares two instances")
    if args.partial and args.require_base:
        raise UsageError("compare: --partial and --require-base: expected one of them")
    if args.backends and args.backends[0] == args.backends[1]:
        raise UsageError(f"--backends: expected two different instances, got {args.backends[0]}")
    new = Path(args.new or args.base)
    if args.in_place:
        out = new if new.is_dir() or not new.suffix else new.parent
    elif args.out:
        out = Path(args.out)
        out = out if out.is_dir() or not out.suffix else out.parent
    else:
        out = REPORTS / compare_name(Path(args.base), new, args.backends)
    try:
        code, files = compare(
            Path(args.base),
            new,
            out,
            time_threshold=args.time_threshold,
            backends=tuple(args.backends) if args.backends else None,
            partial=args.partial,
            require_base=args.require_base,
        )
    except ReportInputError as e:
        raise UsageError(str(e)) from None
    print(f"regression report: {next((f for f in files if f.suffix == '.md'), out)}")
    return code


def compare_name(base: Path, new: Path, backends: list[str] | None) -> str:
    """compare-BASE-vs-NEW (one run: compare-RUN), then -A-vs-B for two instances."""
    from dsv4bench.report.load import run_label

    runs = [run_label(base)] if base == new else [run_label(base), run_label(new)]
    return "compare-" + "-".join(
        ["-vs-".join(runs), *(["-vs-".join(backends)] if backends else [])]
    )


def cmd_env(args) -> int:
    from dsv4bench import env

    print(json.dumps(env.collect(), indent=2))
    return 0
