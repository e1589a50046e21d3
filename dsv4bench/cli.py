"""dsv4bench command line: plan, run, bench, merge, backends, env (and report/compare)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import signal
import sys
import time
from pathlib import Path

from dsv4bench.cases.case import ARCHS

ROOT = Path(__file__).resolve().parent.parent
SCENARIO_DIR = ROOT / "scenarios"
SMOKE = SCENARIO_DIR / "smoke.yaml"


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


class Terminated(Exception):
    """SIGTERM: unwinds like Ctrl-C, so that workers are stopped and written rows stay."""


def _terminate(signum, frame):
    raise Terminated


def _setup_backends(args) -> None:
    """Registered backends, then `--backend-opt NAME.OPTION=VALUE` (and its aliases) on them."""
    from dsv4bench import backends

    opts = list(args.backend_opt or [])
    if args.flashmla_lib:  # older spelling of --backend-opt flashmla.lib=PATH
        opts.insert(0, f"flashmla.lib={args.flashmla_lib}")
    try:
        backends.setup(args.plugin)
        backends.apply_options(opts)
    except backends.PluginError as e:
        raise UsageError(str(e)) from None


def _load(paths: list[str], only_backends: list[str] | None, archs: dict | None = None):
    """Scenarios -> (jobs, limit searches, serving specs); all validated before anything runs.
    `archs`, if given, gets each scenario's `arch` list by scenario name."""
    from dsv4bench import backends, scenarios, serving
    from dsv4bench.run.runner import Job

    known = backends.names()
    for name in only_backends or []:
        if name not in known:
            raise UsageError(f"--backend {name}: unknown backend (known: {', '.join(known)})")
    # --backend NAME takes its instances too (flashmla -> flashmla-0.33)
    wanted = lambda b: not only_backends or {b, backends.get(b).base} & set(only_backends)
    jobs, limits, specs = [], [], []
    for path in dict.fromkeys(paths):  # a file named twice runs once
        _check_scenario_path(Path(path))
        try:
            entry = scenarios.load_any(path, known_backends=backends.catalog())
            if isinstance(entry, scenarios.Scenario):
                backends.configure_all(entry.instances)
        except (scenarios.ScenarioError, backends.PluginError) as e:
            raise UsageError(str(e)) from None
        if isinstance(entry, serving.ServingSpec):
            specs.append(entry)
            if archs is not None:  # serving files name no arch: every one
                archs[entry.scenario] = list(ARCHS)
            jobs += [Job(case, b) for case, b in serving.jobs_for(entry) if wanted(b)]
            continue
        if archs is not None:
            archs[entry.name] = list(entry.arch)
        jobs += [Job(case, b) for case, b in entry.jobs() if wanted(b)]
        limits += [lim for lim in entry.limits if wanted(lim.backend)]
    _check_backends_used(only_backends, jobs, limits)
    return _unique(jobs, lambda j: (j.case.case_id, j.backend)), limits, specs


def _check_scenario_path(path: Path) -> None:
    """What is not a regular file is a one-line UsageError (the loader reads and decodes it)."""
    if not path.exists():
        raise UsageError(f"{path}: no such scenario file")
    if path.is_dir():
        raise UsageError(f"{path}: is a directory, not a scenario file (name its *.yaml files)")
    if not path.is_file():  # a FIFO or a device: reading it could block forever
        raise UsageError(f"{path}: not a regular file, not a scenario file")


def _unique(items: list, key) -> list:
    """The first of each key: the same scenario (or case) given twice runs once."""
    seen: dict = {}
    for item in items:
        seen.setdefault(key(item), item)
    return list(seen.values())


def _check_backends_used(only: list[str] | None, jobs: list, limits: list) -> None:
    """--backend NAME that no scenario runs is a mistake, not "nothing to do"."""
    from dsv4bench import backends

    used = {j.backend for j in jobs} | {lim.backend for lim in limits}
    used |= {backends.get(b).base for b in used}
    for name in only or []:
        if name not in used:
            raise UsageError(f"--backend {name}: no job of these scenarios runs on it")


def _serving_rows(specs, writer) -> int:
    """Serving rows (TTFT/TPOT points) from the run's case and limit rows; returns the count."""
    from dsv4bench import serving
    from dsv4bench.rows.results import read_rows

    rows = read_rows(writer.path)
    written = 0
    for spec in specs:
        attention = spec.backends[0] if spec.backends else None
        safe = serving.safe_limit_from_rows(rows, model=spec.model, backend=attention)
        if "safe" in spec.routes and safe is None:
            print(
                f"{spec.scenario}: no measured decode-route limit: route 'safe' left out",
                file=sys.stderr,
            )
            spec = dataclasses.replace(spec, routes=[r for r in spec.routes if r != "safe"])
        for row in serving.aggregate(serving.plan(spec, safe_limit=safe), rows):
            writer.append(row)
            written += 1
    return written


