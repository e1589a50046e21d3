"""Test-wide settings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.in_process import main_in_process

ROOT = Path(__file__).resolve().parent.parent


def pytest_configure(config):
    import torch

    # One thread, as the runner's CPU workers: on a small shared machine (CI's 2 cores) a busy
    # neighbour stalls every OpenMP barrier, and a 0.5 s test becomes 15 s.
    torch.set_num_threads(int(os.environ.get("DSV4BENCH_TEST_THREADS", "1")))


@pytest.fixture
def run_cli(capsys, monkeypatch):
    """main_in_process from the checkout's root: run_cli(*args, env=None) -> (exit code,
    stdout, stderr); `env` is set for the rest of the test (workers inherit it)."""
    monkeypatch.chdir(ROOT)

    def run(*args, env: dict | None = None) -> tuple[int, str, str]:
        for key, value in (env or {}).items():
            monkeypatch.setenv(key, value)
        code = main_in_process(*args)
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture(autouse=True)
def backends_as_they_were():
    """Every test leaves the backend registry as it found it: a plugin backend or instance one
    test builds in this process is not sent to the workers of a later test's run (under load
    `--dist loadfile` put test_runner.py before test_merge.py in one process, and test_merge's
    run failed: "worker did not start: unknown backend 'isolated'")."""
    from dsv4bench import backends

    backends.names()  # the shipped backends, loaded once (a flag keeps them loaded)
    registry, configured = dict(backends._REGISTRY), dict(backends._CONFIGURED)
    yield
    backends._REGISTRY.clear()
    backends._REGISTRY.update(registry)
    backends._CONFIGURED.clear()
    backends._CONFIGURED.update(configured)
