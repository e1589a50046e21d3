"""A graph-pad case on an sm90 GPU (run/padded.py): the padded batch is captured in a CUDA
graph and replayed, and the real rows are judged against the oracle. Triton needs no fetched
build; FlashMLA runs where a build is found (else the test says why it skipped)."""

from __future__ import annotations

import pytest
import torch

from dsv4bench import backends
from dsv4bench.run.worker import Cache, check
from tests.factories import V4, V32, make_case


def _sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _sm90(), reason="needs an sm90 GPU (H100/H200)"),
]

CASES = {
    "v4": dict(shape=V4, topk=128, window=128, compress_ratio=4, extra_topk=512, sink=True,
               page_size=256),
    "v32": dict(shape=V32, topk=2048, page_size=64),
}  # fmt: skip


def _case(model: str, edge: str):
    kw = dict(CASES[model])
    return make_case(kw.pop("shape"), context_len=4096, num_heads=64, batch_size=3,
                     graph_batch=8, edge=edge, **kw)  # fmt: skip


@pytest.mark.parametrize("edge", ["graph-pad-vllm", "graph-pad-sglang"])
@pytest.mark.parametrize("model", ["v4", "v32"])
@pytest.mark.parametrize("name", ["triton", "flashmla"])
def test_a_padded_batch_replays_from_a_graph_and_its_real_rows_are_right(name, model, edge):
    backend = backends.get(name)
    case = _case(model, edge)
    reason = backend.supports(case, "sm90")
    if reason:
        pytest.skip(f"{name}: {reason}")
    try:
        backend.provider()
    except backends.Unsupported as e:
        pytest.skip(f"{name}: {e}")
    row, prepared = check(case, backend, "sm90", Cache())
    assert row["status"] == "ok", row["message"]
    padding = row["info"]["graph_padding"]
    assert padding["replay"] == "cuda graph" and padding["graph_batch"] == 8
    out = prepared.finish(prepared.run())  # a second replay gives the same answer
    assert out.out.shape[0] == case.batch_size


@pytest.mark.parametrize("edge", ["graph-refill-vllm", "graph-refill-sglang"])
@pytest.mark.parametrize("model", ["v4", "v32"])
def test_a_graph_captured_on_one_batch_replays_the_next_copied_in_place(model, edge):
    # FlashMLA's schedule, indices and counts of the next batch copied into the captured
    # call's buffers (Prepared.buffers), as engines step a captured graph
    backend = backends.get("flashmla")
    case = _case(model, edge)
    try:
        backend.provider()
    except backends.Unsupported as e:
        pytest.skip(f"flashmla: {e}")
    row, prepared = check(case, backend, "sm90", Cache())
    assert row["status"] == "ok", row["message"]
    assert row["info"]["graph_padding"]["replay"] == "cuda graph"
    assert "copied in place" in row["info"]["graph_refill"]["refilled"]
