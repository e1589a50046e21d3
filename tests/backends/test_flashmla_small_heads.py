"""FlashMLA option small_heads: vLLM 0.34.0's Hopper sparse prefill call at 8/16/32 heads,
unpadded once the call's tokens exceed the SM count (twice it at 32 heads), else padded to 64
(the small-head policies of dsv4bench/backends/flashmla.py, read from the 0.34.0 wheel's
flashmla_sparse.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from dsv4bench.backends import flashmla as flashmla_policy
from dsv4bench.backends.base import Provider
from dsv4bench.backends.flashmla import FlashMLA, KernelOps
from dsv4bench.cases.case import Case
from dsv4bench.measure import hardware

SMS = 4  # a GPU of 4 SMs: the rule's edges at 4 tokens (8/16 heads) and 8 (32 heads)


def _ops(calls: list) -> KernelOps:
    """A prefill op that records the q it was handed and writes zeros."""

    def prefill(q, kv, indices, scale, d_v, sink, topk_length, out):
        calls.append(q.shape)
        out.zero_()
        return [out, q.new_zeros(q.shape[:2]).float(), q.new_zeros(q.shape[:2]).float()]

    return KernelOps(Provider("fake", "0"), decode=None, prefill=prefill)


def _prefill(heads: int, tokens: int, policy: str, monkeypatch, arch: str = "sm90"):
    calls: list = []
    monkeypatch.setattr(hardware, "arch_of", lambda device: arch)
    monkeypatch.setattr(hardware, "detect", lambda device=None: replace(hardware.CPU, sm_count=SMS))
    case = Case(scenario="t", op="prefill", model="v4-flash", d_qk=512, d_v=512, layout="v4",
                num_heads=heads, tokens=tokens, topk=128)  # fmt: skip
    x = {
        "q": torch.randn(tokens, heads, 512).to(torch.bfloat16),
        "kv": torch.randn(300, 1, 512).to(torch.bfloat16),
        "indices": torch.zeros(tokens, 1, 128, dtype=torch.int32),
    }
    p = FlashMLA(ops=_ops(calls), small_heads=policy).prepare(case, x, "cpu")
    out = p.finish(p.run())
    assert out.out.shape == (tokens, heads, 512)
    return calls[-1][1], p.info


@pytest.mark.parametrize(
    "heads, tokens, sent",
    [(8, 4, 64), (8, 5, 8), (16, 5, 16), (32, 8, 64), (32, 9, 32), (64, 9, 64)],
)
def test_vllm_034_pads_below_the_sm_count_and_not_above(monkeypatch, heads, tokens, sent):
    got, info = _prefill(heads, tokens, flashmla_policy.VLLM_034, monkeypatch)
    assert got == sent
    if heads in flashmla_policy.SMALL_HEADS:
        want = f"{heads} heads unpadded" if sent == heads else "padded to 64"
        assert info["small_heads"].startswith(f"vllm-0.34.0: {want}: {tokens} tokens")


def test_without_the_policy_or_off_hopper_every_call_pads(monkeypatch):
    assert _prefill(8, 9, "", monkeypatch)[0] == 64
    blackwell = _prefill(8, 9, flashmla_policy.VLLM_034, monkeypatch, arch="sm100")
    assert blackwell[0] == 128 and "small_heads" not in blackwell[1]  # sm100 pads to 128


def test_an_unknown_policy_is_one_line():
    with pytest.raises(ValueError, match="small_heads must be one of '', 'vllm-0.34.0'"):
        FlashMLA(small_heads="vllm-0.35")
