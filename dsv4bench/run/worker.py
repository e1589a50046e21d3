"""The worker process: runs (case, backend) jobs sent by the runner, one JSON line each way.

Requests arrive on stdin; each answer is one stdout line starting with MARK (kernel libraries
may print to stdout too). stderr goes to a file the runner reads when this process dies.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import asdict

MARK = "@@dsv4bench@@ "
PARENT_ENV = "DSV4BENCH_RUNNER_PID"  # the runner's pid: a worker never outlives it
PARENT_POLL_S = 0.5


def die_with_parent() -> None:
    """End this process when the runner ends, however it ends (SIGKILL included): Linux's
    parent-death signal, and a thread that watches the parent pid where that is missing (other
    systems) or came too late (the runner died before this process asked for it)."""
    parent = int(os.environ.get(PARENT_ENV) or os.getppid())
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    if os.getppid() != parent:
        os._exit(1)
    threading.Thread(target=watch, daemon=True, name="die-with-parent").start()


class Cache:
    """The last case's inputs and expected outputs: backends of one case share them."""

    def __init__(self) -> None:
        self.key = None
        self.inputs: dict = {}
        self.fingerprint = ""
        self.expected: dict = {}


def check(case, backend, arch: str, cache: Cache) -> tuple[dict, object | None]:
    """Everything before timing: the verdict, the provider, inputs, the oracle's answer and the
    correctness run. Returns the row so far and the Prepared call (None if unsupported)."""
    import torch

    from dsv4bench import env
    from dsv4bench.backends import Unsupported
    from dsv4bench.cases import inputs
    from dsv4bench.cases.oracle import oracle_call
    from dsv4bench.measure import invariance, metrics
    from reference.layout_table import LAYOUTS

    device = "cpu" if arch == "cpu" else "cuda"
    row = {"status": "error", "message": "", "info": {}, "env": env.collect()}
    reason = backend.supports(case, arch)
    if reason:
        return {**row, "status": "unsupported", "message": reason}, None
    try:
        prov = backend.provider()
    except Unsupported as e:
        return {**row, "status": "unsupported", "message": str(e)}, None
    row["provider"] = {"name": prov.name, "version": prov.version, "location": prov.location}

    if cache.key != case.case_id:
        cache.key, cache.inputs, cache.expected = None, {}, {}
        cache.inputs = inputs.make_inputs(case, device)
        cache.fingerprint = inputs.fingerprint(cache.inputs)
        cache.key = case.case_id
    row["input_fingerprint"] = cache.fingerprint
    # fp32 scales (V3.2) are read differently per arch; ue8m0 ones exactly everywhere
    fp32_scales = (
        LAYOUTS.get(case.layout) is not None and LAYOUTS[case.layout].scale_format == "fp32"
    )
    reading = backend.v32_scale_reading(arch) if fp32_scales else None
    if reading not in cache.expected:
        cache.expected[reading] = oracle_call(case, cache.inputs, reading)()

    try:
        prepared = backend.prepare(case, cache.inputs, device)
    except Unsupported as e:
        return {**row, "status": "unsupported", "message": str(e)}, None
    row["info"] = dict(prepared.info)
    row["scale_reading"] = reading
    checks = case.timing.determinism or case.timing.batch_invariance
    if backend.is_oracle and not checks:  # its answer is `expected` itself: no call to check
        actual = cache.expected[reading]
    else:
        if prepared.poison is not None:
            prepared.poison()
        actual = prepared.finish(prepared.run())
    if device == "cuda":
        torch.cuda.synchronize()
    if backend.is_oracle:  # its answer is `expected` itself: no accuracy to measure
        row.update(status="ok", message="")
        row["info"]["reference_row"] = "the oracle itself: a timing baseline, no accuracy"
    else:
        expected = cache.expected[reading]
        if prepared.reads is not None:  # judged on the values the kernel reads
            on_reads = oracle_call(case, prepared.reads, reading)()
            conversion = metrics.accuracy(expected, on_reads)
            row["info"]["conversion"] = {
                k: conversion[k] for k in ("cos_diff", "max_abs", "max_rel", "lse_max_abs")
            }
            expected = on_reads
        acc = metrics.accuracy(expected, actual)
        ok, why = metrics.within_tolerance(acc, case.tolerance)
        if case.op == "indexer":  # top-k judged by the scores it selects (ties), not indices
            from dsv4bench.measure import topk

            expected = cache.expected[reading]
            picked = topk.compare_topk(
                expected.out, expected.topk, actual.topk, actual_logits=actual.out
            )
            acc.update(picked)
            problem = topk.topk_problem(acc)
            if ok and problem:
                ok, why = False, problem
        row.update(accuracy=acc, tolerance=asdict(case.tolerance))
        row.update(status="ok" if ok else "incorrect", message=why)
    if case.timing.determinism or case.timing.batch_invariance:
        row["accuracy"] = row.get("accuracy") or {}
        row["tolerance"] = asdict(case.tolerance)
    if case.timing.determinism:
        row["accuracy"]["determinism"] = invariance.determinism(prepared)
    if case.timing.batch_invariance:
        try:
            inv = invariance.batch_invariance(backend, case, cache.inputs, actual, device)
        except Unsupported as e:
            inv = {"error": f"a request alone is unsupported: {e}"}
        row["accuracy"]["batch_invariance"] = inv
    if reading and not backend.is_oracle:  # how far the reading alone moves the answer
        if None not in cache.expected:
            cache.expected[None] = oracle_call(case, cache.inputs, None)()
        exact = metrics.accuracy(cache.expected[None], actual)
        row["info"]["vs_exact_scales"] = {k: exact[k] for k in ("cos_diff", "max_abs")}
    return row, prepared


