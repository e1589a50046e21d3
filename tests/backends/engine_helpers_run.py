"""Run the engine helper backends' kernels on tiny cases on the CPU and print each verdict
against the oracle as JSON: `python -m tests.backends.engine_helpers_run BACKEND BUILD`. The
Triton kernels run through Triton's interpreter, chosen before Triton is imported
(TRITON_INTERPRET=1 in the environment), so the tests run this in a process of its own."""

from __future__ import annotations

import json
import sys

from dsv4bench.cases.inputs import make_inputs
from dsv4bench.cases.oracle import oracle_call
from dsv4bench.measure import judge, metrics
from tests.factories import make_case

V4 = dict(d_qk=512, d_v=512, model="v4-flash")
V32 = dict(d_qk=576, d_v=512, model="v3.2", layout="v32")
DEQUANT = dict(op="dequant", batch_size=2, context_len=64, page_size=64)
SGLANG = {
    "dequant-v32": dict(DEQUANT, **V32),
    **{
        f"dequant-{lay}": dict(DEQUANT, layout=lay, **V4)
        for lay in ("v4", "v41", "v41-blocks", "v41-fp4", "v41-fp4-blocks")
    },
    "remap": dict(op="remap", topk=64, batch_size=2, s_q=2, context_len=200, page_size=64, **V32),
    "page_split": dict(
        op="page_split", layout="v4", batch_size=2, context_len=256, page_size=256, **V4
    ),
}
VLLM_TRITON = {
    "remap": dict(op="remap", topk=64, batch_size=3, s_q=2, context_len=200, page_size=16, **V32),
    "remap-prefill": dict(
        op="remap",
        topk=64,
        tokens=16,
        batch_size=7,
        context_len=64,
        page_size=16,
        context_lens=(64, 60, 64, 64, 50, 64, 30),
        **V32,
    ),
}
# the DCP forms (triton_filter_and_convert_dcp_index): ranks of 2 and 4, token and page-part
# groups, and dcp_size 1 (its delegation to the plain converter)
DCP = dict(op="remap", form="dcp", topk=64, batch_size=3, s_q=2, context_len=200, page_size=16)
VLLM_TRITON |= {
    f"remap-dcp{size}-rank{rank}-group{group}": dict(
        DCP, dcp_size=size, dcp_rank=rank, dcp_interleave=group, **V32
    )
    for size, rank, group in ((2, 1, 1), (4, 2, 4), (4, 0, 16), (1, 0, 1))
}
VLLM_TRITON |= {  # compacted to the front, with counts (SparseMLACommonImpl's call)
    f"remap-dcp-compact{size}-rank{rank}": dict(
        DCP, form="dcp-compact", dcp_size=size, dcp_rank=rank, **V32
    )
    for size, rank in ((2, 0), (4, 3))
}
# the V4.1 conformance case: an interleaved cache read as block-split
CONFORMANCE = {"conformance-v41-read-as-blocks": (dict(DEQUANT, layout="v41", **V4), "v41")}


def verdicts(backend, cases: dict) -> dict:
    out = {}
    for label, fields in cases.items():
        case = make_case(**fields)
        x = make_inputs(case, "cpu")
        prepared = backend.prepare(case, x, "cpu")
        if prepared.poison is not None:
            prepared.poison()
        got = prepared.finish(prepared.run())
        acc = metrics.accuracy(oracle_call(case, x)(), got)
        status, why = judge.verdict(acc, case.tolerance)
        out[label] = {"status": status, "why": why, "mismatched": acc["mismatched"]}
    return out


def main(name: str, build: str) -> None:
    if name == "sglang-ops":
        from dsv4bench.backends.engine_helpers.sglang_ops import SglangOps

        results = verdicts(SglangOps(lib=build), SGLANG)
        for label, (fields, kv_layout) in CONFORMANCE.items():
            results |= verdicts(SglangOps(lib=build, kv_layout=kv_layout), {label: fields})
    else:
        from dsv4bench.backends.engine_helpers.vllm_triton import VllmTriton

        results = verdicts(VllmTriton(lib=build), VLLM_TRITON)
    print(json.dumps(results))


if __name__ == "__main__":
    main(*sys.argv[1:])
