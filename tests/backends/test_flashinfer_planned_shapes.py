"""FlashInfer 0.7.4's FA3 MLA `run()` raises when its inputs differ from what `plan()` was given
(flashinfer/mla/_batch_mla/_backends/_fa_common.py, _check_planned_geometry, new in 0.7.4): the
sm90 adapter plans every case on that case's own shapes (one wrapper per prepare), so a process
that runs many shapes in a row never replays a plan on another shape. The fake wrapper below
adds 0.7.4's check, word for word, to the reference-computing fake of test_flashinfer_fa3."""

from __future__ import annotations

import pytest
import torch

from dsv4bench.cases.inputs import make_inputs
from tests.backends.test_flashinfer_fa3 import V4, V32, FakeFA3Wrapper, judge, make_case
from tests.backends.test_flashinfer_fa3 import backend as fa3_backend


class Planned074(FakeFA3Wrapper):
    """FakeFA3Wrapper with FlashInfer 0.7.4's planned-geometry check in run()."""

    def plan(self, qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads, *rest):
        super().plan(qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads, *rest)
        batch_size = kv_len_arr.numel()
        self._planned_query_shape = (int(qo_indptr[batch_size]), num_heads)
        self._page_size = rest[2]
        start, end = int(kv_indptr[0]), int(kv_indptr[batch_size])
        if start < end:
            lo, hi = torch.aminmax(kv_indices[start:end])
            self._planned_kv_page_range = (int(lo), int(hi) + 1)
        else:
            self._planned_kv_page_range = (0, 0)

    def run(self, q_nope, q_pe, ckv_cache, kpe_cache, *args, **kw):
        if q_nope.shape[:2] != self._planned_query_shape:
            raise ValueError("q_nope rows and heads must match the planned query shape.")
        if ckv_cache.shape[1] != self._page_size:
            raise ValueError("ckv_cache page size must match the planned page_size.")
        page_min, required_pages = self._planned_kv_page_range
        if page_min < 0 or ckv_cache.shape[0] < required_pages:
            raise ValueError("KV cache does not cover the planned CSR page indices.")
        return super().run(q_nope, q_pe, ckv_cache, kpe_cache, *args, **kw)


SHAPES = [  # decode and prefill, V3.2 and V4, in-place FP8 and requantized, in one process
    ("decode", V32, dict(batch_size=2, s_q=2, context_len=512), "bf16"),
    ("decode", V32, dict(batch_size=3, context_len=700), "e4m3"),
    ("decode", V4, dict(batch_size=2, context_len=1024), "bf16"),
    ("decode", V4, dict(batch_size=1, s_q=2, context_len=640), "e4m3"),
    ("prefill", V32, dict(tokens=8, context_len=512), "bf16"),
    ("prefill", V4, dict(tokens=5, context_len=300), "e4m3"),
]


def test_every_shape_is_planned_for_itself_under_the_074_check():
    for op, base, shape, kv_dtype in SHAPES:
        case = make_case(op, **{**base, **shape})
        x = make_inputs(case, "cpu")
        p = fa3_backend(kv_dtype, Planned074).prepare(case, x, "cpu")
        acc, _, _ = judge(case, p, x)  # run() passes 0.7.4's check and is right
        assert acc["nonfinite"] == 0 and acc["cos_diff"] < 5e-6, (op, shape, acc)


def test_the_074_check_refuses_a_plan_replayed_on_another_shape():
    small = make_case("decode", **V32, batch_size=2, context_len=512)
    large = make_case("decode", **V32, batch_size=4, context_len=512)
    fa3_backend("bf16", Planned074).prepare(small, make_inputs(small, "cpu"), "cpu")
    planned_small = Planned074.instances[-1]
    p = fa3_backend("bf16", Planned074).prepare(large, make_inputs(large, "cpu"), "cpu")
    assert Planned074.instances[-1] is not planned_small  # a wrapper of its own per case
    q = torch.zeros(4, small.num_heads, 512, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="planned query shape"):
        planned_small.run(q, q[..., :64], torch.zeros(10, 1, 512), torch.zeros(10, 1, 64))
    p.run()
