"""pytest-benchmark over scenario cases: `pytest benchmarks --benchmark-only [--scenario FILE]`.

Every (case, backend) of the scenario (default: the CPU smoke scenario) is one benchmark; its
accuracy against the oracle goes into extra_info and a case outside tolerance fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def pytest_addoption(parser):
    group = parser.getgroup("dsv4bench")
    group.addoption(
        "--scenario",
        action="append",
        default=[],
        help="scenario YAML to benchmark (repeatable; default scenarios/smoke.yaml)",
    )
    group.addoption(
        "--bench-backend",
        action="append",
        default=[],
        help="run these backends on every case instead of the scenario's (repeatable)",
    )
    group.addoption("--plugin", action="append", default=[], help="backend plugin module")
    group.addoption(
        "--backend-opt",
        action="append",
        default=[],
        help="a backend's option NAME.OPTION=VALUE, e.g. flashmla.lib=PATH (repeatable)",
    )
    group.addoption("--flashmla-lib", default=None, help="same as --backend-opt flashmla.lib=PATH")


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
    for path in paths:
        try:
            sc = scenarios.load(path, known_backends=backends.catalog())
        except (scenarios.ScenarioError, OSError) as e:  # one line, as from the CLI
            raise pytest.UsageError(f"--scenario: {e}") from None
        backends.configure_all(sc.instances)
        jobs += [(c, b) for c in sc.cases for b in only] if only else sc.jobs()
    return jobs


def pytest_configure(config):
    import torch

    if not torch.cuda.is_available():  # as the runner's CPU workers time: one thread
        torch.set_num_threads(1)
    # a bad --scenario is the user's input: one line (pytest's usage error), before collection
    if config.getoption("scenario", None):
        config._dsv4bench_jobs = _jobs(config)


def pytest_generate_tests(metafunc):
    if "scenario_job" in metafunc.fixturenames:
        jobs = getattr(metafunc.config, "_dsv4bench_jobs", None) or _jobs(metafunc.config)
        ids = [f"{case.case_id}-{backend}" for case, backend in jobs]
        metafunc.parametrize("scenario_job", jobs, ids=ids)
