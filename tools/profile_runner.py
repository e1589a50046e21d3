"""Where a sweep's time goes outside the kernels: the worker's per-job steps, profiled.

    python tools/profile_runner.py SCENARIO... [--arch sm90] [--backend NAME] [--max-jobs N]

Runs the scenarios' jobs in this process, as a worker does (dsv4bench.run.worker.run_job, one
input/oracle cache), under cProfile, and prints: jobs and wall time per job, the time of each
step of a job (inputs, oracle, prepare, accuracy, timing passes, profiler parsing, memory
check, derived metrics) summed over the jobs, and how long a fresh worker process takes to
start and answer (what every limit-search probe pays).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STEPS = {  # a job's steps: (module file suffix, function name)
    "inputs": ("cases/inputs.py", "make_inputs"),
    "oracle": ("cases/oracle.py", "decode"),
    "oracle (prefill)": ("cases/oracle.py", "prefill"),
    "backend prepare": (None, "prepare"),
    "accuracy": ("measure/metrics.py", "accuracy"),
    "timing (all)": ("measure/timing.py", "measure"),
    "timed iterations": ("measure/timing.py", "_timed_iterations"),
    "profiler parsing": ("measure/timing.py", "profiler_activities"),
    "profiler spans": ("measure/timing.py", "time_in_spans"),
    "kernel breakdown": ("measure/timing.py", "kernel_breakdown"),
    "memory per call": ("measure/timing.py", "memory_per_call"),
    "graph": ("measure/timing.py", "graph_times"),
    "derived": ("measure/metrics.py", "derived"),
    "env": ("dsv4bench/env.py", "collect"),
    "hardware": ("measure/hardware.py", "detect"),
}


def jobs_of(paths: list[str], only: str | None):
    from dsv4bench import backends, scenarios

    backends.setup([])
    jobs = []
    for path in paths:
        sc = scenarios.load(path, known_backends=backends.catalog())
        backends.configure_all(sc.instances)
        jobs += [(c, b) for c, b in sc.jobs() if not only or b == only]
    return jobs


def step_times(stats: pstats.Stats) -> dict[str, float]:
    found: dict[str, float] = {}
    for (file, _line, name), (_cc, _nc, _tt, ct, _callers) in stats.stats.items():
        for step, (suffix, fn) in STEPS.items():
            if name == fn and (suffix is None or file.endswith(suffix)):
                if suffix is None and "backends" not in file:
                    continue
                found[step] = found.get(step, 0.0) + ct
    return found


def worker_start_s() -> float:
    """Seconds from spawning `python -m dsv4bench.run.worker` to its `ready` line."""
    from dsv4bench.run.runner import Worker

    t0 = time.perf_counter()
    w = Worker("cpu", [])
    took = time.perf_counter() - t0
    w.stop()
    return took


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("scenario", nargs="+")
    p.add_argument("--arch", default=None)
    p.add_argument("--backend")
    p.add_argument("--max-jobs", type=int, default=0)
    args = p.parse_args()
    from dsv4bench.measure import hardware
    from dsv4bench.run.worker import Cache, run_job

    arch = args.arch or hardware.arch_of(0)
    jobs = jobs_of(args.scenario, args.backend)
    if args.max_jobs:
        jobs = jobs[: args.max_jobs]
    cache, prof, walls = Cache(), cProfile.Profile(), []
    t0 = time.perf_counter()
    for case, backend in jobs:
        t = time.perf_counter()
        prof.enable()
        row = run_job({"case": case.to_dict(), "backend": backend, "arch": arch}, cache)
        prof.disable()
        walls.append((time.perf_counter() - t, backend, case.case_id, row["status"]))
    total = time.perf_counter() - t0
    print(
        f"{len(jobs)} jobs on {arch}: {total:.2f} s, {1e3 * total / max(1, len(jobs)):.0f} ms/job"
    )
    by_backend: dict[str, list[float]] = {}
    for w, b, _, _ in walls:
        by_backend.setdefault(b, []).append(w)
    for b, ws in sorted(by_backend.items()):
        print(f"  {b}: {len(ws)} jobs, {sum(ws):.2f} s, {1e3 * sum(ws) / len(ws):.0f} ms/job")
    print("slowest jobs:")
    for w, b, cid, status in sorted(walls, reverse=True)[:8]:
        print(f"  {1e3 * w:8.1f} ms  {cid} {b} {status}")
    steps = step_times(pstats.Stats(prof))
    print("steps, summed over the jobs (nested: timing (all) holds the passes below it):")
    for step in STEPS:
        if step in steps:
            print(f"  {step:<18} {steps[step]:8.2f} s  {1e3 * steps[step] / len(jobs):7.1f} ms/job")
    print(f"a fresh worker (spawn to ready): {worker_start_s():.2f} s")
    code = (
        "import time; t = time.perf_counter(); import torch; torch.zeros(1).cuda(); "
        "print(round(time.perf_counter() - t, 2))"
    )
    if arch != "cpu":
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        print(f"a fresh process: import torch + CUDA context: {out.stdout.strip()} s")
    pstats.Stats(prof).sort_stats("cumulative").print_stats(r"dsv4bench|profiler", 30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
