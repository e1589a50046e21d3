"""Test-wide settings."""

from __future__ import annotations

import os


def pytest_configure(config):
    import torch

    # One thread, as the runner's CPU workers: on a small shared machine (CI's 2 cores) a busy
    # neighbour stalls every OpenMP barrier, and a 0.5 s test becomes 15 s.
    torch.set_num_threads(int(os.environ.get("DSV4BENCH_TEST_THREADS", "1")))
