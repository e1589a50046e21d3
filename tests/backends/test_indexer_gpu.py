"""The compiled Triton indexer kernels on CUDA at real sizes (64 heads, D 128, 64-token blocks)
against the oracle: logits by cosine difference, top-k by selected scores."""

from __future__ import annotations

import textwrap

import pytest
import torch

from dsv4bench.backends.torch_ref import oracle_call
from dsv4bench.cases import inputs
from dsv4bench.measure.metrics import accuracy
from dsv4bench.measure.topk import compare_topk
from dsv4bench.scenarios import load_text
from reference.indexer import topk_indices

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
pytest.importorskip("triton", reason="needs triton")

POINTS = {
    "v32-paged-b16-nextn2-16k": "model: v3.2\n    batch_size: 16\n    s_q: 2\n"
    "    context_len: 16384",
    "v4-paged-2d-b16-nextn2-64k": "model: v4-flash\n    batch_size: 16\n    s_q: 2\n"
    "    context_len: 65536",
    "v32-ragged-2048-16k": "model: v3.2\n    tokens: 2048\n    context_len: 16384",
    "v4-ragged-4096-128k": "model: v4-flash\n    tokens: 4096\n    context_len: 131072",
}


def _case(point: str):
    text = f"name: gpu\nop: indexer\nbackends: [triton]\ncases:\n  - {point}\n"
    return load_text(textwrap.dedent(text), "gpu.yaml", known_backends=("triton",)).cases[0]


@pytest.mark.parametrize(
    ("name", "dot"), [(name, "fp8") for name in POINTS] + [("v32-ragged-2048-16k", "bf16")]
)
def test_compiled_kernels_match_the_oracle(name: str, dot: str) -> None:
    from dsv4bench.backends.triton import indexer as ti

    case = _case(POINTS[name])
    x = inputs.make_inputs(case, "cuda")
    want = oracle_call(case, x)()
    launch, out = ti._launcher(case, x, dot)
    out.fill_(float("nan"))
    logits = launch()
    got = type(want)(logits, None, topk_indices(logits, case.topk))
    torch.cuda.synchronize()
    acc = accuracy(want, got)
    top = compare_topk(want.out, want.topk, got.topk, actual_logits=logits)
    print(name, dot, acc["cos_diff"], acc["max_rel"], top)
    assert acc["nonfinite"] == 0 and acc["cos_diff"] < 1e-6, acc
    assert top["topk_matched"] == 1.0 and top["topk_invalid"] == 0, top