def _arch(wanted: str | None, flag: str) -> str:
    """The architecture to run on: `wanted` (cpu, or this machine's GPU) or what is present."""
    from dsv4bench.measure import hardware

    present = hardware.arch_of(0)
    if wanted and wanted not in ("cpu", present):
        has = "has no GPU" if present == "cpu" else f"has an {present} GPU"
        raise UsageError(f"{flag}: this machine {has}")
    return wanted or present


def _prepare_out(out: Path, *, resume: bool, force: bool) -> None:
    from dsv4bench.rows.results import RESULTS_FILE

    if resume and force:
        raise UsageError("--resume goes on in RUN_DIR, --force starts over: pass one of them")
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: is a file, not a run directory")
    results = out / RESULTS_FILE
    if results.exists() and not (resume or force):
        raise UsageError(f"{out}: already holds results; pass --resume to continue or --force")
    if results.exists() and force and not resume:
        # the whole earlier run (rows, reports, plots) goes aside: no old plot beside new rows
        kept = out / f"{EARLIER}{time.strftime('%Y%m%d-%H%M%S')}"
        kept.mkdir()
        for item in sorted(out.iterdir()):
            if not item.name.startswith(EARLIER):
                shutil.move(item, kept / item.name)
        print(f"--force: the earlier run moved to {kept}", file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)


EARLIER = "earlier-"  # --force's folder for a run directory's previous contents


def _record_command(out: Path, resume: bool, argv: list[str]) -> None:
    """command.txt: the command that made the run; a --resume adds its own line."""
    line = " ".join(["dsv4bench", *argv]) + "\n"
    with open(out / "command.txt", "a" if resume else "w") as f:
        f.write(line)


def _default_out(runs: str, arch: str) -> Path:
    return Path(runs) / f"{time.strftime('%Y%m%d-%H%M%S')}-{arch}"


def _plan_archs(wanted: str | None, scenario_archs: list[str]) -> tuple[list[str], str]:
    """The architectures to plan for and why: --arch, else this machine's GPU, else (no GPU)
    the architectures the scenario names."""
    from dsv4bench.measure import hardware

    if wanted:
        return [wanted], "--arch"
    present = hardware.arch_of(0)
    if present != "cpu":
        return [present], "this machine's GPU"
    return scenario_archs, "the scenario's arch; this machine has no GPU"


def cmd_plan(args) -> int:
    from dsv4bench import backends

    _setup_backends(args)
    archs_of: dict[str, list[str]] = {}
    part = _shard(args.shard)
    jobs, limits, _specs = _load(args.scenario, args.backend, archs_of)
    if part is not None:
        jobs, limits = _take_shard(part, jobs, limits)
    counts: dict[tuple[str, str], int] = {}
    why_of: dict[str, str] = {}
    for job in jobs:
        archs, why_of[job.case.scenario] = _plan_archs(args.arch, archs_of[job.case.scenario])
        for arch in archs:
            reason = backends.get(job.backend).supports(job.case, arch)
            verdict = "unsupported" if reason else "supported"
            counts[(arch, verdict)] = counts.get((arch, verdict), 0) + 1
            line = f"{job.case.case_id:<60} {job.backend:<10} {arch:<6} {verdict}"
            print(line + (f": {reason}" if reason else ""))
    for lim in limits:
        step = f" step {lim.step}" if lim.step > 1 else ""
        print(f"limit {lim.axis} in [{lim.lo}, {lim.hi}){step} {lim.backend}: {lim.base.case_id}")
    for arch in dict.fromkeys(a for a, _ in counts):
        summary = ", ".join(f"{n} {v}" for (a, v), n in sorted(counts.items()) if a == arch)
        print(f"on {arch}: {summary}")
    whys = "; ".join(f"{name}: {why}" for name, why in why_of.items())
    print(f"{len(jobs)} jobs, {len(limits)} limit searches; planned for {whys or 'nothing'}")
    return 0


