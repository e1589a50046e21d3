"""Runs (case, backend) jobs in worker processes and writes one result row per job.

A worker that dies (exit code, signal, CUDA error) or hangs past the case's timeout becomes a
`crash`/`timeout`/`oom` row with the end of its stderr; the worker is replaced and the sweep
goes on. A job the worker answers keeps the end of what it printed to stderr in `info.stderr`
(a kernel may print an error and still answer right: vLLM issue 56563). Rows are appended as
soon as they exist, so a killed run loses nothing.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from dsv4bench import backends, env
from dsv4bench.cases import engine_issues
from dsv4bench.cases.case import Case
from dsv4bench.rows import CaseRow, LimitRow
from dsv4bench.rows.results import ResultWriter
from dsv4bench.run.devices import Device
from dsv4bench.run.slot import MAX_POOLED, Slot, grouped_for_pool  # noqa: F401 (Slot: tests, callers)
from dsv4bench.run.worker import MARK, PARENT_ENV
from dsv4bench.scenarios import LimitSearch

STARTUP_TIMEOUT_S = 180.0
WORKER_EXIT_S = 30.0  # how long a worker that answered `crash` may take to exit (CUDA teardown)
LARGE_RUN = 3600  # jobs: at about a second each, an hour or more
FAILED = ("crash", "timeout", "oom", "error")
# A limit probe stops working when it fails or answers wrong (a kernel past an int32 offset
# may run and write garbage): both end the search.
PROBE_FAILED = (*FAILED, "incorrect")
_ROOT = Path(__file__).resolve().parents[2]


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a Python child of the suite (a worker, a kernel-loading child): this
    checkout first on PYTHONPATH, output unbuffered, `extra` on top."""
    path = os.pathsep.join(p for p in (str(_ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, **(extra or {}), "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


@dataclass(frozen=True)
class Job:
    case: Case
    backend: str


def _text(log, start: int = 0, most: int = 1 << 20) -> str:
    """The open log file from byte `start` on (the current job's output), its last `most`
    bytes."""
    try:
        size = os.fstat(log.fileno()).st_size
        start = max(start, size - most)
        return os.pread(log.fileno(), max(0, size - start), start).decode(errors="replace")
    except (OSError, ValueError):  # ValueError: the log is closed
        return ""


def tail(text: str, lines: int = 15, chars: int = 2000) -> str:
    """The last lines of a job's output, at most `chars` characters."""
    return "\n".join(text.strip().splitlines()[-lines:])[-chars:]


def with_stderr(answer: dict, printed: str) -> dict:
    """A worker's answer (a whole row, or an outcome) with the end of what its job printed to
    stderr as `info.stderr`; nothing printed, nothing added."""
    if not printed.strip():
        return answer
    return {**answer, "info": {**(answer.get("info") or {}), "stderr": tail(printed)}}


def _exit_text(rc: int | None) -> str:
    if rc is None:
        return "still running"
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exited with code {rc}"


class Worker:
    """One `python -m dsv4bench.run.worker` process with a line reader on its stdout."""

    def __init__(
        self, arch: str, plugins: list[str], env: dict[str, str] | None = None, wait: bool = True
    ):
        """`env`: variables set for this worker alone (CUDA_VISIBLE_DEVICES pins its GPU).
        `wait=False` returns at once (the process starts meanwhile); wait_ready() waits."""
        # An unnamed file (unlinked at once): no log is left behind, however the runner ends.
        self._stderr = tempfile.TemporaryFile(prefix="dsv4bench-worker-")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dsv4bench.run.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            # the worker dies when this process does
            env=child_env({**(env or {}), PARENT_ENV: str(os.getpid())}),
            start_new_session=True,  # a kill takes the worker's children too
        )
        self.job_start = 0  # where the current job's stderr begins: messages quote only it
        self.answers: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        # the worker builds the same backend instances (options) as this process
        self.send({"arch": arch, "plugins": plugins, "instances": backends.configured()})
        self._ready = False
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Block until the worker says it is ready (imports and backends done); raises
        RuntimeError if it never does."""
        if self._ready:
            return
        try:
            ready = self.receive(STARTUP_TIMEOUT_S)
        except TimeoutError:
            ready = None
        if not (ready or {}).get("ready"):
            self.proc.kill()
            why = self.failure()
            self.stop()
            raise RuntimeError(f"worker did not start: {why}")
        self._ready = True

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith(MARK):
                self.answers.put(json.loads(line[len(MARK) :]))
        self.answers.put(None)  # end of stream: the process is gone

    def send(self, msg: dict) -> None:
        self.job_start = os.fstat(self._stderr.fileno()).st_size
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()

    def receive(self, timeout: float) -> dict | None:
        """The next answer, or None if the worker died; raises TimeoutError."""
        try:
            return self.answers.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError from None

    def failure(self) -> str:
        try:
            rc = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            rc = None
        end = self.stderr_tail()
        return f"worker {_exit_text(rc)}" + (f": {end}" if end else "")

    def stderr_tail(self) -> str:
        return tail(self.job_stderr())

    def job_stderr(self) -> str:
        """What the current job printed to stderr so far (its last MiB)."""
        return _text(self._stderr, self.job_start)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._stderr.close()


class Progress:
    """One line per finished job (a rewritten line on a terminal): counts, elapsed, ETA."""

    def __init__(self, total: int, stream=None):
        self.total, self.done, self.start = total, 0, time.monotonic()
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()

    def update(self, label: str, status: str, extra: str = "") -> None:
        self.done += 1
        elapsed = time.monotonic() - self.start
        eta = elapsed / self.done * (self.total - self.done)
        pct = 100 * self.done // max(1, self.total)
        line = (
            f"[{self.done:>{len(str(self.total))}}/{self.total} {pct:3d}%] "
            f"{_clock(elapsed)} elapsed, ETA {_clock(eta)} | {label} {status} {extra}".rstrip()
        )
        if self.tty:
            self.stream.write("\r\033[K" + line + ("\n" if self.done == self.total else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def _clock(seconds: float) -> str:
    h, rest = divmod(int(seconds), 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


class Stopped(Exception):
    """The run is being stopped (interrupt, or another slot failed): no more rows."""


class Runner:
    """Sends jobs to one worker per device (`devices`: one CPU slot by default). Jobs and limit
    searches are handed out from one queue to whichever slot is free; all probes of a limit
    search run on one slot. Rows come back here and only this process writes them."""

    def __init__(
        self,
        writer: ResultWriter,
        *,
        arch: str,
        plugins: Iterable[str] = (),
        progress: bool = True,
        devices: list[Device] | None = None,
        worker_factory: Callable[[Device], Worker] | None = None,
        shard: str | None = None,
    ):
        self.writer = writer
        self.arch = arch
        self.plugins = list(plugins)
        self.show_progress = progress
        self.shard = shard
        start = lambda device, wait=True: Worker(  # noqa: E731
            self.arch, self.plugins, env=device.worker_env(), wait=wait
        )
        factory = worker_factory or start
        spawn = None if worker_factory else (lambda device: start(device, wait=False))
        self.slots = [Slot(d, factory, spawn) for d in (devices or [Device(slot=0)])]
        self._env = None
        self._lock = threading.Lock()  # one writer, one progress line at a time
        self._stopping = threading.Event()

    # ---- one job -------------------------------------------------------------------------

    def _env_info(self) -> dict:
        if self._env is None:
            self._env = env.collect()
        return self._env

    def _row(self, job: Job, answer: dict, slot: Slot, printed: str = "") -> CaseRow:
        """The job's row: the worker's (a whole row), or built here from an outcome (status and
        message of a job that never got a worker's answer); with this slot's environment and
        the engine issue it reproduces, looked for in its message and `printed` (the job's
        stderr)."""
        if "case_id" in answer:
            row = CaseRow.from_dict(answer)
        else:
            row = CaseRow.of(job.case, backends.get(job.backend), **answer)
        extra = {**row.extra, "shard": self.shard} if self.shard else row.extra
        env = {**(row.env or self._env_info()), **slot.device.row_env()}
        backend = backends.get(job.backend)
        info = engine_issues.with_note(
            row.info, job.case, backend, row.provider, row.message, printed
        )
        return dataclasses.replace(row, env=env, extra=extra, info=info)

    def _write(self, row: CaseRow) -> None:
        with self._lock:
            if self._stopping.is_set():  # a worker killed by the stop is no result
                raise Stopped
            self.writer.append(row)

    def _run_in(self, worker: Worker, job: Job) -> dict:
        try:
            worker.send({"case": job.case.to_dict(), "backend": job.backend, "arch": self.arch})
        except OSError:  # it died between jobs
            return {"status": "crash", "message": worker.failure()}
        try:
            answer = worker.receive(job.case.timing.timeout_s)
        except TimeoutError:
            end = worker.stderr_tail()
            worker.stop()
            msg = f"no answer after {job.case.timing.timeout_s:g} s"
            return {"status": "timeout", "message": msg + (f"; stderr: {end}" if end else "")}
        if answer is None:
            msg = worker.failure()
            status = "oom" if "out of memory" in msg.lower() else "crash"
            if worker.proc.returncode == -signal.SIGKILL:  # nothing here sends it: the OOM killer
                status, msg = "oom", f"{msg} (the host's out-of-memory killer, most likely)"
            return {"status": status, "message": msg}
        # the worker exits after a crash or a failed graph capture (worker.main): wait for it,
        # so that the next job gets a fresh worker, not this one on its way out
        exiting = answer.get("status") == "crash" or "graph_error" in (answer.get("timing") or {})
        if exiting or not worker.alive():
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.proc.wait(timeout=WORKER_EXIT_S if exiting else 0.2)
            if not worker.alive() and answer.get("status") != "ok":
                answer["message"] = f"{answer.get('message', '')} ({worker.failure()})".strip()
        return answer

    def run_job(self, job: Job, *, fresh: bool = False, slot: Slot | None = None) -> dict:
        """Run one job on `slot` (default: the first; in a new worker when `fresh`) and write
        its row."""
        slot = slot or self.slots[0]
        reason = backends.get(job.backend).supports(job.case, self.arch)
        printed = ""
        if reason:
            answer = {"status": "unsupported", "message": reason}
        else:
            if self._stopping.is_set():
                raise Stopped
            try:
                key = backends.get(job.backend).process_key()
                worker = slot.fresh_worker() if fresh else slot.ensure_worker(key)
                answer = self._run_in(worker, job)
            except RuntimeError as e:  # the worker would not even start
                answer = {"status": "error", "message": str(e)}
                worker = None
            if worker is not None:
                printed = worker.job_stderr()  # "" once stopped (a timeout: its message has it)
                if "case_id" in answer or answer.get("status") in ("ok", "error"):
                    answer = with_stderr(answer, printed)  # a crash's message quotes it already
            if worker is not None and (fresh or not worker.alive()):
                worker.stop()
                slot.drop(worker)
        row = self._row(job, answer, slot, printed)
        self._write(row)
        return row.to_dict()

    def close(self) -> None:
        for slot in self.slots:
            slot.close()

    # ---- sweeps --------------------------------------------------------------------------

    def run(
        self,
        jobs: list[Job],
        limits: list[LimitSearch] = (),
        *,
        resume: bool = False,
        retry_failed: bool = False,
    ):
        done = self.writer.finished(retry_failed=retry_failed) if resume else set()
        todo = grouped_for_pool(
            [j for j in jobs if (j.case.case_id, j.backend) not in done],
            key=lambda job: backends.get(job.backend).process_key(),
        )
        searches = [s for s in limits if (s.limit_id, s.backend) not in done]
        skipped = len(jobs) - len(todo) + len(limits) - len(searches)
        progress = Progress(len(todo) + sum(_probes_estimate(s) for s in searches))
        if skipped:
            print(f"resuming: {skipped} finished jobs skipped", file=sys.stderr)
        if progress.total >= LARGE_RUN:
            print(
                f"{progress.total} jobs: a long run (hours at a second each); the ETA follows "
                "the first jobs, and Ctrl-C then --resume continues",
                file=sys.stderr,
            )
        # with several slots a limit search (a long chain of probes) starts first: the others
        # share the jobs meanwhile
        units = [*todo, *searches] if len(self.slots) == 1 else [*searches, *todo]
        pending = collections.deque(units)
        rows: list[dict] = []
        self._stopping.clear()
        try:
            if len(self.slots) == 1:
                self._drain(self.slots[0], pending, rows, progress)
            else:
                self._run_slots(pending, rows, progress)
        finally:
            self.close()
        return rows

    def _drain(self, slot: Slot, pending: collections.deque, rows: list, progress) -> None:
        """Take units from `pending` until it is empty; run each on `slot`."""
        while not self._stopping.is_set():
            with self._lock:
                if not pending:
                    return
                unit = pending.popleft()
            if isinstance(unit, LimitSearch):
                row = self.find_limit(unit, progress, slot)
            else:
                row = self.run_job(unit, slot=slot)
                self._progress(progress, slot, _job_label(unit), row)
            rows.append(row)

    def _run_slots(self, pending: collections.deque, rows: list, progress) -> None:
        errors: list[BaseException] = []

        def drain(slot: Slot) -> None:
            try:
                self._drain(slot, pending, rows, progress)
            except Stopped:
                pass
            except BaseException as e:  # e.g. a full disk: the run stops, main re-raises it
                if not self._stopping.is_set():
                    errors.append(e)
                self._stopping.set()

        threads = [
            threading.Thread(target=drain, args=(slot,), name=f"slot-{slot.device.slot}")
            for slot in self.slots
        ]
        for t in threads:
            t.daemon = True
            t.start()
        try:
            while any(t.is_alive() for t in threads):
                for t in threads:
                    t.join(timeout=0.2)  # short waits: Ctrl-C and SIGTERM reach this thread
        finally:
            self._stopping.set()
            self.close()  # a worker busy with a job ends now; its thread writes nothing more
            for t in threads:
                t.join(timeout=10)
            self.close()  # one a thread started while the stop began
        if errors:
            raise errors[0]

    def _progress(self, progress: Progress | None, slot: Slot, label: str, row: dict) -> None:
        if progress is None or not self.show_progress:
            return
        if len(self.slots) > 1:
            label = f"{slot.device.label} {label}"
        with self._lock:
            progress.update(label, *_summary(row))

    def find_limit(
        self, s: LimitSearch, progress: Progress | None = None, slot: Slot | None = None
    ) -> dict:
        """Bisection between a working and a failing value, each probe in a fresh process on
        one slot (a limit belongs to one GPU model and kernel build)."""
        slot = slot or self.slots[0]
        slot.stop_pooled()
        probes: dict[int, dict] = {}

        def probe(value: int) -> bool:
            case = dataclasses.replace(
                s.at(value),
                timing=dataclasses.replace(s.base.timing, warmup=1, iters=3),
                tags=(*s.base.tags, "limit-probe"),
            )
            row = self.run_job(Job(case, s.backend), fresh=True, slot=slot)
            probes[value] = row
            self._progress(progress, slot, f"limit {s.axis}={value} {s.backend}", row)
            # past lo, a refusal (the adapter's own limit) ends the range as a failure does
            return row["status"] not in (*PROBE_FAILED, "unsupported")

        lo, hi = s.lo, s.hi
        last_ok = first_fail = guess = None
        lo_works = probe(lo)
        if probes[lo]["status"] == "unsupported":  # no kernel to search (a build not found)
            pass
        elif lo_works:
            guess = backends.get(s.backend).limit_guess(s.base, s.axis, self.arch)
            lo, hi, bracketed = _around_guess(guess, probe, lo, hi, s.step)
            if not bracketed:
                hi, bracketed = _listed(s.probe, probe, lo, hi)
            if bracketed or not probe(hi):
                while hi - lo > s.step:
                    mid = lo + max(1, (hi - lo) // 2 // s.step) * s.step
                    if probe(mid):
                        lo = mid
                    else:
                        hi = mid
                last_ok, first_fail = lo, hi
            else:  # hi works too
                last_ok = hi
        else:
            first_fail = lo
        fail_row = probes.get(first_fail) if first_fail is not None else None
        first_probe = probes[s.lo]
        if last_ok is None and first_fail is None:
            fail_row = first_probe
        info = {"guess": guess} if guess is not None else {}
        if s.base.op == "indexer":  # the fp32 logits matrix each probed size needs (one copy)
            from dsv4bench.cases import indexer_case

            sizes = {str(v): indexer_case.logits_bytes(s.at(v)) for v in sorted(probes)}
            info["logits_bytes"] = sizes
        # the env and shard fields as the job rows have them
        where = self._row(
            Job(s.base, s.backend), {"status": "ok", "env": first_probe.get("env")}, slot
        )
        row = LimitRow.of(
            s.base,
            backends.get(s.backend),
            case_id=s.limit_id,
            axis=s.axis,
            last_ok=last_ok,
            first_fail=first_fail,
            status=fail_row["status"] if fail_row else "ok",
            message=fail_row["message"] if fail_row else f"no failure up to {s.hi}",
            provider=next((p["provider"] for p in probes.values() if p.get("provider")), None),
            probes={str(v): r["status"] for v, r in sorted(probes.items())},
            step=s.step,
            info=info,
            env=where.env,
            extra=where.extra,
        )
        self._write(row)
        return row.to_dict()


def _job_label(job: Job) -> str:
    """A progress line's job: its case id, backend, and the route of a prefill chunk (three
    routes share one id prefix; only the hash tells them apart)."""
    route = f" route {job.case.route}" if job.case.op == "prefill" else ""
    return f"{job.case.case_id} {job.backend}{route}"


def _listed(values, probe, lo: int, hi: int) -> tuple[int, bool]:
    """Probe a search's listed values inside (lo, hi), in order: (hi, bracketed), hi the first
    that fails. lo stays: a listed value that works says nothing of the sizes below it."""
    for v in values:
        if lo < v < hi and not probe(v):
            return v, True
    return hi, False


def _around_guess(guess, probe, lo: int, hi: int, step: int) -> tuple[int, int, bool]:
    """Probe a backend's guess of its limit and the next size: (lo, hi, bracketed). When the
    guess is right the search ends after these two probes (a bisection of 8192..16384 takes
    13); when it is wrong it narrows the range as a bisection step would."""
    if guess is None or not lo < guess < hi - step:
        return lo, hi, False
    if not probe(guess):
        return lo, guess, True
    if probe(guess + step):
        return guess + step, hi, False
    return guess, guess + step, True


EXPECT_FAILURE = "expect-failure"  # a case tag: crashing, hanging or running out is its result


def unexpected_failures(rows: list[dict]) -> list[dict]:
    """Case rows that make a run fail (exit 1): `incorrect` anywhere; `error` unless the case is
    a limit-search probe (a kernel refusing a size there is where the limit is); `crash`,
    `timeout` or `oom` unless the case is a limit-search probe or tagged expect-failure."""
    bad = []
    last = {(r.get("case_id"), r.get("backend")): r for r in rows}  # a retried case's last row
    for r in last.values():
        if r.get("kind") != "case":
            continue
        tags = r.get("tags") or []
        probe = "limit-probe" in tags
        expected = probe or EXPECT_FAILURE in tags
        if r["status"] == "error":
            if not probe:
                bad.append(r)
        elif r["status"] == "incorrect" or (r["status"] in FAILED and not expected):
            bad.append(r)
    return bad


def _probes_estimate(s: LimitSearch) -> int:
    return 2 + len(s.probe) + max(0, ((s.hi - s.lo) // s.step).bit_length())


def _summary(row: dict) -> tuple[str, str]:
    t = row.get("timing") or {}
    acc = row.get("accuracy") or {}
    extra = []
    if t.get("median_ms") is not None:
        extra.append(f"{t['median_ms']:.4f} ms")
    if acc.get("cos_diff") is not None:
        extra.append(f"cos_diff {acc['cos_diff']:.2e}")
    if row["status"] not in ("ok",) and row.get("message"):
        extra.append(row["message"].splitlines()[0][:100])
    return row["status"], " ".join(extra)
