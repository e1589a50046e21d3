"""`dsv4bench history add|gate|page|export`: the run history (dsv4bench/history/)."""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path

from dsv4bench.commands.common import UsageError

HISTORY = "results/history"
THRESHOLD_HELP = (
    "a slower median (and p10) beyond this fraction of the window's regresses (default: 0.05)"
)


def add_parser(sub) -> None:
    p = sub.add_parser(
        "history", help="the run history: add runs, gate the latest, trend page, v3 export"
    )
    jobs = p.add_subparsers(dest="history_command", required=True, parser_class=type(p))
    a = jobs.add_parser(
        "add", help="add runs to the history (one entry file a run, never rewritten)"
    )
    a.add_argument("run_dir", nargs="+")
    a.add_argument("--history", default=HISTORY, metavar="DIR", help=f"default: {HISTORY}")
    a.add_argument("--label", default="", help="a short note kept with the entry (e.g. ci)")
    a.add_argument("--date", help="ISO date of the run (default: its results file's time)")
    a.add_argument("--commit", help="the commit the run measured (default: its rows' git_commit)")
    a.set_defaults(func=cmd_add)
    for name, helptext, func in (
        (
            "gate",
            "judge the latest entry against its rolling history; exit 1 on a regression",
            cmd_gate,
        ),
        ("page", "the static trend page (index.html and PNGs) of the history", cmd_page),
    ):
        g = jobs.add_parser(name, help=helptext)
        g.add_argument("--history", default=HISTORY, metavar="DIR", help=f"default: {HISTORY}")
        g.add_argument(
            "--time-threshold", type=float, default=0.05, metavar="FRACTION", help=THRESHOLD_HELP
        )
        g.add_argument(
            "--window",
            type=int,
            default=5,
            help="comparable entries a point is judged against (default: 5)",
        )
        g.add_argument(
            "--paired",
            action="store_true",
            help="judge each gated entry against the comparable entry just before it, one "
            "verdict a backend on a time relative to the run's other backends (CI's two smoke "
            "runs on one machine; dsv4bench/history/paired.py)",
        )
        g.add_argument(
            "--paired-threshold",
            type=float,
            default=0.05,
            metavar="FRACTION",
            help="--paired: a backend's median change beyond this fraction regresses (0.05)",
        )
        which = g.add_mutually_exclusive_group()
        which.add_argument("--entry", action="append", help="an entry id to gate (repeatable)")
        which.add_argument("--label", help="gate every entry of this label (e.g. ci)")
        if name == "page":
            g.add_argument("--out", required=True, metavar="DIR", help="the page's folder")
            g.add_argument(
                "--no-figures", action="store_true", help="index.html alone (CI's freshness check)"
            )
        g.set_defaults(func=func)
    e = jobs.add_parser("export", help="a run's rows as PyTorch OSS benchmark database v3 records")
    e.add_argument("run_dir")
    e.add_argument("--out", required=True, metavar="FILE", help="a JSON file (a list of records)")
    e.add_argument("--branch", default="main", help="head_branch of the records (default: main)")
    e.set_defaults(func=cmd_export)


def _history(args):
    from dsv4bench.history.store import HistoryError, entries

    if not math.isfinite(args.time_threshold) or args.time_threshold <= 0:
        raise UsageError(
            f"--time-threshold {args.time_threshold}: expected a finite positive fraction"
        )
    if not math.isfinite(args.paired_threshold) or args.paired_threshold <= 0:
        raise UsageError(
            f"--paired-threshold {args.paired_threshold}: expected a finite positive fraction"
        )
    if args.window < 1:
        raise UsageError(f"--window {args.window}: expected at least 1 entry")
    try:
        return entries(Path(args.history))
    except HistoryError as e:
        raise UsageError(str(e)) from None


def cmd_add(args) -> int:
    from dsv4bench.history.store import HistoryError, add, entry_of
    from dsv4bench.report import ReportInputError

    if args.date:
        try:
            datetime.fromisoformat(args.date)
        except ValueError:
            raise UsageError(
                f"--date {args.date}: expected an ISO date, e.g. 2026-12-05T13:40:00+00:00"
            ) from None
    made = []
    for run in args.run_dir:  # every run read first: a bad one adds nothing
        try:
            made.append(entry_of(Path(run), label=args.label, date=args.date, commit=args.commit))
        except (HistoryError, ReportInputError) as e:
            raise UsageError(str(e)) from None
    for entry in made:
        path, new = add(Path(args.history), entry)
        what = f"{len(entry.points)} points, {entry.device}, {entry.commit}"
        print(f"{'added' if new else 'already there'}: {path} ({what})")
    return 0


def _gated(args, history: list) -> list:
    """The entries the gate judges: --entry ids, --label's entries, else the latest."""
    if args.entry:
        known = {e.id: e for e in history}
        for wanted in args.entry:
            if wanted not in known:
                raise UsageError(f"--entry {wanted}: no such entry in {args.history}")
        return [known[w] for w in args.entry]
    if args.label is not None:
        chosen = [e for e in history if e.label == args.label]
        if not chosen:
            raise UsageError(f"--label {args.label}: no entry of that label in {args.history}")
        return chosen
    return [history[-1]]


def cmd_gate(args) -> int:
    """Judge the chosen entries (default: the latest) each against its own window."""
    from dsv4bench.history import paired
    from dsv4bench.history.page import gate_line
    from dsv4bench.history.trend import judge_entry

    history = _history(args)
    code = 0
    for entry in _gated(args, history):
        if args.paired:
            verdicts = paired.judge_entry(history, entry, args.paired_threshold)
        else:
            verdicts = judge_entry(history, entry, args.time_threshold, args.window)
        regressed, line = gate_line(entry, verdicts)
        code |= regressed
        print(f"history gate: {line}")
        if args.paired:
            print(f"  {paired.pair_line(history, entry, verdicts)}")
        new = sum(v.kind == "new" for v in verdicts)
        if new:
            print(f"  {new} points with no comparable history (listed, not failed)")
        for v in [v for v in verdicts if v.regression][:20]:
            print(f"  {v.kind:>8}  {v.key}  {v.detail}")
    return int(code)


def cmd_page(args) -> int:
    from dsv4bench.history import page, paired
    from dsv4bench.history.trend import judge_all

    history = _history(args)
    verdicts = judge_all(history, args.time_threshold, args.window)
    gated = _gated(args, history)
    rule = None
    if args.paired:  # the gated entries by the paired rule, the others by the window's
        for entry in gated:
            verdicts[entry.id] = paired.judge_entry(history, entry, args.paired_threshold)
        rule = paired.page_rule(history, gated, args.paired_threshold)
    index = page.write(
        history,
        verdicts,
        Path(args.out),
        args.time_threshold,
        args.window,
        gated,
        draw=not args.no_figures,
        rule=rule,
    )
    print(f"trend page: {index}")
    return 0


def cmd_export(args) -> int:
    from dsv4bench.history.export import records
    from dsv4bench.history.store import HistoryError
    from dsv4bench.report import ReportInputError

    try:
        found = records(Path(args.run_dir), args.branch)
    except (HistoryError, ReportInputError) as e:
        raise UsageError(str(e)) from None
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(found, indent=1) + "\n")
    print(f"{len(found)} v3 records: {out}")
    return 0
