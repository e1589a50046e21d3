from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsv4bench.cases.case import Tolerance
from dsv4bench.cases.output import Output
from dsv4bench.measure import hardware, metrics
from tests.factories import V4, V32, make_case

INF = math.inf


V32_H128 = {**V32, "num_heads": 128}  # the cases below unless they say otherwise


def _randn(*shape, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


# ----------------------------------------------------------------------------- accuracy


def test_identical_outputs():
    x = _randn(4, 3, 8)
    lse = _randn(4, 3)
    acc = metrics.accuracy(Output(x, lse), Output(x.clone(), lse.clone()))
    assert acc["cos_diff"] == 0 and acc["max_abs"] == 0 and acc["max_rel"] == 0
    assert acc["lse_max_abs"] == 0 and acc["nonfinite"] == 0 and acc["lse_mismatch"] == 0
    assert acc["mismatched"] == 0
    assert metrics.within_tolerance(acc, Tolerance()) == (True, "")


@pytest.mark.parametrize("s", [0.5, 0.99, 1.001, 2.0, -1.0])
def test_scaled_output_closed_form(s):
    x = _randn(64, 16)
    acc = metrics.accuracy(Output(x), Output(s * x))
    assert acc["cos_diff"] == pytest.approx((1 - s) ** 2 / (1 + s * s), rel=1e-12)
    assert acc["max_rel"] == pytest.approx(abs(1 - s), rel=1e-12)
    assert acc["max_abs"] == pytest.approx(abs(1 - s) * float(x.abs().max()), rel=1e-12)


def test_orthogonal_vectors():
    acc = metrics.accuracy(Output(torch.tensor([1.0, 0.0])), Output(torch.tensor([0.0, 1.0])))
    assert acc["cos_diff"] == pytest.approx(1.0)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 300), st.floats(1e-6, 1.0), st.integers(0, 2**16))
def test_cos_diff_definition_and_chunking(n, noise, seed):
    e = _randn(n, seed=seed)
    a = e + noise * _randn(n, seed=seed + 1)
    dot, ee, aa = float(e @ a), float(e @ e), float(a @ a)
    whole = metrics.compare_tensors(e, a)
    assert whole["cos_diff"] == pytest.approx(1 - 2 * dot / (ee + aa), rel=1e-6, abs=1e-15)
    old = metrics.CHUNK
    metrics.CHUNK = 7
    try:
        chunked = metrics.compare_tensors(e, a)
    finally:
        metrics.CHUNK = old
    for key in ("cos_diff", "max_abs", "max_rel", "rel_eps"):
        assert chunked[key] == pytest.approx(whole[key], rel=1e-9, abs=1e-300)


def test_max_rel_uses_a_floor_near_zero():
    e = torch.tensor([1.0, -1.0, 1.0, 1e-9])
    a = torch.tensor([1.0, -1.0, 1.0, 0.01])
    acc = metrics.compare_tensors(e, a)
    rms = math.sqrt((3 + 1e-18) / 4)
    assert acc["rel_eps"] == pytest.approx(metrics.REL_FLOOR * rms)
    assert acc["max_rel"] == pytest.approx((0.01 - 1e-9) / acc["rel_eps"])


def test_mixed_dtypes_and_layouts():
    ref = _randn(16, 8, 64, dtype=torch.float32)
    bf = ref.to(torch.bfloat16).transpose(0, 1).contiguous().transpose(0, 1)  # non-contiguous
    acc = metrics.accuracy(Output(ref), Output(bf))
    assert 0 < acc["cos_diff"] < 1e-5  # bf16 rounding alone: about 2**-18
    assert acc["max_rel"] <= 2**-8 + 1e-12


def test_nan_in_actual_is_flagged():
    e = _randn(10)
    a = e.clone()
    a[3] = math.nan
    acc = metrics.accuracy(Output(e), Output(a))
    assert acc["nonfinite"] == 1 and acc["cos_diff"] == INF
    ok, why = metrics.within_tolerance(acc, Tolerance())
    assert not ok and "non-finite" in why


def test_inf_in_actual_is_flagged_but_matching_inf_is_not():
    e = torch.tensor([1.0, INF, 2.0])
    assert metrics.compare_tensors(e, torch.tensor([1.0, INF, 2.0]))["nonfinite"] == 0
    assert metrics.compare_tensors(e, torch.tensor([1.0, -INF, 2.0]))["nonfinite"] == 1
    assert metrics.compare_tensors(e, torch.tensor([INF, INF, 2.0]))["nonfinite"] == 1


