"""Run vLLM's V4/V4.1 Triton cache writers and gathers (backends/engine_helpers/vllm_v4_cache.py)
on tiny cases through Triton's interpreter and print each verdict against the oracle as JSON:
`python -m tests.backends.vllm_v4_cache_run BUILD`. TRITON_INTERPRET=1 must be in the
environment before Triton is imported, so the tests run this in a process of its own; on a GPU
the gpu-marked test calls results(BUILD, "cuda") in its own process.

Besides the cases, `conventions`: the V4 writer's bytes on rows whose tiles the scale
conventions treat differently (a tile of amax 0.01: `flashmla` floors the scale at 1e-4; an
all-zero tile: `sglang` floors amax at 1e-8, `vllm` at 1e-4), counted against the oracle under
each convention of the V4 layout."""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import torch

from dsv4bench.backends.base import Unsupported
from dsv4bench.backends.engine_helpers.vllm_v4_cache import VllmV4Cache
from dsv4bench.cases.inputs import make_inputs
from dsv4bench.cases.oracle import oracle_call
from dsv4bench.measure import judge, metrics
from reference.layout_table import layout
from tests.factories import make_case

V4 = dict(d_qk=512, d_v=512, model="v4-flash", page_size=16)
WRITE = dict(op="cache_write", batch_size=2, s_q=3, context_len=40, **V4)
DEQUANT = dict(op="dequant", batch_size=2, context_len=32, **V4)
CASES = {
    "cache_write-v4": dict(WRITE, layout="v4", scale_convention="vllm"),
    "cache_write-v41": dict(WRITE, layout="v41"),
    "cache_write-v41-fp4": dict(WRITE, layout="v41-fp4"),
    "cache_write-v41-blocks": dict(WRITE, layout="v41-blocks"),
    "dequant-v4": dict(DEQUANT, layout="v4"),
    # 4 pages over 3 requests: one request of every slot
    "dequant-v4-one-request": dict(DEQUANT, layout="v4", batch_size=3, context_len=20),
    "dequant-v41": dict(DEQUANT, layout="v41"),
    "dequant-v41-fp4": dict(DEQUANT, layout="v41-fp4"),
    "dequant-v41-fp4-blocks": dict(DEQUANT, layout="v41-fp4-blocks"),
}
INSTANCES = {
    "v4": dict(model="v4"),
    "v41": dict(model="v41"),
    "v41-one-pass": dict(model="v41", gather="one-pass"),
}


def judged(backend, case, x, device: str) -> dict:
    prepared = backend.prepare(case, x, device)
    prepared.poison()
    got = prepared.finish(prepared.run())
    acc = metrics.accuracy(oracle_call(case, x)(), got)
    status, why = judge.verdict(acc, case.tolerance)
    return {"status": status, "why": why, "mismatched": acc["mismatched"], **prepared.info}


def verdict(backend, fields: dict, device: str) -> dict:
    case = make_case(**fields)
    reason = backend.supports(case, "sm90")
    if reason:
        return {"status": "unsupported", "why": reason}
    try:
        return judged(backend, case, make_inputs(case, device), device)
    except Unsupported as e:
        return {"status": "unsupported", "why": str(e)}


def conventions(backend, device: str) -> dict:
    """Bytes the V4 writer's cache differs in from the oracle's under each V4 convention."""
    case = make_case(**CASES["cache_write-v4"])
    x = make_inputs(case, device)
    kv = x["kv"].clone()
    kv[0, :64] *= 0.01 / float(kv[0, :64].abs().max())  # a tile of amax 0.01
    kv[1, 64:128] = 0  # an all-zero tile
    x = {**x, "kv": kv}
    out = {}
    for convention in layout("v4").conventions:
        out[convention] = judged(backend, replace(case, scale_convention=convention), x, device)
    return out


def results(build: str, device: str = "cpu") -> dict:
    out = {}
    for name, options in INSTANCES.items():
        backend = VllmV4Cache(lib=build, **options)
        out[name] = {label: verdict(backend, f, device) for label, f in CASES.items()}
    out["conventions"] = conventions(VllmV4Cache(lib=build), device)
    return out


def main(build: str, device: str = "cpu") -> None:
    print(json.dumps(results(build, device), default=str))


if __name__ == "__main__":
    torch.manual_seed(0)
    main(*sys.argv[1:])
