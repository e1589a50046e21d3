"""`dsv4bench run` and `bench`: scenarios into RUN_DIR/results.jsonl, and the serving points
computed from those rows."""

from __future__ import annotations

import dataclasses
import shutil
import sys
import time
from pathlib import Path

from dsv4bench.commands.common import (
    UsageError,
    load,
    setup_backends,
    shard,
    take_shard,
    too_big_here,
)
from dsv4bench.commands.common import arch as present_arch

ROOT = Path(__file__).resolve().parents[2]
SCENARIO_DIR = ROOT / "scenarios"
SMOKE = SCENARIO_DIR / "smoke.yaml"


def serving_rows(specs, writer) -> int:
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


def _check_same_scenarios(out: Path, scenarios: set[str]) -> None:
    """--resume goes on with the run RUN_DIR holds: rows of a scenario these files do not run
    mean another run's folder, and appending to it would mix two runs in one results file."""
    from dsv4bench.rows.results import read_rows

    held = {r.get("scenario") for r in read_rows(out, quiet=True) if r.get("scenario")}
    others = sorted(str(name) for name in held - scenarios)
    if others:
        more = f" (and {len(others) - 1} more)" if len(others) > 1 else ""
        raise UsageError(
            f"--resume {out}: holds rows of scenario {others[0]}{more}, which these files do not "
            "run; resume with the files that made it (its command.txt) or pick another --out"
        )


EARLIER = "earlier-"  # --force's folder for a run directory's previous contents


def _record_command(out: Path, resume: bool, argv: list[str]) -> None:
    """command.txt: the command that made the run; a --resume adds its own line."""
    line = " ".join(["dsv4bench", *argv]) + "\n"
    with open(out / "command.txt", "a" if resume else "w") as f:
        f.write(line)


def _default_out(runs: str, arch: str) -> Path:
    return Path(runs) / f"{time.strftime('%Y%m%d-%H%M%S')}-{arch}"


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


def _run(args, paths: list[str]) -> int:
    from dsv4bench.rows.results import ResultWriter, read_rows
    from dsv4bench.run.runner import Runner, unexpected_failures

    if args.retry_failed and not args.resume:
        raise UsageError("--retry-failed goes with --resume")
    part = shard(args.shard)
    setup_backends(args)
    arch = present_arch(args.arch, f"--arch {args.arch}")
    # an explicit --arch runs any scenario; without one, only those written for this machine
    names: dict[str, list[str]] = {}
    jobs, limits, specs = load(paths, args.backend, names, run_on=None if args.arch else arch)
    slots = _devices(args.gpus, arch)
    if part is not None:
        jobs, limits = take_shard(part, jobs, limits)
    big = too_big_here(jobs, arch)
    if big:
        (job, why), more = big[0], (f" (and {len(big) - 1} more)" if len(big) > 1 else "")
        raise UsageError(
            f"{job.case.case_id} on {job.backend}{more}: {why}; leave it out or run it where "
            "it fits"
        )
    if args.out is not None and not args.out.strip():
        raise UsageError("--out '': expected a run directory")
    out = Path(args.out) if args.out else _default_out(args.runs, arch)
    if args.resume:
        _check_same_scenarios(out, {*names, *(j.case.scenario for j in jobs)})
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
        print(f"serving: {serving_rows(specs, writer)} TTFT/TPOT points", file=sys.stderr)
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
    """The main job: the present GPU's scenario set and its builds comparison, or the CPU smoke
    scenario without one."""
    arch = present_arch(args.arch, f"make bench ARCH={args.arch}")
    if arch == "cpu":
        paths = [str(SMOKE)]
    else:
        paths = sorted(str(p) for p in (SCENARIO_DIR / arch).glob("*.yaml"))
        if not paths:
            raise UsageError(f"no scenarios for {arch} under {SCENARIO_DIR / arch}")
        builds = SCENARIO_DIR / "compare" / f"builds_{arch}.yaml"
        if builds.is_file():  # every kernel build side by side (a build not fetched: unsupported)
            paths.append(str(builds))
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
