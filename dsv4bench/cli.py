"""dsv4bench command line: plan, run, bench, merge, backends, env, kernels, envelope, import,
slurm, history (and report/compare).

The parser and the exit codes; each job lives in dsv4bench/commands/."""

from __future__ import annotations

import argparse
import signal
import sys

from dsv4bench.cases.case import ARCHS
from dsv4bench.commands import envelope as envelope_command
from dsv4bench.commands import history as history_command
from dsv4bench.commands import imports as import_command
from dsv4bench.commands import interop as interop_command
from dsv4bench.commands import kernels as kernels_command
from dsv4bench.commands import slurm as slurm_command
from dsv4bench.commands.common import UsageError
from dsv4bench.commands.common import load as _load  # noqa: F401 (tests read scenarios with it)
from dsv4bench.commands.merge import cmd_merge
from dsv4bench.commands.plan import cmd_plan
from dsv4bench.commands.read import (
    cmd_backends,
    cmd_compare,
    cmd_env,
    cmd_recommend,
    cmd_report,
)
from dsv4bench.commands.run import cmd_bench, cmd_run
from reference.models import MODELS

SCENARIO_HELP = "scenario YAML files (scenarios/*/*.yaml; op: serving files too)"
PLUGIN_HELP = "a module (or .py file) that registers more backends (repeatable)"


class Terminated(Exception):
    """SIGTERM: unwinds like Ctrl-C, so that workers are stopped and written rows stay."""


def _terminate(signum, frame):
    raise Terminated


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE", help=PLUGIN_HELP)
    p.add_argument(
        "--backend-opt",
        action="append",
        metavar="NAME.OPTION=VALUE",
        help="a backend's own option, e.g. flashmla.lib=PATH or flashinfer.kv_dtype=e4m3",
    )
    p.add_argument(
        "--flashmla-lib",
        metavar="PATH",
        help="same as --backend-opt flashmla.lib=PATH (default: $DSV4BENCH_FLASHMLA_LIB)",
    )
    p.add_argument(
        "--backend", action="append", metavar="NAME", help="only these backends (repeatable)"
    )
    p.add_argument("--debug", action="store_true", help="tracebacks instead of one-line errors")


def _run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--arch",
        choices=ARCHS,
        help="the architecture to run on (default: this machine's, and then a scenario whose "
        "`arch` leaves it out is refused)",
    )
    p.add_argument("--out", metavar="RUN_DIR", help="where rows go (default: RUNS/<time>-<arch>)")
    p.add_argument(
        "--runs", default="runs", help="parent of default run directories (default: runs)"
    )
    p.add_argument("--resume", action="store_true", help="skip jobs RUN_DIR already has")
    p.add_argument(
        "--retry-failed",
        action="store_true",
        help="with --resume: run again the cases whose last row failed (incorrect, crash, ...)",
    )
    p.add_argument("--force", action="store_true", help="start over in an existing RUN_DIR")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument(
        "--gpus",
        metavar="all|I,J,...",
        help="one worker per GPU, jobs to whichever is free (bench: all by default)",
    )
    p.add_argument(
        "--shard",
        metavar="I/N",
        help="run shard I of N (split by expected cost; `dsv4bench merge` joins them)",
    )


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line and exit 2, as for every other bad input
        self.exit(2, f"{self.prog}: {message}\n")


EXIT_STATUS = """exit status:
  0  done; run/bench: every case ok, unsupported, or failed where a failure is the result
     (limit-search probes, cases tagged expect-failure)
  1  run/bench: a case was incorrect, errored outside a limit search, or crashed, timed out
     or ran out of memory unexpectedly (all rows are still written); compare: a regression
  2  bad input (scenario, flags, paths) or an I/O error; nothing written is lost
  130, 143  interrupted (Ctrl-C, SIGTERM): rows written so far are kept; --resume goes on"""


def _version() -> str:
    """The installed distribution's version, else pyproject.toml's (a checkout run in place)."""
    from importlib import metadata
    from pathlib import Path

    try:
        return metadata.version("dsv4bench")
    except metadata.PackageNotFoundError:
        pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
        for line in pyproject.read_text().splitlines():
            if line.startswith("version ="):
                return line.split("=", 1)[1].strip().strip('"')
    return "unknown"


