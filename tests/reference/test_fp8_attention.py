"""The Q8KV8 oracle (reference/fp8_attention.py) against a slow float64 model of the kernel's
loop: one query and head at a time, blocks of 64 in list order, a running max, P rounded to
e4m3 by hand (not by torch's cast)."""

from __future__ import annotations

import math

import pytest
import torch

from reference.attention import sparse_mla_prefill
from reference.fp8_attention import P_BLOCK, sparse_mla_prefill_fp8, to_e4m3


def round_e4m3(p: float) -> float:
    """p in [0, 1] to the nearest e4m3 value, ties to even: 3 mantissa bits, subnormal step
    2^-9 below 2^-6."""
    if p == 0.0:
        return 0.0
    exponent = max(math.floor(math.log2(p)), -6)
    step = 2.0 ** (exponent - 3)
    return round(p / step) * step  # Python rounds halves to even


def slow_fp8(q8, kv8, idx, sm_scale, q_scale, kv_scale, d_v, sink, topk_length, round_p):
    q = q8.double() * q_scale
    kv = kv8[:, 0].double() * kv_scale
    s_q, h, _ = q.shape
    out = torch.zeros(s_q, h, d_v, dtype=torch.float64)
    lse = torch.full((s_q, h), math.inf, dtype=torch.float64)
    for i in range(s_q):
        row = idx[i, 0].tolist()
        limit = len(row) if topk_length is None else int(topk_length[i])
        valid = [j for j, t in enumerate(row) if 0 <= t < kv.shape[0] and j < limit]
        for head in range(h):
            m, total = -math.inf, 0.0
            acc = torch.zeros(d_v, dtype=torch.float64)
            for start in range(0, len(row), P_BLOCK):
                block = [j for j in valid if start <= j < start + P_BLOCK]
                s = {j: float(q[i, head] @ kv[row[j]]) * sm_scale for j in block}
                new_m = max([m, *s.values()])
                if new_m == -math.inf:
                    continue
                acc *= math.exp(m - new_m)
                total *= math.exp(m - new_m)
                for j, logit in s.items():
                    p = math.exp(logit - new_m)
                    total += p
                    acc += (round_e4m3(p) if round_p else p) * kv[row[j], :d_v] / kv_scale
                m = new_m
            if total == 0.0:
                continue
            denom = total + (math.exp(float(sink[head]) - m) if sink is not None else 0.0)
            out[i, head] = acc * kv_scale / denom
            lse[i, head] = math.log(total) + m
    return out, lse


def _operands(seed: int, s_q=3, h=2, d=64, s_kv=300, topk=192, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    q8 = to_e4m3(torch.randn(s_q, h, d, generator=g) * 2, scale)
    kv8 = to_e4m3(torch.randn(s_kv, 1, d, generator=g) * 2, scale)
    idx = torch.stack([torch.randperm(s_kv, generator=g)[:topk] for _ in range(s_q)])
    idx[0, 150:] = -1  # a short row: its last block is partly invalid
    idx[1, 7] = s_kv + 5  # out of range: invalid with topk_length
    return q8, kv8, idx.int().view(s_q, 1, topk), g


@pytest.mark.parametrize("round_p", [True, False])
@pytest.mark.parametrize("with_sink", [False, True])
def test_matches_the_slow_kernel_model(round_p, with_sink):
    q8, kv8, idx, g = _operands(0)
    sink = torch.randn(2, generator=g) if with_sink else None
    length = torch.tensor([150, 192, 100], dtype=torch.int32)
    q_scale, kv_scale = 0.5, 0.25
    out, ml, lse = sparse_mla_prefill_fp8(
        q8, kv8, idx, 0.125, q_scale=q_scale, kv_scale=kv_scale, d_v=48,
        attn_sink=sink, topk_length=length, round_p=round_p,
    )  # fmt: skip
    want_out, want_lse = slow_fp8(q8, kv8, idx, 0.125, q_scale, kv_scale, 48, sink, length,
                                  round_p)  # fmt: skip
    torch.testing.assert_close(out.double(), want_out, atol=2e-5, rtol=2e-4)
    torch.testing.assert_close(lse.double(), want_lse, atol=2e-5, rtol=1e-5)
    assert torch.isfinite(ml).all()


def test_rounding_p_is_what_moves_the_answer():
    """The rounded and unrounded answers differ by about fp8's half step, far more than the
    fp32 noise between the fast and slow models."""
    q8, kv8, idx, _ = _operands(1)
    args = (q8, kv8, idx, 0.125)
    rounded = sparse_mla_prefill_fp8(*args, d_v=64, topk_length=torch.full((3,), 192))[0]
    plain = sparse_mla_prefill_fp8(*args, d_v=64, topk_length=torch.full((3,), 192),
                                   round_p=False)[0]  # fmt: skip
    rel = (rounded - plain).norm() / plain.norm()
    assert 1e-3 < rel < 0.1


def test_unrounded_equals_the_bf16_oracle_on_the_same_fp8_values():
    q8, kv8, idx, g = _operands(2)
    sink = torch.randn(2, generator=g)
    length = torch.tensor([150, 192, 100], dtype=torch.int32)
    out, ml, lse = sparse_mla_prefill_fp8(q8, kv8, idx, 0.1, d_v=64, attn_sink=sink,
                                          topk_length=length, round_p=False)  # fmt: skip
    want = sparse_mla_prefill(q8.float(), kv8.float(), idx, 0.1, d_v=64, attn_sink=sink,
                              topk_length=length)  # fmt: skip
    torch.testing.assert_close(out, want[0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(ml, want[1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, want[2], atol=1e-5, rtol=1e-5)


def test_without_topk_length_only_negative_indices_are_invalid():
    q8, kv8, idx, _ = _operands(3)
    idx[1, 0, 7] = 3  # in range: valid in both calls
    full = torch.full((3,), 192, dtype=torch.int32)
    a = sparse_mla_prefill_fp8(q8, kv8, idx, 0.1, d_v=64)
    b = sparse_mla_prefill_fp8(q8, kv8, idx, 0.1, d_v=64, topk_length=full)
    torch.testing.assert_close(a[0], b[0])


def test_a_query_without_valid_keys_gets_zero_and_infinite_lse():
    q8, kv8, idx, _ = _operands(4)
    idx[2] = -1
    out, ml, lse = sparse_mla_prefill_fp8(q8, kv8, idx, 0.1, d_v=64,
                                          attn_sink=torch.zeros(2))  # fmt: skip
    assert (out[2] == 0).all() and (lse[2] == math.inf).all() and (ml[2] == -math.inf).all()
    assert torch.isfinite(out[:2]).all()


def test_query_blocks_do_not_change_the_answer():
    q8, kv8, idx, _ = _operands(5, s_q=5)
    whole = sparse_mla_prefill_fp8(q8, kv8, idx, 0.1, d_v=64)
    blocked = sparse_mla_prefill_fp8(q8, kv8, idx, 0.1, d_v=64, block_bytes=1)
    for a, b in zip(whole, blocked, strict=True):
        torch.testing.assert_close(a, b)


def test_to_e4m3_saturates_and_scales():
    x = torch.tensor([1000.0, -1000.0, 1.0, 3.0])
    assert to_e4m3(x).float().tolist() == [448.0, -448.0, 1.0, 3.0]
    assert to_e4m3(x, 2.0).float().tolist()[2:] == [0.5, 1.5]
