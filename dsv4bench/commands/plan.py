"""`dsv4bench plan`: every job and each backend's verdict, without running anything."""

from __future__ import annotations

from dsv4bench.commands.common import load, setup_backends, shard, take_shard, too_big_here
from dsv4bench.commands.found import kernels_found
from dsv4bench.commands.isolated import Isolated, in_process


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


def _verdicts(planned: list[tuple], child: Isolated) -> list[str | None]:
    """supports(case, arch) of each planned (job, arch): a backend that loads a kernel library
    to answer is asked in `child`, all its jobs in one question."""
    from dsv4bench import backends

    reasons: list[str | None] = [None] * len(planned)
    by_backend: dict[str, list[int]] = {}
    for i, (job, _) in enumerate(planned):
        by_backend.setdefault(job.backend, []).append(i)
    for name, where in by_backend.items():
        b = backends.get(name)
        asked = [(planned[i][0].case, planned[i][1]) for i in where]
        got = [b.supports(*x) for x in asked] if in_process(b) else child.supports(name, asked)
        for i, reason in zip(where, got, strict=True):
            reasons[i] = reason
    return reasons


def _ask(planned: list[tuple], names: list[str], plugins: list[str]) -> tuple[list, dict]:
    """(each planned job's verdict, each backend's kernels line), libraries loaded in a child."""
    from dsv4bench import backends

    child = Isolated(plugins)  # kernel libraries load there: one may end its process
    try:
        reasons = _verdicts(planned, child)
        found = {}
        for name in names:
            b = backends.get(name)
            found[name] = kernels_found(b) if in_process(b) else child.found(name)
    finally:
        child.close()
    return reasons, found


def cmd_plan(args) -> int:
    from dsv4bench.measure import hardware

    setup_backends(args)
    archs_of: dict[str, list[str]] = {}
    part = shard(args.shard)
    jobs, limits, _specs = load(args.scenario, args.backend, archs_of)
    if part is not None:
        jobs, limits = take_shard(part, jobs, limits)
    counts: dict[tuple[str, str], int] = {}
    why_of: dict[str, str] = {}
    planned = []
    for job in jobs:
        archs, why_of[job.case.scenario] = _plan_archs(args.arch, archs_of[job.case.scenario])
        planned += [(job, arch) for arch in archs]
    names = dict.fromkeys([*(j.backend for j in jobs), *(x.backend for x in limits)])
    reasons, found = _ask(planned, list(names), args.plugin)
    verdict_of = {}
    for (job, arch), reason in zip(planned, reasons, strict=True):
        verdict_of[(job.case.case_id, job.backend, arch)] = reason
        verdict = "unsupported" if reason else "supported"
        counts[(arch, verdict)] = counts.get((arch, verdict), 0) + 1
        line = f"{job.case.case_id:<60} {job.backend:<10} {arch:<6} {verdict}"
        print(line + (f": {reason}" if reason else ""))
    for lim in limits:
        step = f" step {lim.step}" if lim.step > 1 else ""
        print(f"limit {lim.axis} in [{lim.lo}, {lim.hi}){step} {lim.backend}: {lim.base.case_id}")
    for name, line in found.items():
        print(f"kernels {name}: {line}")
    for arch in dict.fromkeys(a for a, _ in counts):
        summary = ", ".join(f"{n} {v}" for (a, v), n in sorted(counts.items()) if a == arch)
        print(f"on {arch}: {summary}")
        verdict = lambda j, a: verdict_of[(j.case.case_id, j.backend, a)]
        here = arch in ("cpu", hardware.arch_of(0))
        big = too_big_here(jobs, arch, verdict) if here else []
        if big:  # planned for this very machine: what `run` here would refuse
            (job, why), n = big[0], len(big)
            print(f"on {arch}: {n} too big for this machine (run refuses them), e.g. ", end="")
            print(f"{job.case.case_id} on {job.backend}: {why}")
    whys = "; ".join(f"{name}: {why}" for name, why in why_of.items())
    print(f"{len(jobs)} jobs, {len(limits)} limit searches; planned for {whys or 'nothing'}")
    return 0
