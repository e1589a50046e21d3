"""The scenario benchmarks' pytest options (benchmarks/conftest.py reads them), as a pytest
plugin: the checkout's root conftest.py adds them, and so does this module where the package is
installed (entry point `pytest11`). That matters for `pytest --benchmark-only --scenario FILE`
with FILE outside the checkout: pytest takes FILE for a test path before it knows the option,
finds the rootdir and configuration around FILE, and never reads the checkout's conftest.py.
Loaded as a plugin, the option is known, and the checkout's benchmarks/ is what is collected."""

from __future__ import annotations

from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
MARKERS = ("gpu: needs a CUDA GPU (skipped without one)", "slow: takes more than a few seconds")


def add_options(parser) -> None:
    """The options, once (the root conftest and the installed plugin may both be loaded)."""
    group = parser.getgroup("dsv4bench")
    if any("--scenario" in option.names() for option in group.options):
        return
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


def pytest_addoption(parser) -> None:
    add_options(parser)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args) -> None:
    """`--scenario FILE` and no test path, where pytest found no configuration (FILE outside
    the checkout made it look there): collect the checkout's benchmarks/ (its conftest.py reads
    the scenario), not whatever the current folder holds."""
    known = early_config.known_args_namespace
    outside = early_config.inipath is None and known.scenario and not known.file_or_dir
    if outside and BENCHMARKS.is_dir():
        args.append(str(BENCHMARKS))
        known.file_or_dir.append(str(BENCHMARKS))


def check_options(config) -> None:
    """--bench-backend names a registered backend: one usage line at start (exit 4), not a
    failed test per case."""
    only = config.getoption("bench_backend", None)
    if not only or getattr(config, "_dsv4bench_checked", False):
        return
    config._dsv4bench_checked = True
    from dsv4bench import backends

    try:
        backends.setup(config.getoption("plugin"))
    except backends.PluginError as e:
        raise pytest.UsageError(f"--plugin: {e}") from None
    for name in only:
        if name not in backends.names():
            known = ", ".join(backends.names())
            raise pytest.UsageError(f"--bench-backend {name}: unknown backend (known: {known})")


def pytest_configure(config) -> None:
    if config.inipath is None:  # the checkout's pyproject.toml declares them otherwise
        for marker in MARKERS:
            config.addinivalue_line("markers", marker)
    check_options(config)
