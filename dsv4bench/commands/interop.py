"""`dsv4bench export FORMAT RUN_DIR --out DIR` and `dsv4bench import flashinfer-bench DIR`: runs
of this suite in a peer's format, a peer's definitions as a scenario here (dsv4bench/interop/;
the `import` group itself is commands/imports.py)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from dsv4bench.commands.common import UsageError, check_out_file

FORMATS = ("flashinfer-bench",)


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="a run folder in a peer's format (flashinfer-bench)")
    p.add_argument("format", choices=FORMATS)
    p.add_argument("run_dir", help="a run folder (results.jsonl)")
    p.add_argument("--out", required=True, metavar="DIR", help="the TraceSet folder to write")
    p.add_argument(
        "--max-dump-mib",
        type=float,
        default=256.0,
        metavar="MIB",
        help="write a case's input tensors only up to this size (default 256; 0: none)",
    )
    p.add_argument(
        "--force", action="store_true", help="write into an --out folder that holds files already"
    )
    p.add_argument("--debug", action="store_true")
    p.set_defaults(func=cmd_export)


def add_import_parser(verbs) -> None:
    """`import flashinfer-bench DIR`: a verb of the `import` group."""
    p = verbs.add_parser(
        "flashinfer-bench", help="flashinfer-bench definitions and workloads as a scenario"
    )
    p.add_argument("dir", help="their TraceSet folder (definitions/, workloads/)")
    p.add_argument("--out", metavar="SCENARIO.yaml", help="where to write (default: stdout)")
    p.add_argument("--force", action="store_true", help="overwrite an existing --out file")
    p.add_argument("--name", help="the scenario's name (default: from DIR)")
    p.set_defaults(func=cmd_import)


def cmd_export(args: argparse.Namespace) -> int:
    from dsv4bench.interop.flashinfer_bench.export import export
    from dsv4bench.report.load import ReportInputError

    run_dir = Path(args.run_dir)
    if not run_dir.exists():
        raise UsageError(f"{run_dir}: no such run folder")
    if not math.isfinite(args.max_dump_mib) or args.max_dump_mib < 0:  # nan: every test false
        raise UsageError(f"--max-dump-mib {args.max_dump_mib}: expected a size >= 0 (0: none)")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: is a file, not a folder")
    if out.is_dir() and any(out.iterdir()) and not args.force:  # theirs and ours would mix
        raise UsageError(f"--out {out}: holds files already; name an empty folder (or --force)")
    try:
        done = export(run_dir, Path(args.out), args.max_dump_mib)
    except (ReportInputError, ValueError) as e:
        raise UsageError(f"export {args.format}: {e}") from None
    print(
        f"{args.out}: {done.definitions} definitions, {done.workloads} workloads "
        f"({done.dumped} with tensors), {done.solutions} solutions, {done.traces} traces"
    )
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from dsv4bench import backends, scenarios
    from dsv4bench.interop.flashinfer_bench.import_ import scenario
    from dsv4bench.scenarios.read import dump

    root = Path(args.dir)
    if not root.is_dir():
        raise UsageError(f"{root}: no such folder")
    check_out_file(args.out, [root], args.force)
    backends.setup([])
    try:
        bases = sorted({backends.get(b).base for b in backends.catalog()})
        data = scenario(root, bases, args.name)
    except ValueError as e:  # their pydantic ValidationError is one too
        raise UsageError(f"import {args.format}: {str(e).splitlines()[0]}") from None
    text = dump(data)
    try:  # what is written must load as it is
        scenarios.load_text(text, args.out or "<imported>", known_backends=backends.catalog())
    except scenarios.ScenarioError as e:
        raise UsageError(
            f"import {args.format}: {root}: the scenario would not load: {e}"
        ) from None
    if args.out:
        Path(args.out).write_text(text)
        print(f"{args.out}: {len(data['cases'])} cases (dsv4bench run {args.out})")
    else:
        print(text, end="")
    return 0