def parser() -> argparse.ArgumentParser:
    top = _Parser(
        prog="dsv4bench",
        description=__doc__,
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    top.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = top.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_run_jobs(sub)
    _add_result_jobs(sub)
    kernels_command.add_parser(sub)
    envelope_command.add_parser(sub, _common)
    import_command.add_parser(sub)
    interop_command.add_parser(sub)
    slurm_command.add_parser(sub, _common)
    history_command.add_parser(sub)
    return top


def _add_run_jobs(sub) -> None:
    """plan, run, bench."""
    p = sub.add_parser("plan", help="list every job and each backend's verdict (no GPU needed)")
    p.add_argument("scenario", nargs="+", help=SCENARIO_HELP)
    p.add_argument(
        "--arch", choices=ARCHS, help="plan for this architecture (default: this machine's GPU)"
    )
    p.add_argument("--shard", metavar="I/N", help="only the jobs of shard I of N")
    _common(p)
    p.set_defaults(func=cmd_plan)
    p = sub.add_parser(
        "run",
        help="run scenarios into RUN_DIR/results.jsonl",
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("scenario", nargs="+", help=SCENARIO_HELP)
    _common(p)
    _run_options(p)
    p.set_defaults(func=cmd_run)
    p = sub.add_parser(
        "bench",
        help="the present GPU's scenario set (smoke.yaml on a CPU)",
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(p)
    _run_options(p)
    p.set_defaults(func=cmd_bench)


def _add_result_jobs(sub) -> None:
    """merge, backends, report (and _add_comparing_jobs): the jobs that read what runs wrote."""
    p = sub.add_parser(
        "merge",
        help="join shard run directories into one (refuses mixed GPU models or builds)",
    )
    p.add_argument("run_dir", nargs="+", help="the shards' run directories")
    p.add_argument("--out", metavar="RUN_DIR", required=True)
    p.add_argument(
        "--allow-mixed",
        action="store_true",
        help="merge rows of different GPU models or kernel builds anyway",
    )
    p.add_argument(
        "--partial",
        action="store_true",
        help="merge the shards given though some are missing (merged.json lists them)",
    )
    p.add_argument(
        "--serving",
        action="append",
        metavar="FILE",
        help="serving scenario whose TTFT/TPOT points to compute from the merged rows",
    )
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE", help=PLUGIN_HELP)
    p.add_argument(
        "--backend-opt",
        action="append",
        metavar="NAME.OPTION=VALUE",
        help="a backend's own option, for the serving points' backends",
    )
    p.add_argument("--flashmla-lib", metavar="PATH", help=argparse.SUPPRESS)
    p.add_argument("--debug", action="store_true")
    p.set_defaults(func=cmd_merge)
    p = sub.add_parser("backends", help="registered backends and the kernels they found")
    _common(p)
    p.set_defaults(func=cmd_backends)
    p = sub.add_parser("report", help="report.md, report.html and plots from run directories")
    p.add_argument("run_dir", nargs="+", help="run directories, results.jsonl or benchmark JSON")
    _add_output(p, "the first RUN_DIR (or its folder)")
    p.add_argument("--debug", action="store_true")
    p.set_defaults(func=cmd_report)
    _add_comparing_jobs(sub)


def _add_output(p, run_folder: str) -> None:
    """--out DIR or --in-place: a run is only read unless its own folder is asked for."""
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--out", metavar="DIR", help="where to write (default: reports/<run name>/ here)"
    )
    where.add_argument(
        "--in-place", action="store_true", help=f"write into {run_folder}, beside the rows"
    )


def _add_comparing_jobs(sub) -> None:
    """compare, recommend, env."""
    p = sub.add_parser(
        "compare",
        help="regression report BASE -> NEW; exit 1 on a regression",
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("base")
    p.add_argument("new", nargs="?", help="default with --backends: BASE (one run, two instances)")
    p.add_argument(
        "--backends",
        nargs=2,
        metavar=("A", "B"),
        help="compare backend instance A (of BASE) with instance B (of NEW), e.g. two builds",
    )
    _add_output(p, "NEW's directory")
    p.add_argument(
        "--time-threshold",
        type=float,
        default=0.05,
        metavar="FRACTION",
        help="a slower median beyond this fraction (and the noise) regresses (default: 0.05)",
    )
    p.add_argument(
        "--partial",
        action="store_true",
        help="NEW covers part of BASE by design (a shard, a subset): cases it lacks are listed, "
        "not regressions",
    )
    p.add_argument(
        "--require-base",
        action="store_true",
        help="a case NEW has that BASE lacks is a regression: a baseline behind its scenario "
        "fails until the change that adds the job refreshes it",
    )
    p.add_argument("--debug", action="store_true")
    p.set_defaults(func=cmd_compare)
    p = sub.add_parser(
        "recommend",
        help="per phase: the fastest correct backend measured, its engine flags, the gain over "
        "each engine's default (from serving rows)",
    )
    p.add_argument("run_dir", nargs="+", help="run directories holding serving rows")
    p.add_argument("--model", required=True, choices=sorted(MODELS))
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size of the rows (default 1)")
    p.add_argument("--debug", action="store_true")
    p.set_defaults(func=cmd_recommend)
    p = sub.add_parser("env", help="GPU, driver and library versions")
    p.set_defaults(func=cmd_env)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `dsv4bench plan ... | head` ends quietly
    signal.signal(signal.SIGTERM, _terminate)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser().parse_args(argv)
    args.argv = argv  # command.txt records it
    try:
        return args.func(args)
    except UsageError as e:
        if getattr(args, "debug", False):
            raise
        print(f"dsv4bench: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # rows written so far stay; --resume goes on from them
        print("\ndsv4bench: interrupted (results written so far are kept)", file=sys.stderr)
        return 130
    except OSError as e:  # a disk that is full or read-only, a path that is a file
        if getattr(args, "debug", False):
            raise
        where = f"{e.filename}: " if e.filename else ""
        print(f"dsv4bench: {where}{e.strerror or e}", file=sys.stderr)
        return 2
    except Terminated:
        print("\ndsv4bench: terminated (results written so far are kept)", file=sys.stderr)
        return 128 + signal.SIGTERM


if __name__ == "__main__":
    sys.exit(main())
