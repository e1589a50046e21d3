"""Scenario cases as pytest-benchmark benchmarks (GPU-synchronized, L2 flushed between rounds)."""

from __future__ import annotations

import pytest
import torch

from dsv4bench import backends
from dsv4bench.measure import hardware
from dsv4bench.run.worker import Cache, check


def test_case(benchmark, scenario_job):
    case, name = scenario_job
    arch = hardware.arch_of(0)
    row, prepared = check(case, backends.get(name), arch, Cache())
    if prepared is None:
        pytest.skip(f"unsupported: {row['message']}")
    benchmark.extra_info.update(
        {k: v for k, v in row.items() if k != "info"},
        kind="case",
        scenario=case.scenario,
        case_id=case.case_id,
        op=case.op,
        params=case.params(),
        tags=list(case.tags),
        backend=name,
    )
    assert row["status"] == "ok", f"{case.case_id} on {name}: {row['message']}"

    if arch != "cpu":
        flush = torch.empty(
            int(torch.cuda.get_device_properties(0).L2_cache_size) // 2, device="cuda"
        )

        def setup():
            flush.zero_()  # cold L2, as the engine's events timer does
            torch.cuda.synchronize()

        def call():
            prepared.run()
            torch.cuda.synchronize()

        benchmark.pedantic(call, setup=setup, rounds=case.timing.iters, warmup_rounds=1)
    else:
        benchmark.pedantic(prepared.run, rounds=case.timing.iters, warmup_rounds=1)