def test_lse_plus_inf_means_no_key():
    out = _randn(2, 3)
    lse = torch.tensor([[1.0, INF, 0.5], [INF, 2.0, 3.0]])
    same = metrics.accuracy(Output(out, lse), Output(out, lse.clone()))
    assert same["lse_max_abs"] == 0 and same["lse_mismatch"] == 0

    neg = lse.clone()
    neg[0, 1] = -INF  # log(0) is -inf, but the contract says +inf
    acc = metrics.accuracy(Output(out, lse), Output(out, neg))
    assert acc["lse_mismatch"] == 1 and acc["nonfinite"] == 0
    ok, why = metrics.within_tolerance(acc, Tolerance())
    assert not ok and "lse" in why

    off = lse.clone()
    off[1, 2] += 0.25
    acc = metrics.accuracy(Output(out, lse), Output(out, off))
    assert acc["lse_max_abs"] == pytest.approx(0.25) and acc["lse_mismatch"] == 0
    assert not metrics.within_tolerance(acc, Tolerance(lse_abs=0.1))[0]
    assert metrics.within_tolerance(acc, Tolerance(lse_abs=0.3))[0]


def test_missing_lse_is_not_judged():
    x = _randn(3, 4)
    acc = metrics.accuracy(Output(x, torch.zeros(3)), Output(x, None))
    assert acc["lse_max_abs"] is None and acc["lse_mismatch"] == 0
    assert metrics.within_tolerance(acc, Tolerance())[0]


def test_cos_diff_past_tolerance():
    x = _randn(100)
    acc = metrics.accuracy(Output(x), Output(1.01 * x))
    ok, why = metrics.within_tolerance(acc, Tolerance(cos_diff=5e-6))
    assert not ok and why.startswith("cos_diff")


def test_integer_outputs_compare_exactly():
    e = torch.tensor([[5, -1, 7]], dtype=torch.int32)
    a = torch.tensor([[5, -1, 8]], dtype=torch.int32)
    acc = metrics.accuracy(Output(e), Output(a))
    assert acc["mismatched"] == 1 and acc["max_abs"] == 1


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match="shape"):
        metrics.accuracy(Output(torch.zeros(2, 3)), Output(torch.zeros(3, 2)))


def test_empty_and_zero_tensors():
    assert metrics.compare_tensors(torch.zeros(0), torch.zeros(0))["cos_diff"] == 0
    assert metrics.compare_tensors(torch.zeros(5), torch.zeros(5))["cos_diff"] == 0


# ----------------------------------------------------------------------------- throughput

# docs/kernel-facts.md, H100 and H200 peaks: H100 80GB HBM3, FlashMLA (vLLM 0.26.0 wheel),
# (case, median ms, TFLOP/s)
V4_PAGED = {**V4, "page_size": 256}
ANCHORS = [
    (dict(V32, op="decode", batch_size=64, num_heads=128, topk=2048), 0.110, 331),
    (dict(V32, op="decode", batch_size=128, s_q=2, num_heads=128, topk=2048), 0.418, 350),
    (dict(V4_PAGED, op="decode", batch_size=64, num_heads=64, topk=512), 0.044, 98),
    (dict(V4_PAGED, op="decode", batch_size=128, num_heads=128, topk=512), 0.066, 258),
    (dict(V32, op="prefill", tokens=4096, num_heads=128, topk=2048, context_len=32768), 4.21, 555),
    (dict(V4_PAGED, op="prefill", tokens=4096, num_heads=64, topk=512), 0.643, 427),
    (dict(V4_PAGED, op="prefill", tokens=4096, num_heads=128, topk=1024), 2.15, 510),
]


@pytest.mark.parametrize("fields, ms, tflops", ANCHORS)
def test_flops_reproduce_the_measured_anchors(fields, ms, tflops):
    case = make_case(V32_H128, fields)
    got = metrics.derived(case, {"median_ms": ms}, hardware.TABLE["h100"])
    # the anchors' times carry 2-3 significant digits: 0.066 ms stands for 0.0655..0.0665
    assert got["tflops"] == pytest.approx(tflops, rel=0.012)
    keys = case.topk + case.extra_topk
    assert got["flops"] == 2 * case.query_tokens * case.num_heads * keys * (case.d_qk + case.d_v)


def test_v4_anchor_counts_512_keys_not_window_plus_512():
    only = make_case(V32_H128, V4_PAGED, batch_size=64, num_heads=64, topk=512)
    with_window = dataclasses.replace(only, topk=128, extra_topk=512, window=128)
    rate = metrics.attention_flops(only) / 0.044e-3 / 1e12
    rate_window = metrics.attention_flops(with_window) / 0.044e-3 / 1e12
    assert round(rate) == 98
    assert round(rate_window) == 122  # what the same time would mean with 128 + 512 keys


def test_padded_heads_flops():
    case = make_case(V32_H128, V4_PAGED, batch_size=4, num_heads=8, topk=512)
    got = metrics.derived(case, {"median_ms": 1.0}, hardware.TABLE["h100"], padded_heads=64)
    assert got["flops_padded"] == 8 * got["flops"]


