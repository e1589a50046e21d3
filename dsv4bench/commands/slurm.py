"""`dsv4bench slurm`: a sweep as one Slurm submission (an array of shards and a merge job that
depends on it), its resubmission after a failure, and the two steps the jobs run."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from dsv4bench.cases.case import ARCHS
from dsv4bench.commands.common import UsageError, load, setup_backends
from dsv4bench.run import slurm


def add_parser(sub, common) -> None:
    p = sub.add_parser(
        "slurm",
        help="run a sweep as a Slurm array of shards and a merge job (docs/scale-out.md)",
    )
    steps = p.add_subparsers(dest="step", required=True, parser_class=type(p))
    s = steps.add_parser("submit", help="submit N shard tasks and their merge; prints job ids")
    s.add_argument("scenario", nargs="+", help="scenario YAML files")
    s.add_argument("--shards", type=int, required=True, metavar="N", help="array tasks")
    s.add_argument("--out", metavar="RUN_DIR", help="default: RUNS/slurm-<time>")
    s.add_argument("--runs", default="runs", help="parent of the default RUN_DIR")
    s.add_argument(
        "--arch", choices=ARCHS, help="passed to each task's run (cpu: no GPU is requested)"
    )
    s.add_argument("--baseline", metavar="RUN_DIR", help="the merge job compares with it")
    s.add_argument("--python", default=sys.executable, help="the python the jobs run")
    common(s)
    _resources(s)
    s.set_defaults(func=cmd_submit)
    r = steps.add_parser("resubmit", help="submit again the shards that did not finish, and merge")
    r.add_argument("run_dir")
    _resources(r, saved=True)
    r.set_defaults(func=cmd_resubmit)
    for name, func, text in (
        ("task", cmd_task, "(run by each array task) run shard $SLURM_ARRAY_TASK_ID"),
        ("merge", cmd_merge, "(run by the merge job) merge every shard, report, compare"),
        ("status", cmd_status, "each shard: finished, or why it is missing"),
    ):
        t = steps.add_parser(name, help=text)
        t.add_argument("run_dir")
        t.add_argument("--debug", action="store_true")
        t.set_defaults(func=func)


def _resources(p, saved: bool = False) -> None:
    default = " (default: as submitted)" if saved else ""
    p.add_argument("--partition", help=f"Slurm partition{default}")
    p.add_argument("--account", help=f"Slurm account{default}")
    p.add_argument("--time", help=f"each task's time limit, e.g. 02:00:00{default}")
    p.add_argument(
        "--gpus-per-task",
        type=int,
        metavar="G",
        help=f"GPUs per shard task (default: 1, 0 with --arch cpu){default}; G > 1 runs the "
        "shard on all of them (--gpus all)",
    )
    p.add_argument("--gres", help=f"e.g. gpu:h100:1, instead of --gpus-per-task{default}")
    p.add_argument("--cpus-per-task", type=int, metavar="C", help=f"CPUs per task{default}")
    p.add_argument(
        "--sbatch-arg",
        action="append",
        metavar="ARG",
        help="one more sbatch argument for both jobs, e.g. --sbatch-arg=--qos=high (repeatable)",
    )
    p.add_argument(
        "--hold",
        action="store_true",
        help="submit held: nothing starts before `scontrol release JOBID` (not kept for resubmit)",
    )
    if not saved:
        p.add_argument("--job-name", default="dsv4bench")


def _resources_of(args) -> slurm.Resources:
    if args.gpus_per_task is not None and args.gpus_per_task < 0:
        raise UsageError(f"--gpus-per-task {args.gpus_per_task}: expected 0 or more")
    if args.gres and args.gpus_per_task:
        raise UsageError("--gres and --gpus-per-task both ask for GPUs: pass one of them")
    gpus = args.gpus_per_task
    if gpus is None:
        gpus = 0 if (args.arch == "cpu" or args.gres) else 1
    if args.arch == "cpu" and (gpus or args.gres):
        raise UsageError("--arch cpu runs on CPU nodes: --gpus-per-task/--gres ask for GPUs")
    return slurm.Resources(
        partition=args.partition,
        account=args.account,
        time=args.time,
        gpus_per_task=gpus,
        gres=args.gres,
        cpus_per_task=args.cpus_per_task,
        job_name=args.job_name,
        sbatch_args=list(args.sbatch_arg or []),
    )


def _run_args(args, res: slurm.Resources) -> list[str]:
    out = ["--arch", args.arch] if args.arch else []
    for flag, values in (
        ("--backend", args.backend),
        ("--plugin", args.plugin),
        ("--backend-opt", args.backend_opt),
    ):
        for v in values or []:
            out += [flag, v]
    if args.flashmla_lib:
        out += ["--flashmla-lib", args.flashmla_lib]
    if res.gpus_per_task > 1:
        out += ["--gpus", "all"]
    return out


def cmd_submit(args) -> int:
    if args.shards < 1:
        raise UsageError(f"--shards {args.shards}: expected 1 or more")
    res = _resources_of(args)
    setup_backends(args)
    jobs, limits, _specs = load(args.scenario, args.backend)  # bad input: refused here
    units = len(jobs) + len(limits)
    if args.shards > units:
        raise UsageError(f"--shards {args.shards}: these scenarios have only {units} jobs")
    serving = [p for p in args.scenario if load([p], None)[2]]
    if args.baseline and not Path(args.baseline).exists():
        raise UsageError(f"--baseline {args.baseline}: no such run directory")
    run_dir = Path(args.out or Path(args.runs) / f"slurm-{time.strftime('%Y%m%d-%H%M%S')}")
    if (run_dir / slurm.SPEC).exists():
        raise UsageError(f"{run_dir}: already a Slurm run; `dsv4bench slurm resubmit {run_dir}`")
    if run_dir.exists() and any(run_dir.iterdir()):
        raise UsageError(f"--out {run_dir}: not empty; name a new run directory")
    run_dir = run_dir.resolve()
    (run_dir / slurm.LOGS).mkdir(parents=True, exist_ok=True)
    spec = slurm.Spec(
        scenarios=[str(Path(p).resolve()) for p in dict.fromkeys(args.scenario)],
        shards=args.shards,
        run_args=_run_args(args, res),
        python=args.python,
        workdir=os.getcwd(),
        resources=res,
        serving=[str(Path(p).resolve()) for p in serving],
        baseline=str(Path(args.baseline).resolve()) if args.baseline else None,
    )
    spec.save(run_dir)
    print(f"{run_dir}: {units} jobs in {args.shards} shards")
    try:
        return _submit(spec, run_dir, list(range(1, args.shards + 1)), hold=args.hold)
    except UsageError:
        if not spec.submissions:  # nothing was queued: the same command may simply be rerun
            shutil.rmtree(run_dir)
        raise


def _submit(spec: slurm.Spec, run_dir: Path, tasks: list[int], *, hold: bool = False) -> int:
    held = ["--hold"] if hold else []
    array = merge = None
    try:
        if tasks:
            array = slurm.sbatch(
                [*slurm.array_args(spec, run_dir, tasks), *held],
                spec.cli("slurm", "task", str(run_dir)),
            )
        merge = slurm.sbatch(
            [*slurm.merge_args(spec, run_dir, array), *held],
            spec.cli("slurm", "merge", str(run_dir)),
        )
    except slurm.SlurmError as e:
        if array is None:
            raise UsageError(str(e)) from None
        raise UsageError(  # the array runs; its merge can be submitted again
            f"array job {array} submitted, its merge not: {e}; when the array is done: "
            f"dsv4bench slurm resubmit {run_dir}"
        ) from None
    finally:
        if array or merge:
            spec.submissions.append(
                {"array": array, "tasks": slurm.ranges(tasks), "merge": merge, "at": time.time()}
            )
            spec.save(run_dir)
    if array:
        print(f"array job {array}: tasks {slurm.ranges(tasks)} -> {run_dir}/shard-<I>")
    print(f"merge job {merge} (after {array or 'nothing'}) -> {run_dir / slurm.MERGED}")
    print(
        f"logs: {run_dir / slurm.LOGS}/; watch: squeue -j {','.join(filter(None, [array, merge]))}"
    )
    print(f"after a failure: dsv4bench slurm resubmit {run_dir}")
    return 0


def cmd_resubmit(args) -> int:
    run_dir = Path(args.run_dir).resolve()
    try:
        spec = slurm.Spec.load(run_dir)
        ids = [j for s in spec.submissions for j in (s["array"], s["merge"]) if j]
        busy = slurm.queued(ids)
    except slurm.SlurmError as e:
        raise UsageError(str(e)) from None
    if busy:
        raise UsageError(f"job(s) {', '.join(busy)} of {run_dir} still queued: wait or scancel")
    if (run_dir / slurm.MERGED / "results.jsonl").exists():
        raise UsageError(f"{run_dir}: already merged ({run_dir / slurm.MERGED})")
    res = spec.resources
    for name in ("partition", "account", "time", "gres", "cpus_per_task", "gpus_per_task"):
        if getattr(args, name) is not None:
            setattr(res, name, getattr(args, name))
    if args.sbatch_arg:
        res.sbatch_args = list(args.sbatch_arg)
    missing = [s.index for s in slurm.states(run_dir, spec.shards) if not s.finished]
    print(f"{run_dir}: shard(s) {slurm.ranges(missing) or 'none'} to run again")
    return _submit(spec, run_dir, missing, hold=args.hold)


def cmd_task(args) -> int:
    """One array task: `dsv4bench run --shard I/N`, going on from rows an earlier try left."""
    run_dir = Path(args.run_dir)
    spec = _spec(run_dir)
    task = os.environ.get("SLURM_ARRAY_TASK_ID")
    if not task or not task.isdigit() or not 1 <= int(task) <= spec.shards:
        raise UsageError(f"SLURM_ARRAY_TASK_ID={task}: expected 1..{spec.shards} (an array task)")
    index = int(task)
    out = slurm.shard_dir(run_dir, index)
    (out / slurm.TASK_DONE).unlink(missing_ok=True)
    resume = ["--resume"] if (out / "results.jsonl").exists() else []
    command = spec.cli(
        "run", *spec.scenarios, "--shard", f"{index}/{spec.shards}", "--out", str(out)
    )
    command += [*resume, *spec.run_args]
    print(shlex.join(command), flush=True)
    rc = _wait_for(subprocess.Popen(command))
    job = f"{os.environ.get('SLURM_ARRAY_JOB_ID', '?')}_{task}"
    slurm.record_task(out, job, rc)
    return rc


def _wait_for(child: subprocess.Popen) -> int:
    """The run's exit status. Cancelled (SIGTERM to the task's processes), the run stops on
    its own, keeping whole rows; this process waits for that instead of killing it mid-row."""
    try:
        return child.wait()
    except BaseException:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(timeout=60)
            except subprocess.TimeoutExpired:
                child.kill()
        raise


def cmd_merge(args) -> int:
    """The merge job: every shard finished, or one line each naming the missing and exit 2."""
    run_dir = Path(args.run_dir)
    spec = _spec(run_dir)
    found = slurm.states(run_dir, spec.shards)
    missing = [s for s in found if not s.finished]
    for s in missing:
        print(f"dsv4bench slurm merge: shard {s.label} missing: {s.why}", file=sys.stderr)
    if missing:
        print(
            f"dsv4bench slurm merge: nothing merged ({len(missing)} of {spec.shards} shards "
            f"missing); each goes on from its rows: dsv4bench slurm resubmit {run_dir}",
            file=sys.stderr,
        )
        return 2
    merged = run_dir / slurm.MERGED
    shards = [str(slurm.shard_dir(run_dir, s.index)) for s in found]
    serving = [a for f in spec.serving for a in ("--serving", f)]
    steps = [spec.cli("merge", *shards, "--out", str(merged), *serving)]
    steps.append(spec.cli("report", str(merged), "--in-place"))
    if spec.baseline:
        steps.append(
            spec.cli("compare", spec.baseline, str(merged), "--out", str(run_dir / "compare"))
        )
    for step in steps:
        print(shlex.join(step), flush=True)
        rc = subprocess.run(step).returncode
        if rc:
            return rc
    return 0


def cmd_status(args) -> int:
    run_dir = Path(args.run_dir)
    spec = _spec(run_dir)
    found = slurm.states(run_dir, spec.shards)
    for s in found:
        print(f"shard {s.label}: " + (f"{s.rows} rows, finished" if s.finished else s.why))
    merged = run_dir / slurm.MERGED / "results.jsonl"
    print(f"merged: {merged}" if merged.exists() else "not merged")
    return 0 if all(s.finished for s in found) else 1


def _spec(run_dir: Path) -> slurm.Spec:
    try:
        return slurm.Spec.load(run_dir)
    except slurm.SlurmError as e:
        raise UsageError(str(e)) from None