def _devices(spec: str | None, arch: str):
    """The worker slots: `--gpus` (all, or indices), else one unpinned slot as always."""
    from dsv4bench.run import devices

    if spec is None:
        return devices.default(arch)
    present = devices.visible_gpus()
    if present and arch == "cpu":
        raise UsageError(f"--gpus {spec}: goes with a GPU run, not --arch cpu")
    try:
        chosen = devices.select(spec, present)
    except devices.DeviceError as e:
        raise UsageError(str(e)) from None
    for d in chosen:
        if d.arch != arch:
            raise UsageError(f"--gpus {spec}: GPU {d.index} is {d.arch}, not {arch}")
    return chosen


def _shard(text: str | None):
    from dsv4bench.run import shard

    if text is None:
        return None
    try:
        return shard.parse(text)
    except shard.ShardError as e:
        raise UsageError(str(e)) from None


def _take_shard(part, jobs: list, limits: list) -> tuple[list, list]:
    """The jobs and limit searches of shard `part`, with a line saying what it holds."""
    from dsv4bench.run import shard

    mine_jobs, mine_limits = shard.select(jobs, limits, part)
    total = shard.total_ms([*jobs, *limits])
    mine = shard.total_ms([*mine_jobs, *mine_limits])
    print(
        f"shard {part}: {len(mine_jobs)} of {len(jobs)} jobs, {len(mine_limits)} of "
        f"{len(limits)} limit searches (expected {mine / 60000:.1f} of {total / 60000:.1f} "
        "GPU-minutes)",
        file=sys.stderr,
    )
    return mine_jobs, mine_limits


def _run(args, paths: list[str]) -> int:
    from dsv4bench.rows.results import ResultWriter, read_rows
    from dsv4bench.run.runner import Runner, unexpected_failures

    if args.retry_failed and not args.resume:
        raise UsageError("--retry-failed goes with --resume")
    part = _shard(args.shard)
    _setup_backends(args)
    jobs, limits, specs = _load(paths, args.backend)
    arch = _arch(args.arch, f"--arch {args.arch}")
    slots = _devices(args.gpus, arch)
    if part is not None:
        jobs, limits = _take_shard(part, jobs, limits)
    if args.out is not None and not args.out.strip():
        raise UsageError("--out '': expected a run directory")
    out = Path(args.out) if args.out else _default_out(args.runs, arch)
    _prepare_out(out, resume=args.resume, force=args.force)
    _record_command(out, args.resume, args.argv)
    where = arch if args.gpus is None else f"{arch}, GPUs {','.join(d.label for d in slots)}"
    print(f"{len(jobs)} jobs, {len(limits)} limit searches on {where} -> {out}", file=sys.stderr)
    runner = Runner(
        ResultWriter(out),
        arch=arch,
        plugins=args.plugin,
        progress=not args.quiet,
        devices=slots,
        shard=str(part) if part else None,
    )
    writer = runner.writer
    if writer.torn:
        print(f"{writer.path}: torn last line moved to {writer.torn}", file=sys.stderr)
    rows = runner.run(jobs, limits, resume=args.resume, retry_failed=args.retry_failed)
    if specs and part is not None:  # a shard holds some of the kernel rows a curve sums
        print(
            "serving: TTFT/TPOT points come from all shards: `dsv4bench merge ... --serving FILE`",
            file=sys.stderr,
        )
    elif specs:
        print(f"serving: {_serving_rows(specs, writer)} TTFT/TPOT points", file=sys.stderr)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "nothing to do"
    print(f"results: {out / 'results.jsonl'} ({summary})")
    failed = unexpected_failures(read_rows(writer.path))
    if failed:
        kinds = sorted({r["status"] for r in failed})
        first = failed[0]
        print(
            f"dsv4bench: {len(failed)} case(s) failed ({', '.join(kinds)}), e.g. "
            f"{first['case_id']} {first['backend']}: {first['status']}",
            file=sys.stderr,
        )
        return 1
    return 0


def cmd_run(args) -> int:
    return _run(args, args.scenario)


def cmd_bench(args) -> int:
    """The main job: the present GPU's scenario set, or the CPU smoke scenario without one."""
    arch = _arch(args.arch, f"make bench ARCH={args.arch}")
    if arch == "cpu":
        paths = [str(SMOKE)]
    else:
        paths = sorted(str(p) for p in (SCENARIO_DIR / arch).glob("*.yaml"))
        if not paths:
            raise UsageError(f"no scenarios for {arch} under {SCENARIO_DIR / arch}")
    args.arch = arch
    if args.gpus is None and arch != "cpu":  # every GPU this process sees (one: as before)
        args.gpus = _bench_gpus()
    return _run(args, paths)


