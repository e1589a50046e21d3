"""A sweep as Slurm jobs: an array of shards (task I runs `--shard I/N` into RUN_DIR/shard-I,
going on with `--resume` from rows a cut task left) and a merge job that depends on it.

RUN_DIR/slurm.json holds what the tasks run and every submission (job ids). A task that ran to
its end, all its cases having rows (exit 0, or 1: some cases failed, which are results), leaves
shard-I/slurm-task.json with its exit status; a shard without one, or with another status, did
not finish (cancelled, out of time, its node lost, bad input) and is missing from the merge.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dsv4bench.rows.results import RESULTS_FILE, read_rows

SPEC = "slurm.json"
TASK_DONE = "slurm-task.json"
FINISHED = (0, 1)  # a run's exit status when every job has its row (1: some cases failed)
LOGS = "logs"
MERGED = "merged"


class SlurmError(ValueError):
    """Something Slurm refused or that cannot be submitted (one line for the user)."""


@dataclass
class Resources:
    """What each job asks of Slurm; None leaves it to the cluster's defaults."""

    partition: str | None = None
    account: str | None = None
    time: str | None = None  # a task's time limit, Slurm's format (01:00:00, 2-00:00:00)
    gpus_per_task: int = 0  # 0: a CPU-only task
    gres: str | None = None  # e.g. gpu:h100:1, instead of gpus_per_task
    cpus_per_task: int | None = None
    job_name: str = "dsv4bench"
    sbatch_args: list[str] = field(default_factory=list)  # passed through, to both jobs


@dataclass
class Spec:
    """A Slurm run: RUN_DIR/slurm.json."""

    scenarios: list[str]  # absolute paths
    shards: int
    run_args: list[str]  # `dsv4bench run` flags besides scenarios, --shard, --out, --resume
    python: str
    workdir: str
    resources: Resources
    serving: list[str] = field(default_factory=list)  # merge --serving FILE
    baseline: str | None = None
    submissions: list[dict] = field(default_factory=list)

    def save(self, run_dir: Path) -> None:
        (run_dir / SPEC).write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, run_dir: Path) -> Spec:
        path = run_dir / SPEC
        if not path.is_file():
            raise SlurmError(f"{run_dir}: no {SPEC} (not a run `dsv4bench slurm submit` made)")
        data = json.loads(path.read_text())
        data["resources"] = Resources(**data["resources"])
        return cls(**data)

    def cli(self, *args: str) -> list[str]:
        return [self.python, "-m", "dsv4bench.cli", *args]


def gpu_args(res: Resources) -> list[str]:
    """GPUs the Slurm way: --gres, or --gpus-per-task with one task; none for a CPU task."""
    if res.gres:
        return [f"--gres={res.gres}"]
    if res.gpus_per_task:
        return ["--ntasks=1", f"--gpus-per-task={res.gpus_per_task}"]
    return []


def _common_args(res: Resources, workdir: str) -> list[str]:
    args = [f"--chdir={workdir}"]
    for flag, value in (
        ("partition", res.partition),
        ("account", res.account),
        ("time", res.time),
    ):
        if value:
            args.append(f"--{flag}={value}")
    return args


def array_args(spec: Spec, run_dir: Path, tasks: list[int]) -> list[str]:
    res = spec.resources
    args = [
        f"--job-name={res.job_name}",
        f"--array={ranges(tasks)}",
        f"--output={run_dir / LOGS}/shard-%a-%A.log",
        *_common_args(res, spec.workdir),
        *gpu_args(res),
    ]
    if res.cpus_per_task:
        args.append(f"--cpus-per-task={res.cpus_per_task}")
    return [*args, *res.sbatch_args]


def merge_args(spec: Spec, run_dir: Path, after: str | None) -> list[str]:
    """The merge job: no GPU; `afterany`, as a shard whose cases failed has rows to merge and a
    shard that did not finish is named by the merge, which then fails."""
    res = spec.resources
    args = [
        f"--job-name={res.job_name}-merge",
        f"--output={run_dir / LOGS}/merge-%j.log",
        *_common_args(res, spec.workdir),
    ]
    if after:
        args.append(f"--dependency=afterany:{after}")
    return [*args, *res.sbatch_args]


