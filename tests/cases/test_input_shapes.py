"""input_shapes gives the shapes and dtypes make_inputs makes, without making them: every op,
route, ragged batch and edge at sizes the CPU builds in a moment."""

from __future__ import annotations

from pathlib import Path

import pytest

from dsv4bench.cases.input_shapes import input_shapes
from dsv4bench.cases.inputs import make_inputs
from dsv4bench.scenarios import load
from tests.factories import load_scenario

ROOT = Path(__file__).resolve().parents[2]
SHAPES = """
name: shapes
arch: [cpu]
backends: [torch]
cases:
  # ragged decode: V3.2, V4 C4 (window 128 past the shortest request) and C128, MTP
  - {op: decode, model: [v3.2, v4-flash], num_heads: 8, topk: 64, s_q: [1, 2],
     context_lens: {lengths: [100, 700, 1300]}}
  - {op: decode, model: v4-flash, num_heads: 8, compress_ratio: 128, s_q: 2,
     context_lens: {lengths: [256, 1024]}}
  # ragged prefill (sglang NSA): a chunk per request over one workspace
  - {op: prefill, model: [v3.2, v4-flash], num_heads: 8, topk: 64, tokens: 32,
     context_lens: {lengths: [512, 1300, 200]}}
  # a chunk longer than the window on the decode routes; a V3.2 top-k past 128
  - {op: prefill, model: v4-flash, num_heads: 8, tokens: 200, context_len: 700,
     route: [decode-kernel, decode-mixed, sparse-prefill]}
  - {op: prefill, model: v3.2, num_heads: 8, topk: 192, tokens: 16, context_len: 400}
  # the engines' failure shapes
  - {op: prefill, model: [v3.2, v4-flash], num_heads: 8, topk: 64, context_len: 512, tokens: 16,
     edge: empty-chunk}
  - {op: decode, model: [v3.2, v4-flash], num_heads: 8, topk: 64, context_len: 512,
     batch_size: 3, s_q: 2, edge: empty-request}
  - {op: decode, model: v4-flash, num_heads: 8, context_len: 512, batch_size: 2, graph_batch: 4,
     edge: graph-pad-vllm}
  # an indexer chunk over C4 entries; top-k through a block table and over a chunk
  - {op: indexer, model: v4-flash, topk: 32, tokens: 24, context_len: 1000}
  - {op: indexer, model: v3.2, topk: 32, batch_size: 3, s_q: 2, context_len: 1000}
  - {op: topk, model: v4-flash, topk: 32, tokens: 16, context_len: 900, form: [page_table, plain]}
  - {op: dequant, model: v4-flash, batch_size: 3, context_len: 300, page_size: 256}
  # the cache writers (a ragged batch, V4.1's block split) and vLLM's prefill workspace remap
  - {op: cache_write, model: [v3.2, v4-flash], batch_size: 2, s_q: 3, context_len: 200}
  - {op: cache_write, model: v4-flash, layout: v41-blocks, batch_size: 3, s_q: 2,
     context_lens: {lengths: [90, 2, 300]}, context_len: 300, page_size: 64}
  - {op: remap, model: v3.2, topk: 64, tokens: 40, batch_size: 3, context_len: 300,
     context_lens: {lengths: [300, 20, 290]}}
  # one DCP rank's remap: the rank's block table (cdiv(300, 16 x 4) pages)
  - {op: remap, model: v3.2, topk: 64, batch_size: 3, s_q: 2, context_len: 300, page_size: 16,
     form: dcp, dcp_size: 4, dcp_rank: 3, dcp_interleave: 8}
  # vLLM's chunked prefill gather (two chunks of 5 x 100 rows), and the indexer's key cache
  - {op: dequant, tokens: 8, batch_size: 7, context_len: 100,
     model: [v3.2, &indexer {name: v32-indexer, d_qk: 128, d_v: 128, num_heads: 1, topk: 2048,
                             layout: indexer-fp8}],
     context_lens: {lengths: [100, 90, 100, 100, 80, 100, 30]}}
  - {op: [dequant, cache_write], model: *indexer, batch_size: 2, s_q: 3, context_len: 130}
"""


def _cases():
    known = {"torch", "reference-f64"}
    smoke = load(ROOT / "scenarios/smoke.yaml", known_backends=known).cases
    return list(smoke) + list(load_scenario(SHAPES, known).cases)


CASES = _cases()


@pytest.mark.parametrize("case", CASES, ids=[c.case_id for c in CASES])
def test_shapes_are_make_inputs_shapes(case):
    made = {k: v for k, v in make_inputs(case, "cpu").items() if v is not None}
    got = input_shapes(case)
    assert {k: (s.dims, s.dtype) for k, s in got.items()} == {
        k: (tuple(v.shape), v.dtype) for k, v in made.items()
    }
    assert sum(s.nbytes for s in got.values()) == sum(
        v.numel() * v.element_size() for v in made.values()
    )