def _bench_gpus() -> str:
    """bench's default: every visible GPU of GPU 0's model (one model per run)."""
    from dsv4bench.run import devices

    present = devices.visible_gpus()
    same = [d for d in present if d.name == present[0].name] if present else []
    if len(same) < len(present):
        left = ",".join(str(d.index) for d in present if d not in same)
        print(f"bench: GPU(s) {left} left out: not {same[0].name}", file=sys.stderr)
    return ",".join(str(d.index) for d in same) or "all"


def cmd_merge(args) -> int:
    from dsv4bench.rows.results import ResultWriter
    from dsv4bench.run import merge

    out = Path(args.out)
    command = " ".join(["dsv4bench", *args.argv])
    try:
        record = merge.merge(
            [Path(p) for p in args.run_dir], out, allow_mixed=args.allow_mixed, command=command
        )
    except merge.MergeError as e:
        raise UsageError(str(e)) from None
    rows = sum(p["rows"] for p in record["parts"])
    print(f"merged {len(record['parts'])} run(s), {rows} rows -> {out / 'results.jsonl'}")
    if args.serving:
        _setup_backends(args)
        _jobs, _limits, specs = _load(args.serving, None)
        print(
            f"serving: {_serving_rows(specs, ResultWriter(out))} TTFT/TPOT points",
            file=sys.stderr,
        )
    return 0


def cmd_backends(args) -> int:
    from dsv4bench import backends

    _setup_backends(args)
    table = []
    for name in backends.names():
        b = backends.get(name)
        try:
            prov = b.provider()
            found = f"{prov.name} {prov.version}".strip()
        except backends.Unsupported as e:
            found = f"not available: {e}"
        table.append((name, ",".join(b.archs), ",".join(b.ops), found))
    head = ("backend", "archs", "ops", "kernels found")
    widths = [max(len(r[i]) for r in [head, *table]) for i in range(3)]
    for r in [head, *table]:
        print("  ".join(f"{c:<{w}}" for c, w in zip(r, widths, strict=False)) + "  " + r[3])
    return 0


def cmd_report(args) -> int:
    from dsv4bench.report import ReportInputError, build_report

    first = Path(args.run_dir[0])
    out = Path(args.out) if args.out else (first.parent if first.is_file() else first)
    try:
        files = build_report([Path(p) for p in args.run_dir], out)
    except ReportInputError as e:
        raise UsageError(str(e)) from None
    print("\n".join(str(f) for f in files if f.suffix in (".md", ".html")))
    return 0


def cmd_compare(args) -> int:
    from dsv4bench.report import ReportInputError
    from dsv4bench.report.compare import compare

    if args.time_threshold <= 0:
        raise UsageError(f"--time-threshold {args.time_threshold}: expected a positive fraction")
    if args.new is None and not args.backends:
        raise UsageError("compare: NEW is needed unless --backends A B compares two instances")
    if args.backends and args.backends[0] == args.backends[1]:
        raise UsageError(f"--backends: expected two different instances, got {args.backends[0]}")
    new = Path(args.new or args.base)
    out = Path(args.out) if args.out else new
    out = out if out.is_dir() or not out.suffix else out.parent
    try:
        code, files = compare(
            Path(args.base),
            new,
            out,
            time_threshold=args.time_threshold,
            backends=tuple(args.backends) if args.backends else None,
            partial=args.partial,
        )
    except ReportInputError as e:
        raise UsageError(str(e)) from None
    print(f"regression report: {next((f for f in files if f.suffix == '.md'), out)}")
    return code


def cmd_env(args) -> int:
    from dsv4bench import env

    print(json.dumps(env.collect(), indent=2))
    return 0


SCENARIO_HELP = "scenario YAML files (scenarios/*/*.yaml; op: serving files too)"
PLUGIN_HELP = "a module (or .py file) that registers more backends (repeatable)"


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
        "--arch", choices=ARCHS, help="the architecture to run on (default: this machine's)"
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

    try:
        return metadata.version("dsv4bench")
    except metadata.PackageNotFoundError:
        for line in (ROOT / "pyproject.toml").read_text().splitlines():
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
    p.add_argument(
        "--out", metavar="DIR", help="where to write (default: the first RUN_DIR, or its folder)"
    )
    p.add_argument("--debug", action="store_true")
    p.set_defaults(func=cmd_report)
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
    p.add_argument("--out", metavar="DIR", help="where to write (default: NEW's directory)")
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
    p.add_argument("--debug", action="store_true")
    p.set_defaults(func=cmd_compare)
    p = sub.add_parser("env", help="GPU, driver and library versions")
    p.set_defaults(func=cmd_env)
    return top


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
