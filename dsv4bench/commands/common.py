"""What every command shares: the one-line usage error, backend setup (plugins, options),
scenario files -> jobs, the architecture and shard arguments."""

from __future__ import annotations

import sys
from pathlib import Path

from dsv4bench.cases.case import ARCHS


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


def check_out_file(out: str | None, inputs: list[Path], force: bool) -> None:
    """`--out FILE` of an import: never one of its own inputs, and an existing file only with
    --force (a converted scenario written over a file the user meant to keep is lost work)."""
    if not out:
        return
    path = Path(out)
    for given in inputs:  # an input file, or a file of an input folder
        mine = path.exists() and given.exists() and path.resolve() == given.resolve()
        inside = path.exists() and given.is_dir() and given.resolve() in path.resolve().parents
        if mine or inside:
            what = "is the input itself" if mine else f"is a file of the input folder {given}"
            raise UsageError(f"--out {out}: {what}; name another file")
    if path.is_dir():
        raise UsageError(f"--out {out}: is a directory; name a scenario file")
    if path.exists() and not force:
        raise UsageError(f"--out {out}: already exists; --force overwrites it")


def setup_backends(args) -> None:
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


def load(
    paths: list[str],
    only_backends: list[str] | None,
    archs: dict | None = None,
    *,
    run_on: str | None = None,
):
    """Scenarios -> (jobs, limit searches, serving specs); all validated before anything runs.
    `archs`, if given, gets each scenario's `arch` list by scenario name; `run_on`, if given,
    is the architecture the jobs will run on: a scenario not written for it is refused."""
    from dsv4bench import backends, scenarios, serving
    from dsv4bench.run.runner import Job

    # --backend NAME takes its instances too (flashmla -> flashmla-0.33)
    wanted = lambda b: not only_backends or {b, backends.get(b).base} & set(only_backends)
    jobs, limits, specs = [], [], []
    for path in dict.fromkeys(paths):  # a file named twice runs once
        _check_scenario_path(Path(path))
        try:
            entry = scenarios.load_any(path, known_backends=backends.catalog())
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
        if run_on and run_on not in entry.arch:
            raise UsageError(_not_for(path, entry.arch, run_on))
        jobs += [Job(case, b) for case, b in entry.jobs() if wanted(b)]
        limits += [lim for lim in entry.limits if wanted(lim.backend)]
    known = backends.names()  # the scenarios' own instances included
    for name in only_backends or []:
        if name not in known:
            raise UsageError(f"--backend {name}: unknown backend (known: {', '.join(known)})")
    _check_backends_used(only_backends, jobs, limits)
    return _unique(jobs, lambda j: (j.case.case_id, j.backend)), limits, specs


def _not_for(path: str, written_for: list[str], arch: str) -> str:
    """Why a scenario does not run here, as `plan` and `bench` refuse: its sizes are meant for
    other machines (GPU sizes on the CPU oracle run for hours)."""
    here = "this machine has no GPU" if arch == "cpu" else f"this machine's GPU is {arch}"
    return (
        f"{path}: written for arch {', '.join(written_for)}, and {here}; "
        f"--arch {arch} runs it here anyway"
    )


def _check_scenario_path(path: Path) -> None:
    """What is not a regular file is a one-line UsageError (the loader reads and decodes it)."""
    if not path.exists():
        raise UsageError(f"{path}: {_missing(path)}")
    if path.is_dir():
        raise UsageError(f"{path}: is a directory, not a scenario file (name its *.yaml files)")
    if not path.is_file():  # a FIFO or a device: reading it could block forever
        raise UsageError(f"{path}: not a regular file, not a scenario file")


def _missing(path: Path) -> str:
    """Why a path that does not exist is not a file: absent, a dangling link, a link loop."""
    import errno
    import os

    if not path.is_symlink():
        return "no such scenario file"
    try:
        os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "a symbolic link loop (it resolves to itself), not a scenario file"
    return f"a symbolic link to {os.readlink(path)}, which does not exist"


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


def arch(wanted: str | None, flag: str) -> str:
    """The architecture to run on: `wanted` (cpu, or this machine's GPU) or what is present."""
    from dsv4bench.measure import hardware

    present = hardware.arch_of(0)
    if wanted and wanted not in ("cpu", present):
        has = "has no GPU" if present == "cpu" else f"has an {present} GPU"
        raise UsageError(f"{flag}: this machine {has}")
    return wanted or present


def too_big_here(jobs: list, arch: str, supports=None) -> list[tuple]:
    """(job, why) for each job whose case's tensors alone exceed this machine's memory on
    `arch` (plan-time: the CPU oracle would swap for hours or be killed, a GPU run would only
    make an `oom` row); a backend that does not run the case here and a case tagged
    expect-failure (running out is its result) are left out. `supports(job, arch)`: the
    backend's verdict (default: asked here)."""
    import dataclasses

    from dsv4bench import backends
    from dsv4bench.measure import hardware
    from dsv4bench.run.runner import EXPECT_FAILURE
    from dsv4bench.scenarios.sizes import machine_problem

    memory = hardware.memory_bytes(arch)
    if memory is None:
        return []
    why_of: dict[str, str | None] = {}
    found = []
    for job in jobs:
        case = job.case
        if case.case_id not in why_of:
            why_of[case.case_id] = machine_problem(dataclasses.asdict(case), *memory)
        why = why_of[case.case_id]
        runs_here = why and EXPECT_FAILURE not in case.tags
        verdict = supports or (lambda j, a: backends.get(j.backend).supports(j.case, a))
        if runs_here and verdict(job, arch) is None:
            found.append((job, why))
    return found


def shard(text: str | None):
    from dsv4bench.run import shard

    if text is None:
        return None
    try:
        return shard.parse(text)
    except shard.ShardError as e:
        raise UsageError(str(e)) from None


def take_shard(part, jobs: list, limits: list) -> tuple[list, list]:
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
