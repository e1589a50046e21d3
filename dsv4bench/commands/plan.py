"""`dsv4bench plan`: every job and each backend's verdict, without running anything."""

from __future__ import annotations

from dsv4bench.commands.common import load, setup_backends, shard, take_shard, too_big_here
from dsv4bench.commands.read import kernels_found


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
    from dsv4bench.measure import hardware

    setup_backends(args)
    archs_of: dict[str, list[str]] = {}
    part = shard(args.shard)
    jobs, limits, _specs = load(args.scenario, args.backend, archs_of)
    if part is not None:
        jobs, limits = take_shard(part, jobs, limits)
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
    for name in dict.fromkeys([*(j.backend for j in jobs), *(lim.backend for lim in limits)]):
        print(f"kernels {name}: {kernels_found(backends.get(name))}")
    for arch in dict.fromkeys(a for a, _ in counts):
        summary = ", ".join(f"{n} {v}" for (a, v), n in sorted(counts.items()) if a == arch)
        print(f"on {arch}: {summary}")
        big = too_big_here(jobs, arch) if arch in ("cpu", hardware.arch_of(0)) else []
        if big:  # planned for this very machine: what `run` here would refuse
            (job, why), n = big[0], len(big)
            print(f"on {arch}: {n} too big for this machine (run refuses them), e.g. ", end="")
            print(f"{job.case.case_id} on {job.backend}: {why}")
    whys = "; ".join(f"{name}: {why}" for name, why in why_of.items())
    print(f"{len(jobs)} jobs, {len(limits)} limit searches; planned for {whys or 'nothing'}")
    return 0
