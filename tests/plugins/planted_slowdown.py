"""A test device: the `torch` backend with a planted slowdown, for the history gate in CI.

Each call runs the oracle's kernel as `torch` does, then busy-waits a fraction of the time that
call took (DSV4BENCH_PLANTED_SLOWDOWN, default 0.10: every call 10 % slower, in real time on the
machine as it is at that moment). Registered under the same name, an oracle as `torch` is, so its
rows match the unplanted run's rows key for key and differ only in their times.
"""

from __future__ import annotations

import os
import time

from dsv4bench.backends import register
from dsv4bench.backends.torch_ref import TorchReference

FRACTION = float(os.environ.get("DSV4BENCH_PLANTED_SLOWDOWN", "0.10"))


def slowed(run, fraction: float):
    """`run`, then a busy wait of `fraction` of the time `run` took."""

    def call():
        start = time.perf_counter()
        out = run()
        spent = time.perf_counter() - start
        until = time.perf_counter() + fraction * spent
        while time.perf_counter() < until:
            pass
        return out

    return call


class PlantedTorch(TorchReference):
    def prepare(self, case, inputs, device):
        prepared = super().prepare(case, inputs, device)
        prepared.run = slowed(prepared.run, FRACTION)
        return prepared


register(PlantedTorch(), replace=True)
