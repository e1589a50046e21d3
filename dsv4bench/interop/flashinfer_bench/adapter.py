"""What an exported definition's reference and solutions call: the oracle or one backend on
their inputs, answered in the definition's outputs (schema.output_specs): lse in base 2 and
(rows..., heads) order, int8 caches read back as the uint8 records they are."""

from __future__ import annotations

import math

import torch

from dsv4bench.cases.case import Case
from dsv4bench.cases.output import Output


def case_of(params: dict) -> Case:
    return Case(scenario="flashinfer-bench", **params)


def our_inputs(case: Case, given: dict) -> dict:
    """Their tensors -> the case's input dict (caches as uint8 again, absent ones None)."""
    x = {
        k: (v.view(torch.uint8) if k.endswith("cache") and v.dtype == torch.int8 else v)
        for k, v in given.items()
    }
    if case.decode_shape:
        x.setdefault("attn_sink", None)
    return x


def reference(params: dict, given: dict) -> tuple:
    """The oracle (reference/ through dsv4bench.cases.oracle) for these inputs."""
    from dsv4bench.cases.oracle import oracle_call

    case = case_of(params)
    return their_outputs(case, oracle_call(case, our_inputs(case, given))())


def solution(backend: str, params: dict, given: dict, device: str = "cuda") -> tuple:
    """One backend adapter of this suite on these inputs (as the worker calls it, untimed)."""
    from dsv4bench import backends

    backends.setup([])
    case = case_of(params)
    prepared = backends.get(backend).prepare(case, our_inputs(case, given), device)
    return their_outputs(case, prepared.finish(prepared.run()))


def their_outputs(case: Case, answer: Output) -> tuple:
    """An Output in the definition's order and conventions."""
    if case.op in ("decode", "prefill"):
        lse = answer.lse
        if case.op == "decode":  # (b, h, s_q) -> (b, s_q, h)
            lse = lse.transpose(1, 2)
        lse = lse.float() / math.log(2.0)
        out = (answer.out.to(torch.bfloat16), lse.contiguous())
        if answer.max_logits is not None:
            out += (answer.max_logits.float(),)
        return out
    if case.op == "indexer":
        return answer.out, answer.topk
    if case.op == "dequant":
        return (answer.out.to(torch.bfloat16),)
    if case.op == "page_split":
        return (answer.out.view(torch.int8),)
    return (answer.out,)