def ranges(tasks: list[int]) -> str:
    """[1, 2, 3, 5] -> '1-3,5' (Slurm's --array syntax)."""
    out, start = [], None
    for i, t in enumerate(tasks):
        if start is None:
            start = t
        if i + 1 == len(tasks) or tasks[i + 1] != t + 1:
            out.append(str(start) if start == t else f"{start}-{t}")
            start = None
    return ",".join(out)


def sbatch(args: list[str], command: list[str], *, sbatch_cmd: str = "sbatch") -> str:
    """Submits `command` (wrapped in a shell script by sbatch); returns the job id."""
    try:
        done = subprocess.run(
            [sbatch_cmd, "--parsable", *args, "--wrap", shlex.join(command)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except FileNotFoundError:
        raise SlurmError(f"{sbatch_cmd}: not found (is this a Slurm login node?)") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{sbatch_cmd}: no answer from Slurm in 120 s") from None
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise SlurmError(f"sbatch refused the job: {why}")
    return done.stdout.strip().split(";")[0]


def queued(job_ids: list[str]) -> list[str]:
    """Those of `job_ids` (array or plain job ids) that Slurm still has pending or running."""
    if not job_ids:
        return []
    try:
        done = subprocess.run(
            ["squeue", "-h", "-o", "%F %A"], capture_output=True, text=True, timeout=120
        )
    except (FileNotFoundError, subprocess.TimeoutExpired) as e:
        raise SlurmError(f"squeue: {e}") from None
    if done.returncode != 0:
        raise SlurmError(f"squeue: {done.stderr.strip() or done.returncode}")
    present = set(done.stdout.split())
    return [j for j in job_ids if j in present]


@dataclass
class ShardState:
    index: int
    count: int
    rows: int
    finished: bool
    why: str = ""  # why it is missing, when not finished

    @property
    def label(self) -> str:
        return f"{self.index}/{self.count}"


def shard_dir(run_dir: Path, index: int) -> Path:
    return run_dir / f"shard-{index}"


def shard_state(run_dir: Path, index: int, count: int) -> ShardState:
    where = shard_dir(run_dir, index)
    rows = len(read_rows(where, quiet=True)) if (where / RESULTS_FILE).is_file() else 0
    done = _task_record(where)
    if done is not None and done.get("rc") in FINISHED and (where / RESULTS_FILE).is_file():
        return ShardState(index, count, rows, True)
    log = _newest_log(run_dir, index)
    last = f" ({_last_line(log)})" if log and _last_line(log) else ""
    seen = f"; log {log}" if log else ""
    if done is not None:
        why = f"task {done.get('job')} exited {done.get('rc')}{last}, {rows} rows{seen}"
    elif rows:
        why = f"{rows} rows, its task did not finish (cancelled, out of time or node lost){seen}"
    elif log:
        why = f"no rows, its task did not finish{last}{seen}"
    else:
        why = "no rows: its task never ran"
    return ShardState(index, count, rows, False, why)


def _task_record(where: Path) -> dict | None:
    try:
        return json.loads((where / TASK_DONE).read_text())
    except (OSError, ValueError):
        return None


def _newest_log(run_dir: Path, index: int) -> Path | None:
    logs = sorted((run_dir / LOGS).glob(f"shard-{index}-*.log"), key=lambda p: p.stat().st_mtime)
    return logs[-1] if logs else None


def _last_line(log: Path) -> str:
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def states(run_dir: Path, count: int) -> list[ShardState]:
    return [shard_state(run_dir, i, count) for i in range(1, count + 1)]


def record_task(where: Path, job: str, rc: int) -> None:
    where.mkdir(parents=True, exist_ok=True)
    record = {"job": job, "rc": rc, "ended": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    (where / TASK_DONE).write_text(json.dumps(record) + "\n")
