"""A real single-node Slurm for tests: munged, slurmctld and slurmd on localhost, a CPU-only node
with 2 CPUs, every file (config, key, state, logs, sockets) in one directory.

`missing()` names what keeps one from starting here (None when nothing does); `Cluster.start()`
brings it up, `stop()` ends the daemons it started (by their pids). Job states are read through
squeue/scontrol and the job-completion file (no accounting database: no sacct)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo")
SBIN = ("/usr/sbin", "/usr/local/sbin", "/sbin")


def _find(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for folder in SBIN:
        if os.access(f"{folder}/{name}", os.X_OK):
            return f"{folder}/{name}"
    return None


def missing() -> str | None:
    """Why a cluster cannot start on this machine, else None."""
    absent = [n for n in (*DAEMONS, *CLIENTS, "mungekey") if _find(n) is None]
    if absent:
        return (
            f"no {', '.join(absent)} on this machine: Debian's slurm-wlm and munge packages "
            "(apt-get install -y slurm-wlm munge, as root) are needed"
        )
    if os.geteuid() != 0:
        return "slurmd runs jobs as their users and must start as root: not root here"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CONFIG = """\
ClusterName=dsv4test
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge.sock
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={root}/jobcomp.txt
MpiDefault=none
ReturnToService=2
MinJobAge=3600
KillWait=10
SlurmdTimeout=300
SlurmctldTimeout=300
InactiveLimit=0
NodeName={host} NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


@dataclass
class Cluster:
    root: Path
    host: str = field(default_factory=lambda: socket.gethostname().split(".")[0])
    procs: dict[str, int] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        """The environment a client command (sbatch, squeue, dsv4bench slurm) needs."""
        return {**os.environ, "SLURM_CONF": str(self.root / "slurm.conf")}

    def start(self, timeout: float = 120.0) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        for d in ("state", "spool"):
            (self.root / d).mkdir(exist_ok=True)
        key = self.root / "munge.key"
        subprocess.run([_find("mungekey"), "-c", "-k", str(key)], check=True)
        os.chmod(key, 0o600)
        self._daemon(
            "munged",
            "--force",
            f"--socket={self.root}/munge.sock",
            f"--key-file={key}",
            f"--pid-file={self.root}/munged.pid",
            f"--log-file={self.root}/munged.log",
            f"--seed-file={self.root}/munged.seed",
        )
        self._wait(lambda: (self.root / "munge.sock").exists(), timeout, "munged's socket")
        conf = CONFIG.format(
            host=self.host, root=self.root, ctld_port=_free_port(), d_port=_free_port()
        )
        (self.root / "slurm.conf").write_text(conf)
        self._daemon("slurmctld", "-i")  # -i: ignore state left by an earlier cluster
        self._daemon("slurmd", "-N", self.host)
        self._wait(self._node_idle, timeout, "the node to come up idle")

    def _daemon(self, name: str, *args: str) -> None:
        pid_file = self.root / f"{name}.pid"
        pid_file.unlink(missing_ok=True)
        log = open(self.root / f"{name}.out", "w")  # noqa: SIM115 (the daemon holds it)
        subprocess.run([_find(name), *args], env=self.env, stdout=log, stderr=log, check=True)
        self._wait(pid_file.exists, 30, f"{name}'s pid file ({self.root}/{name}.out)")
        self._wait(lambda: pid_file.read_text().strip().isdigit(), 30, f"{name}'s pid")
        self.procs[name] = int(pid_file.read_text().strip())

    def _queued(self) -> bool:
        return bool(self.run("squeue", "-h", "-o", "%i", check=False).stdout.strip())

    def _node_idle(self) -> bool:
        out = self.run("sinfo", "-h", "-N", "-o", "%T", check=False).stdout
        return "idle" in out

    def _wait(self, ready, timeout: float, what: str, every: float = 0.5) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if ready():
                return
            time.sleep(every)
        raise TimeoutError(f"waited {timeout:.0f} s for {what}; logs in {self.root}")

    def run(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            [_find(cmd[0]) or cmd[0], *cmd[1:]],
            env=self.env,
            capture_output=True,
            text=True,
            check=check,
            timeout=120,
        )

    def state(self, job: str) -> str:
        """A job's state (PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, ...), from scontrol."""
        out = self.run("scontrol", "-o", "show", "job", job, check=False).stdout
        for word in out.split():
            if word.startswith("JobState="):
                return word.split("=", 1)[1]
        return "UNKNOWN"

    def jobs(self, job: str) -> list[dict[str, str]]:
        """scontrol's fields of a job, one dict per array task (a pending range is one)."""
        out = self.run("scontrol", "-o", "show", "job", job, check=False).stdout
        return [dict(w.split("=", 1) for w in ln.split() if "=" in w) for ln in out.splitlines()]

    def states(self, array: str) -> dict[str, str]:
        """Each started task of an array job -> its state."""
        return {
            f["ArrayTaskId"]: f.get("JobState", "UNKNOWN")
            for f in self.jobs(array)
            if f.get("ArrayTaskId", "").isdigit()
        }

    def wait_for(self, ready, timeout: float, what: str, every: float = 0.5) -> None:
        self._wait(ready, timeout, what, every)

    def describe(self, ids: list[str]) -> list[str]:
        """One line per job (array tasks apart): id, name, state, exit code, times."""
        lines = []
        for job in ids:
            for f in self.jobs(job):
                task = f.get("ArrayTaskId")
                label = f"{f.get('ArrayJobId')}_{task}" if task else f.get("JobId")
                lines.append(
                    f"{label:>8} {f.get('JobName', '?'):<16} {f.get('JobState', '?'):<10} "
                    f"exit {f.get('ExitCode', '?'):<5} start {f.get('StartTime', '?')} "
                    f"end {f.get('EndTime', '?')} run {f.get('RunTime', '?')}"
                )
        return lines

    def wait_done(self, jobs: list[str], timeout: float = 900.0) -> dict[str, str]:
        """Waits until no job of `jobs` is pending or running; returns their final states."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            out = self.run("squeue", "-h", "-j", ",".join(jobs), "-o", "%i %T", check=False)
            if not out.stdout.strip():
                return {j: self.state(j) for j in jobs}
            time.sleep(1)
        raise TimeoutError(f"jobs {jobs} still queued after {timeout:.0f} s; logs in {self.root}")

    def stop(self) -> None:
        """Cancels what is left of its jobs (a failed test's), then ends its daemons."""
        if "slurmctld" in self.procs:
            self.run("scancel", "--user", "root", check=False)
            with contextlib.suppress(TimeoutError):  # the daemons stop anyway
                self._wait(lambda: not self._queued(), 60, "the cancelled jobs to end")
        for name in reversed(DAEMONS):
            pid = self.procs.pop(name, None)
            if pid is None:
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            for _ in range(60):
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.25)
            else:
                os.kill(pid, signal.SIGKILL)