def test_attention_bytes_decode_by_hand():
    case = make_case(V32_H128, batch_size=2, s_q=1, num_heads=128, topk=2048, extra_topk=0)
    q = 2 * 128 * 576 * 2
    kv = 2 * 2048 * 656
    out = 2 * 128 * 512 * 2
    lse = 2 * 128 * 4
    idx = 2 * 2048 * 4
    assert metrics.attention_bytes(case) == q + kv + out + lse + idx
    small_ctx = dataclasses.replace(case, context_len=1000, s_q=4)
    unique = metrics.attention_bytes(small_ctx, unique=True)
    upper = metrics.attention_bytes(small_ctx)
    assert unique < upper
    assert unique - (upper - 8 * 2048 * 656) == 2 * 1000 * 656


def test_sparse_prefill_reads_bf16_workspace():
    case = make_case(V32_H128, op="prefill", tokens=16, topk=128, layout="v32")
    routed = dataclasses.replace(case, route="decode-kernel")
    assert metrics.kv_token_bytes(case) == 2 * 576
    assert metrics.kv_token_bytes(routed) == 656
    assert metrics.kv_token_bytes(make_case(V32_H128, layout="v4", d_qk=512)) == 584
    assert metrics.kv_token_bytes(make_case(V32_H128, layout="bf16")) == 2 * 576


def test_dequant_and_remap():
    deq = make_case(V32_H128, op="dequant", layout="v4", d_qk=512, batch_size=2, context_len=100)
    assert metrics.attention_flops(deq) == 0
    assert metrics.attention_bytes(deq) == 200 * (584 + 1024)
    remap = make_case(V32_H128, op="remap", batch_size=3, s_q=2, topk=64, extra_topk=64)
    assert metrics.attention_bytes(remap) == 6 * 128 * 8
    got = metrics.derived(remap, {"median_ms": 0.01}, hardware.TABLE["h100"])
    assert got["bound"] == "memory" and got["tflops"] == 0


def test_derived_bound_and_peak_fraction():
    case = make_case(V32_H128, ANCHORS[0][0])
    got = metrics.derived(case, {"median_ms": 0.110}, hardware.TABLE["h100"])
    assert got["bound"] == "compute"
    assert got["peak_fraction"] == pytest.approx(got["tflops"] / 989.4, rel=1e-9)
    assert got["gbps"] == pytest.approx(got["bytes"] / 0.110e-3 / 1e9)


def test_a_call_that_does_no_work_has_no_rate_of_bytes_nor_fraction_of_peak():
    """The empty-chunk edge: a prefill call given none of its chunk's tokens. Its time is a
    launch: bytes over it would read as tens of percent of the H100's bandwidth."""
    case = make_case(V32_H128, op="prefill", tokens=64, topk=128, edge="empty-chunk")
    got = metrics.derived(case, {"median_ms": 0.004}, hardware.TABLE["h100"])
    assert got["flops"] == 0 and got["tflops"] == 0 and got["bytes_unique"] > 0
    assert got["gbps"] is None and got["peak_fraction"] is None and got["bound"] is None
    real = metrics.derived(dataclasses.replace(case, edge=None), {"median_ms": 0.004},
                           hardware.TABLE["h100"])  # fmt: skip
    assert real["peak_fraction"] > 0 and real["gbps"] > 0


def test_derived_without_peaks_or_time():
    case = make_case(V32_H128)
    cpu = metrics.derived(case, {"median_ms": 2.0}, hardware.CPU)
    assert cpu["tflops"] > 0 and cpu["peak_fraction"] is None and cpu["bound"] is None
    untimed = metrics.derived(case, None, hardware.TABLE["h100"])
    assert untimed["tflops"] is None and untimed["flops"] > 0


def test_prefill_memory_roof_counts_shared_keys_once():
    chunk = make_case(
        V32_H128,
        op="prefill",
        model="v4-flash",
        d_qk=512,
        num_heads=64,
        tokens=4096,
        topk=128,
        extra_topk=512,
        compress_ratio=4,
        window=128,
        layout="v4",
        context_len=32768,
        batch_size=1,
    )
    d = metrics.derived(chunk, {"median_ms": 1.0}, hardware.lookup("NVIDIA H100 80GB HBM3"))
    assert d["bytes"] > 2 * d["bytes_unique"]  # 4096 queries share one key set
    assert d["gbps"] == pytest.approx(d["bytes_unique"] / 1e-3 / 1e9)
    assert d["bound"] == "compute" and d["peak_fraction"] < 1


def test_an_fp8_kernel_is_measured_against_the_fp8_peak():
    case = make_case(V32, op="prefill", num_heads=128, tokens=4096, topk=2048)
    hw = hardware.TABLE["h100"]
    timing = {"median_ms": 3.3}
    bf16 = metrics.derived(case, timing, hw)
    fp8 = metrics.derived(case, timing, hw, precision="fp8")
    assert fp8["tflops"] == bf16["tflops"] and bf16["bound"] == fp8["bound"] == "compute"
    assert fp8["peak_fraction"] == pytest.approx(bf16["peak_fraction"] / 2, rel=1e-3)
