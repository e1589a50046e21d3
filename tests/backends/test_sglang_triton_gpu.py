"""sglang's Triton sparse MLA kernels compiled on an sm90 GPU against the oracle, every entry point
on a small and a real shape, judged with the case's tolerance (the backend declares none: see
backend.py). Needs the build (`dsv4bench kernels fetch sglang==0.5.23 --wheels DIR`, or
DSV4BENCH_SGLANG_TRITON_LIB=FOLDER)."""

from __future__ import annotations

import pytest
import torch

from dsv4bench.backends.sglang_triton import backend as sb
from dsv4bench.cases import inputs
from dsv4bench.cases.oracle import oracle_call
from dsv4bench.measure import metrics
from tests.factories import V4, V32, make_case

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
        reason="needs an sm90+ GPU",
    ),
]

V4_CASES = {
    "small-sink": dict(V4, num_heads=64, batch_size=2, s_q=1, context_len=4096, sink=True),
    "mtp4-128h": dict(V4, num_heads=128, batch_size=32, s_q=4, context_len=32768),
    "c4-extra": dict(
        V4,
        num_heads=64,
        batch_size=16,
        context_len=65536,
        compress_ratio=4,
        extra_topk=512,
        sink=True,
    ),
    "prefill-route": dict(
        V4, op="prefill", route="decode-kernel", num_heads=64, tokens=256, context_len=8192
    ),
}
V32_DECODE = {
    "v32-64h": dict(V32, num_heads=64, batch_size=8, context_len=16384),
    "v32-128h-mtp": dict(V32, num_heads=128, batch_size=4, s_q=2, context_len=8192),
}
V32_PREFILL = {
    "v32-prefill-32h": dict(V32, op="prefill", num_heads=32, tokens=1024, context_len=16384)
}


def _check(kernel: str, fields: dict) -> dict:
    backend = sb.SglangTriton(kernel=kernel)
    case = make_case(fields)
    reason = backend.supports(case, "sm90")
    assert reason is None, reason
    x = inputs.make_inputs(case, "cuda")
    prepared = backend.prepare(case, x, "cuda")
    got = prepared.finish(prepared.run())
    torch.cuda.synchronize()
    acc = metrics.accuracy(oracle_call(case, x)(), got)
    ok, why = metrics.within_tolerance(acc, case.tolerance)
    assert ok, (kernel, fields, why, acc, prepared.info)
    return acc


@pytest.mark.parametrize("kernel", ["sm120", "sm120-torch", "dsv4-fused"])
@pytest.mark.parametrize("label", list(V4_CASES))
def test_v4_entry_points_match_the_oracle(kernel, label):
    _check(kernel, V4_CASES[label])


@pytest.mark.parametrize("label", list(V32_DECODE))
def test_dsa_decode_matches_the_oracle(label):
    _check("dsa-decode", V32_DECODE[label])


@pytest.mark.parametrize("union", [0, 2])
@pytest.mark.parametrize("label", list(V32_PREFILL))
def test_dsa_prefill_matches_the_oracle(label, union):
    backend_fields = V32_PREFILL[label]
    b = sb.SglangTriton(kernel="dsa-prefill", union=union)
    case = make_case(backend_fields)
    x = inputs.make_inputs(case, "cuda")
    prepared = b.prepare(case, x, "cuda")
    acc = metrics.accuracy(oracle_call(case, x)(), prepared.finish(prepared.run()))
    ok, why = metrics.within_tolerance(acc, case.tolerance)
    assert ok, (union, why, acc)
