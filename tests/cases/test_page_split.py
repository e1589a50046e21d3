"""The page_split op (FlashInfer sm120's 64-token pages from an engine's 256-token V4 pages):
its rules, inputs, oracle and bytes, the project's one-launch Triton kernel (CPU interpreter)
and the worker's exact judgement. On a GPU it is timed as its own row
(scenarios/compare/engines_sm90.yaml)."""

from __future__ import annotations

import pytest
import torch

from dsv4bench.backends.torch_ref import TorchReference
from dsv4bench.backends.triton import backend as tk
from dsv4bench.backends.triton import cache_ops
from dsv4bench.cases.case import Tolerance
from dsv4bench.cases.inputs import make_inputs
from dsv4bench.cases.oracle import oracle_call
from dsv4bench.measure import metrics
from dsv4bench.run.worker import Cache, check
from dsv4bench.scenarios import validate_case
from reference import layouts
from tests.factories import V4, make_case

SPLIT = dict(
    V4,
    op="page_split",
    page_size=256,
    context_len=600,
    batch_size=2,
    topk=128,
    window=128,
    sink=True,
)


def test_rules():
    assert validate_case(make_case(SPLIT)) is None
    assert "re-pages a v4 cache" in validate_case(
        make_case(SPLIT, model="v3.2", d_qk=576, layout="v32", page_size=64, window=0, sink=False)
    )
    assert "expected a multiple of 64 above 64, got 64" in validate_case(
        make_case(SPLIT, page_size=64)
    )
    assert "got 96" in validate_case(make_case(SPLIT, page_size=96))
    assert "only prefill has tokens" in validate_case(make_case(SPLIT, tokens=64))
    assert Tolerance().resolved("page_split").cos_diff == 0.0  # a copy is exact or wrong


def test_oracle_keeps_every_tokens_bytes_and_slot():
    case = make_case(SPLIT)
    x = make_inputs(case, "cpu")
    cache = x["k_cache"]
    assert cache.shape[1] == 256 and cache.shape[0] * 256 >= 1200
    out = oracle_call(case, x)().out
    assert out.shape == (cache.shape[0] * 4, 64, 1, 584) and out.stride(0) == 37440
    assert torch.equal(layouts.dequantize_v4(out), layouts.dequantize_v4(cache))
    assert metrics.attention_bytes(case) == 2 * 1200 * 584 and metrics.attention_flops(case) == 0


@pytest.mark.parametrize("page_size, pages", [(256, 3), (128, 5), (64 * 5, 2)])
def test_triton_split_is_the_oracles_bit_for_bit(page_size, pages):
    cache = layouts.quantize_v4(
        torch.randn(page_size * pages - 7, 512).to(torch.bfloat16), page_size
    )
    want = layouts.split_pages_v4(cache, 64)
    got = cache_ops.page_split(cache)
    assert got.stride() == want.stride() and torch.equal(got, want)
    # a view into a larger cache (storage offset, padded stride) reads its own pages only
    view = cache[1:]
    assert torch.equal(cache_ops.page_split(view), layouts.split_pages_v4(view, 64))


def test_triton_split_reads_an_unpadded_source_stride():
    # every quantize_v4 cache pads its page stride to R x the 64-token page's (37440 x 4):
    # a kernel stepping source pages by dst_stride * R would pass them all; 256 x 584 does not
    padded = layouts.quantize_v4(torch.randn(3 * 256 - 5, 512).to(torch.bfloat16), 256)
    tight = 256 * 584
    assert padded.stride(0) == 4 * 37440 != tight
    cache = torch.zeros(3 * tight, dtype=torch.uint8).as_strided(padded.shape, (tight, 584, 584, 1))
    cache.copy_(padded)
    want = layouts.split_pages_v4(cache, 64)
    assert torch.equal(layouts.dequantize_v4(want), layouts.dequantize_v4(padded))
    assert torch.equal(cache_ops.page_split(cache), want)


def test_triton_split_rejects_what_it_cannot_read():
    cache = layouts.quantize_v4(torch.randn(256, 512).to(torch.bfloat16), 256)
    with pytest.raises(ValueError, match="64-token pages, got page_size 32"):
        cache_ops.page_split(cache, 32)
    with pytest.raises(ValueError, match="do not split"):
        cache_ops.page_split(layouts.quantize_v4(torch.randn(96, 512).to(torch.bfloat16), 96))
    odd = torch.zeros(2 * 149762, dtype=torch.uint8).as_strided(
        (2, 256, 1, 584), (149762, 584, 584, 1)
    )
    with pytest.raises(ValueError, match="multiples of 4"):
        cache_ops.page_split(odd)


def test_backend_rows_are_judged_exactly():
    case = make_case(SPLIT)
    x = make_inputs(case, "cpu")
    expected = oracle_call(case, x)()
    p = tk.TritonKernels().prepare(case, x, "cpu")
    assert p.info["kernel"] == "page_split_v4"
    p.poison()
    got = p.finish(p.run())
    acc = metrics.accuracy(expected, got)
    assert acc["cos_diff"] == 0 and acc["mismatched"] == 0
    assert metrics.within_tolerance(acc, case.tolerance.resolved("page_split"))[0]
    # a kernel that leaves the poison in one token is caught: the tolerance is exact
    got.out[3, 5, 0, 7] ^= 1
    acc = metrics.accuracy(expected, got)
    ok, why = metrics.within_tolerance(acc, case.tolerance.resolved("page_split"))
    assert not ok and why.startswith("1 of ") and "cache bytes differ" in why
    assert acc["mismatched"] == acc["bytes_differ"] == 1 and acc["cos_diff"] > 0
    # the oracle's own row (torch, CPU): a timing baseline
    row, prepared = check(case, TorchReference(), "cpu", Cache())
    assert row["status"] == "ok" and prepared is not None
    assert tk.TritonKernels().supports(case, "sm90") is None
    assert "triton runs on sm90" in tk.TritonKernels().supports(case, "cpu")
