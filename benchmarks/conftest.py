"""pytest-benchmark over scenario cases: `pytest benchmarks --benchmark-only [--scenario FILE]`.

Every (case, backend) of the scenario (default: the CPU smoke scenario) is one benchmark; its
accuracy against the oracle goes into extra_info and a case outside tolerance fails. A scenario
whose `arch` leaves out this machine's (an sm90 file on a CPU) is skipped with that reason. The
options live in the checkout's root conftest.py, so `--scenario FILE` parses as well as
`--scenario=FILE`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _jobs(config):
    from dsv4bench import backends, scenarios

    backends.setup(config.getoption("plugin"))
    opts = config.getoption("backend_opt")
    if config.getoption("flashmla_lib"):
        opts = [f"flashmla.lib={config.getoption('flashmla_lib')}", *opts]
    backends.apply_options(opts)
    paths = config.getoption("scenario") or [str(ROOT / "scenarios" / "smoke.yaml")]
    only = config.getoption("bench_backend")
    jobs = []
    config._dsv4bench_archs = archs = {}
    for path in paths:
        try:
            sc = scenarios.load(path, known_backends=backends.catalog())
        except (scenarios.ScenarioError, OSError) as e:  # one line, as from the CLI
            raise pytest.UsageError(f"--scenario: {e}") from None
        backends.configure_all(sc.instances)
        archs[sc.name] = list(sc.arch)
        jobs += [(c, b) for c in sc.cases for b in only] if only else sc.jobs()
    return jobs


def pytest_configure(config):
    import torch

    if not torch.cuda.is_available():  # as the runner's CPU workers time: one thread
        torch.set_num_threads(1)
    # a bad --scenario is the user's input: one line (pytest's usage error), before collection
    # (a bad --bench-backend: dsv4bench/commands/pytest_plugin.py)
    if config.getoption("scenario", None):
        config._dsv4bench_jobs = _jobs(config)


def pytest_generate_tests(metafunc):
    if "scenario_job" in metafunc.fixturenames:
        jobs = getattr(metafunc.config, "_dsv4bench_jobs", None) or _jobs(metafunc.config)
        ids = [f"{case.case_id}-{backend}" for case, backend in jobs]
        metafunc.parametrize("scenario_job", [_param(metafunc.config, j) for j in jobs], ids=ids)


def _param(config, job):
    """A job, skipped (before any oracle runs) when its scenario is for another architecture."""
    from dsv4bench.measure import hardware

    here = hardware.arch_of(0)
    archs = config._dsv4bench_archs.get(job[0].scenario) or [here]
    if here in archs:
        return job
    why = f"scenario {job[0].scenario} is for {', '.join(archs)}; this machine is {here}"
    return pytest.param(job, marks=pytest.mark.skip(reason=why))
