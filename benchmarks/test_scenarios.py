"""Scenario cases as pytest-benchmark benchmarks (GPU-synchronized, L2 flushed between rounds)."""

from __future__ import annotations

import pytest
import torch

from dsv4bench import backends, env, hardware, metrics
from dsv4bench.backends import Unsupported
from dsv4bench.backends.torch_ref import oracle_call
from dsv4bench.inputs import fingerprint, make_inputs


def test_case(benchmark, scenario_job):
    case, name = scenario_job
    backend = backends.get(name)
    arch = hardware.arch_of(0)
    device = "cpu" if arch == "cpu" else "cuda"
    reason = backend.supports(case, arch)
    if reason:
        pytest.skip(f"unsupported: {reason}")
    try:
        provider = backend.provider()
    except Unsupported as e:
        pytest.skip(f"unsupported: {e}")

    inputs = make_inputs(case, device)
    reading = backend.v32_scale_reading(arch) if case.layout == "v32" else None
    expected = oracle_call(case, inputs, reading)()
    prepared = backend.prepare(case, inputs, device)
    if prepared.poison is not None:
        prepared.poison()
    acc = metrics.accuracy(expected, prepared.finish(prepared.run()))
    ok, why = metrics.within_tolerance(acc, case.tolerance)
    benchmark.extra_info.update(
        kind="case",
        scenario=case.scenario,
        case_id=case.case_id,
        op=case.op,
        params=case.params(),
        tags=list(case.tags),
        backend=name,
        provider={"name": provider.name, "version": provider.version},
        status="ok" if ok else "incorrect",
        message=why,
        accuracy=acc,
        input_fingerprint=fingerprint(inputs),
        env=env.collect(),
    )
    assert ok, f"{case.case_id} on {name}: {why}"

    if device == "cuda":
        flush = torch.empty(
            int(torch.cuda.get_device_properties(0).L2_cache_size) // 2, device=device
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
