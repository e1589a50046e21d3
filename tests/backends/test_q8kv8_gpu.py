"""The built Q8KV8 kernel on an H100/H200 (sm90) against both oracles, on small shapes of
V3.2 (dispatch, kv with zero rows) and V4 (dispatch_full: sink and lengths) at 64 and 128
heads: within the declared FP8 tolerance of the bf16 oracle, and close to the model of its
own arithmetic (reference/fp8_attention.py). Needs a q8kv8 build (`dsv4bench kernels fetch
sglang==0.5.23`, or `kernels unpack`) and nvcc; the first test builds the kernel (~90 s)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dsv4bench.backends.q8kv8.backend import DECLARED, Q8KV8
from dsv4bench.cases import inputs
from dsv4bench.cases.oracle import oracle_call
from dsv4bench.measure import metrics
from tests.factories import V4, V32, make_case


def _sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _sm90(), reason="needs an sm90 GPU (H100/H200)"),
]

SHAPES = {
    "v32-h64-t256-k2048": make_case(
        V32, op="prefill", num_heads=64, tokens=256, topk=2048, context_len=4096
    ),
    "v32-h32-t512-k2048-padded-to-64": make_case(
        V32, op="prefill", num_heads=32, tokens=512, topk=2048, context_len=8192
    ),
    "v4-h128-t512-c4-1024-sink": make_case(
        V4,
        model="v4-pro",
        op="prefill",
        num_heads=128,
        tokens=512,
        topk=128,
        window=128,
        extra_topk=1024,
        compress_ratio=4,
        context_len=8192,
        sink=True,
    ),  # fmt: skip
}


@pytest.fixture(scope="module")
def backend():
    b = Q8KV8()
    reason = b.build_reason()
    if reason:
        pytest.skip(reason)
    return b


@pytest.mark.parametrize("name", list(SHAPES))
def test_kernel_against_both_oracles(backend, name):
    case = SHAPES[name]
    x = inputs.make_inputs(case, "cuda")
    prepared = backend.prepare(case, x, "cuda")
    prepared.poison()
    actual = prepared.finish(prepared.run())
    torch.cuda.synchronize()
    own = metrics.accuracy(prepared.exact(), actual)
    assert own["nonfinite"] == 0
    assert own["cos_diff"] <= DECLARED.exact_cos_diff, own  # the rows' bound (backend.py)
    assert own["lse_max_abs"] <= DECLARED.exact_lse_abs, own
    assert own["max_logits_max_abs"] <= DECLARED.exact_lse_abs, own
    bf16 = metrics.accuracy(oracle_call(case, x)(), actual)
    # against the oracle the FP8 bounds alone: the exact_* ones are the kernel's own model's
    plain = dataclasses.replace(DECLARED, exact_cos_diff=None, exact_lse_abs=None)
    assert metrics.within_tolerance(bf16, plain)[0], bf16
    # rounding P is part of what the kernel does: the plain softmax over the same FP8
    # operands is further from it than its own model
    assert own["cos_diff"] < bf16["cos_diff"]
