"""What an exported definition's reference and solutions call: the oracle or one backend on
their inputs, answered in the definition's outputs (schema.output_specs): lse in base 2 and
(rows..., heads) order, int8 caches read back as the uint8 records they are.

Their harness passes the inputs alone: the case's sizes the call needs (batch_size, s_q,
tokens; the indexer's and top-k's key count) are read from them (sizes_of) unless the caller
passes the case's own fields."""

from __future__ import annotations

import math

import torch

from dsv4bench.cases.case import Case
from dsv4bench.cases.output import Output


def case_of(params: dict, given: dict | None = None) -> Case:
    """The case of these constant fields at the sizes `given`'s tensors show; a field in
    `params` wins."""
    sizes = sizes_of(Case(scenario="flashinfer-bench", **params), given or {})
    return Case(scenario="flashinfer-bench", **{**sizes, **params})


def sizes_of(case: Case, given: dict) -> dict:
    """The variable case fields the inputs show (see the module docstring)."""
    if case.op == "topk":  # a column per key
        return {"context_len": given["logits"].shape[1] * _ratio(case)}
    q = given.get("q")
    if q is None:
        return {}
    if case.decode_shape:  # q (b, s_q, h, d)
        b, s_q = q.shape[:2]
        return {"tokens": b * s_q} if case.op == "prefill" else {"batch_size": b, "s_q": s_q}
    if case.op == "prefill":
        chunks = len(given["cu_seqlens_k"]) - 1 if "cu_seqlens_k" in given else 1
        return {"tokens": q.shape[0] // max(chunks, 1), "batch_size": chunks}
    if case.op == "indexer" and "kv" in given:  # the ragged form: one chunk over kv's keys
        return {"tokens": q.shape[0], "context_len": given["kv"].shape[0] * _ratio(case)}
    if case.op == "indexer":  # paged: as many key columns as the block table addresses
        width = given["block_table"].shape[1] * case.page_size
        return {"batch_size": q.shape[0], "s_q": q.shape[1], "context_len": width * _ratio(case)}
    return {}


def _ratio(case: Case) -> int:
    return case.compress_ratio or 1


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

    case = case_of(params, given)
    return their_outputs(case, oracle_call(case, our_inputs(case, given))(), given)


def solution(backend: str, params: dict, given: dict, device: str | None = None) -> tuple:
    """One backend adapter of this suite on these inputs (as the worker calls it, untimed), on
    the inputs' device unless `device` says otherwise."""
    from dsv4bench import backends

    backends.setup([])
    case = case_of(params, given)
    if device is None:
        device = str(next(v.device for v in given.values() if isinstance(v, torch.Tensor)))
    prepared = backends.get(backend).prepare(case, our_inputs(case, given), device)
    return their_outputs(case, prepared.finish(prepared.run()), given)


def their_outputs(case: Case, answer: Output, given: dict) -> tuple:
    """An Output in the definition's order, shapes and conventions."""
    if case.op in ("decode", "prefill"):
        out, lse = answer.out, answer.lse
        if case.op == "decode":  # (b, h, s_q) -> (b, s_q, h)
            lse = lse.transpose(1, 2)
        if case.decode_shape:  # a prefill chunk's (tokens, ...) rows as q's (b, s_q)
            b, s_q = case.decode_shape
            out, lse = out.reshape(b, s_q, *out.shape[-2:]), lse.reshape(b, s_q, lse.shape[-1])
        lse = lse.float() / math.log(2.0)
        out = (out.to(torch.bfloat16), lse.contiguous())
        if answer.max_logits is not None:
            out += (answer.max_logits.float(),)
        return out
    if case.op == "indexer":
        return _paged_logits(case, answer.out, given), answer.topk
    if case.op == "dequant":  # (slots, d) -> (pages, page_size, d)
        return (answer.out.to(torch.bfloat16).reshape(-1, case.page_size, answer.out.shape[-1]),)
    if case.op == "page_split":  # (split pages, 64, 1, bytes) -> per cache page
        split = answer.out.view(torch.int8)
        return (split.reshape(-1, case.page_size // split.shape[1], *split.shape[1:]),)
    return (answer.out,)


def _paged_logits(case: Case, logits: torch.Tensor, given: dict) -> torch.Tensor:
    """The paged form's (rows, keys) logits as (rows, max_num_pages, page_size), -inf past the
    keys; the ragged form's as they are."""
    if "block_table" not in given:
        return logits
    width = given["block_table"].shape[1] * case.page_size
    pad = logits.new_full((logits.shape[0], width - logits.shape[1]), -math.inf)
    return torch.cat([logits, pad], 1).view(logits.shape[0], -1, case.page_size)
