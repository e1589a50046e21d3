"""Determinism and batch-invariance fields: exact for the oracle, caught for faulty kernels."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dsv4bench.backends import Backend, Output, Prepared, get
from dsv4bench.cases import inputs
from dsv4bench.cases.case import Timing
from dsv4bench.measure import invariance
from tests.factories import V4, V32, make_case

SMALL = dict(scenario="invariance-test", topk=64, context_len=128)
DECODE = dict(
    V4, **SMALL, num_heads=3, batch_size=4, page_size=64, timing=Timing(warmup=0, iters=1)
)
PREFILL = make_case(V32, SMALL, op="prefill", num_heads=2, tokens=5)


class _BatchDependent(Backend):
    """The oracle, nudged by one bf16 ULP on every request but the first when batched."""

    name, archs, ops = "batch-dependent", ("cpu",), ("decode",)

    def prepare(self, case, x, device):
        inner = get("torch").prepare(case, x, device)

        def finish(raw):
            out = inner.finish(raw)
            o = out.out.clone()
            if o.shape[0] > 1:
                bits = o[1:].view(torch.int16)
                bits += 1
            return Output(o, out.lse)

        return Prepared(run=inner.run, finish=finish)


class _Noisy(Backend):
    """The oracle plus a little noise that changes on every call (an atomics-order stand-in)."""

    name, archs, ops = "noisy", ("cpu",), ("decode",)

    def prepare(self, case, x, device):
        inner = get("torch").prepare(case, x, device)
        calls = [0]

        def run():
            calls[0] += 1
            return inner.run()

        def finish(raw):
            out = inner.finish(raw)
            return Output(out.out + calls[0] * 1e-2, out.lse)

        return Prepared(run=run, finish=finish)


def test_bf16_ulps():
    a = torch.tensor([1.0, -1.0, 0.0, 2.0, 1.0], dtype=torch.bfloat16)
    b = torch.tensor([1.0078125, -1.0078125, -0.0, 2.0, 1.0234375], dtype=torch.bfloat16)
    assert invariance.bf16_ulps(a, b).tolist() == [1, 1, 0, 0, 3]
    # opposite signs near zero: the distance at their magnitude, not every value between them
    small = torch.tensor([2.0**-16], dtype=torch.bfloat16)
    assert int(invariance.bf16_ulps(small, -small)[0]) == 256


def test_sample_requests():
    assert invariance.sample_requests(1) == []
    assert invariance.sample_requests(2) == [0, 1]
    assert invariance.sample_requests(9) == [0, 4, 8]


@pytest.mark.parametrize(
    "case",
    [make_case(DECODE), PREFILL, dataclasses.replace(PREFILL, route="decode-mixed")],
    ids=["decode", "prefill", "prefill-decode-mixed"],  # mixed: a token is sliced along s_q
)
def test_the_oracle_is_deterministic_and_batch_invariant(case):
    x = inputs.make_inputs(case, "cpu")
    prepared = get("torch").prepare(case, x, "cpu")
    d = invariance.determinism(prepared)
    assert d == {"bitwise_equal": True, "max_abs": 0.0, "max_ulps": 0}
    batched = prepared.finish(prepared.run())
    inv = invariance.batch_invariance(get("torch"), case, x, batched, "cpu")
    n = case.batch_size if case.op == "decode" else case.tokens
    assert inv["requests"] == invariance.sample_requests(n)
    assert inv["max_ulps"] == 0 and inv["argmax_changed"] == 0
    assert inv["rows"] == len(inv["requests"]) * case.s_q * case.num_heads


def test_a_batch_dependent_kernel_is_caught():
    case = make_case(DECODE)
    x = inputs.make_inputs(case, "cpu")
    backend = _BatchDependent()
    prepared = backend.prepare(case, x, "cpu")
    batched = prepared.finish(prepared.run())
    inv = invariance.batch_invariance(backend, case, x, batched, "cpu")
    assert inv["max_ulps"] == 1 and inv["max_abs"] > 0


def test_a_nondeterministic_kernel_is_caught():
    case = make_case(DECODE, batch_size=1)
    x = inputs.make_inputs(case, "cpu")
    d = invariance.determinism(_Noisy().prepare(case, x, "cpu"))
    assert d["bitwise_equal"] is False and d["max_abs"] == pytest.approx(1e-2, rel=0.1)
    assert invariance.batch_invariance(_Noisy(), case, x, None, "cpu") is None


class _InPlace(Backend):
    """Writes into one preallocated output, like FlashMLA's out_: runs share the buffer."""

    name, archs, ops = "in-place", ("cpu",), ("decode",)

    def prepare(self, case, x, device):
        inner = get("torch").prepare(case, x, device)
        buf = inner.finish(inner.run()).out.clone()
        calls = [0]

        def run():
            calls[0] += 1
            out = inner.finish(inner.run())
            buf.copy_(out.out + calls[0])
            return Output(buf, out.lse)

        return Prepared(run=run, finish=lambda raw: raw, poison=lambda: buf.fill_(float("nan")))


def test_determinism_does_not_compare_a_shared_buffer_with_itself():
    case = make_case(DECODE, batch_size=1)
    x = inputs.make_inputs(case, "cpu")
    d = invariance.determinism(_InPlace().prepare(case, x, "cpu"))
    assert d["bitwise_equal"] is False and d["max_abs"] == pytest.approx(1.0, rel=0.02)