def run_job(job: dict, cache: Cache) -> dict:
    from dsv4bench import backends
    from dsv4bench.cases.case import Case
    from dsv4bench.measure import hardware, metrics, timing

    case = Case.from_dict(job["case"])
    arch = job["arch"]
    if arch == "cpu":
        _one_cpu_thread()
    backend = backends.get(job["backend"])
    row, prepared = check(case, backend, arch, cache)
    if prepared is None or row["status"] != "ok":  # a wrong answer's speed means nothing
        return row
    device = "cpu" if arch == "cpu" else "cuda"
    t = case.timing
    timer = t.timer
    if backend.is_oracle and timer == "both":
        # a reference row times the host-bound oracle (~60 launches a call): its profiler pass
        # (another `iters` calls plus parsing thousands of events) ranked nothing and took half
        # of a sweep's oracle time; events alone are its baseline figure
        timer = "events"
        row["info"]["timer"] = "events only: the oracle's kernel time ranks nothing"
    row["timing"] = timing.measure(
        prepared.run,
        device=device,
        warmup=t.warmup,
        iters=t.iters,
        flush_l2=t.flush_l2,
        timer=timer,
        graph=t.graph,
    )
    padded = row["info"].get("padded_heads")
    row["derived"] = metrics.derived(case, row["timing"], hardware.detect(device), padded)
    return row


def _one_cpu_thread() -> None:
    """CPU timings use one thread: on a small shared machine (CI's 2 cores) a busy neighbour
    stalls every barrier of a multi-threaded op, turning 1 ms into 100 ms; one thread only ever
    waits its turn, so contention slows a case by about the load, which compare's noise model
    can bound."""
    import torch

    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)


HOST_OOM = ("can't allocate memory", "cannot allocate memory")  # torch's CPU allocator, errno 12


def _classify(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, MemoryError) or "OutOfMemory" in type(exc).__name__:
        return "oom"
    if "out of memory" in text.lower() or any(m in text.lower() for m in HOST_OOM):
        return "oom"
    if "CUDA error" in text or "cudaError" in text or "device-side assert" in text:
        return "crash"
    return "error"


def main() -> int:
    from dsv4bench import backends

    die_with_parent()
    setup = json.loads(sys.stdin.readline())
    backends.setup(setup.get("plugins", []), setup.get("instances", []))
    print(MARK + json.dumps({"ready": True}), flush=True)
    cache = Cache()
    for line in sys.stdin:
        job = json.loads(line)
        try:
            answer = run_job(job, cache)
            # a failed graph capture leaves torch's CUDA state unfit for later jobs: start afresh
            fatal = "graph_error" in (answer.get("timing") or {})
        except BaseException as exc:  # every failure of a job becomes its result row
            status = _classify(exc)
            tb = traceback.format_exc(limit=3)
            print(tb, file=sys.stderr, flush=True)
            answer = {"status": status, "message": f"{type(exc).__name__}: {exc}"[:2000]}
            cache.key = None
            fatal = status == "crash"  # a CUDA error poisons the context: start afresh
        print(MARK + json.dumps(answer, default=str), flush=True)
        if fatal:
            return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
