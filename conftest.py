"""Options of the scenario benchmarks (benchmarks/conftest.py), registered here at the checkout's
root: pytest reads the root conftest before it parses the command line, so that
`pytest --benchmark-only --scenario FILE` (a space, as in the README) is an option with its value
and not a path that hides benchmarks/ from collection. A FILE outside the checkout needs the
installed plugin (dsv4bench/commands/pytest_plugin.py, entry point pytest11): pytest then reads
no conftest.py of the checkout before it parses."""


def pytest_addoption(parser):
    from dsv4bench.commands.pytest_plugin import add_options

    add_options(parser)


def pytest_configure(config):
    from dsv4bench.commands.pytest_plugin import check_options

    check_options(config)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    """Every test marked `gpu` skips without CUDA, whether or not it says so itself (three that
    did not made `make gpu-test` fail on a machine without a GPU)."""
    import pytest

    if _cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (marked gpu)")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


def _gpu_tests_only(config) -> bool:
    """`pytest -m gpu` (make gpu-test), in the process that reports (not an xdist worker)."""
    return (config.getoption("markexpr") or "").strip() == "gpu" and not hasattr(
        config, "workerinput"
    )


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _gpu_tests_only(config) and not _cuda():
        skipped = len(terminalreporter.stats.get("skipped", []))
        terminalreporter.write_line(f"no CUDA GPU: 0 tests ran ({skipped} gpu tests skipped)")


def pytest_sessionfinish(session, exitstatus):
    """`make gpu-test` without a GPU ran nothing: it exits 5 (pytest's "no tests ran"), not 0,
    so that a job meant to test GPUs cannot pass on a machine without one."""
    import pytest

    if exitstatus == pytest.ExitCode.OK and _gpu_tests_only(session.config) and not _cuda():
        session.exitstatus = pytest.ExitCode.NO_TESTS_COLLECTED
