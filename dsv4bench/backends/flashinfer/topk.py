"""FlashInfer's top-k for the `topk` op (cases/topk_case.py), one function per form. Names and
signatures as in flashinfer/topk.py of 0.7.2.post1 (0.6.18 has the same three with the same
parameters):

  plain       top_k(input (rows, d) fp32, k, sorted=False, deterministic=False, tie_break=0,
              dsa_graph_safe=False) -> (values, indices int64). It takes no lengths: it reads
              the whole row, so a row with fewer than k finite logits picks -inf entries; the
              timed call masks those to -1 (torch.where, as an engine must).
  page_table  top_k_page_table_transform(input, src_page_table (b, pages) int32, lengths
              (rows,) int32, k, row_to_batch=None, deterministic, tie_break, dsa_graph_safe,
              row_starts=None, page_table_row_starts=None, *, page_size=1, out=None,
              out_raw_indices=None) -> (rows, k) int32 slots
              block_table[row_to_batch[i], p // page_size] * page_size + p % page_size, -1 past
              the row's length. With page_size > 1 and row_starts, page_table_row_starts is
              required (different units): zeros here (positions are request-local).
  ragged      top_k_ragged_transform(input, offsets (rows,) int32, lengths (rows,) int32, k,
              deterministic, tie_break, dsa_graph_safe, row_starts=None) -> (rows, k) int32
              local + offsets[i], -1 past the row's length.

Dispatch inside FlashInfer (read in its source, not measured here): a CUB DeviceBatchedTopK
path (d <= 2**21; chosen by shape, and always under CUDA-graph capture for d <= 8192 or fewer
than 128 rows), the clusters kernel (sm100 only), else the radix kernels (FilteredTopK needs
128 KiB of shared memory and k <= 2048 for dsa_graph_safe). So a graph replay (timing.graph)
may time another algorithm than the eager call: both are what an engine gets. Defaults are
passed (deterministic False, tie_break 0, dsa_graph_safe False).
"""

from __future__ import annotations

import inspect

from dsv4bench.backends.base import Prepared, Unsupported
from dsv4bench.cases.case import Case
from dsv4bench.cases.output import Output

FUNCTIONS = {
    "plain": "top_k",
    "page_table": "top_k_page_table_transform",
    "ragged": "top_k_ragged_transform",
}
CANDIDATES = {f"topk_{form}": (("flashinfer.topk", name),) for form, name in FUNCTIONS.items()}
NEEDED = {  # keyword parameters this adapter passes, per form
    "plain": ("sorted",),
    "page_table": ("row_to_batch", "row_starts", "page_table_row_starts", "page_size", "out"),
    "ragged": ("row_starts",),
}
POISON = -3  # neither -1 nor a slot: an output the kernel never wrote shows


def supports(case: Case) -> str | None:
    if case.form not in FUNCTIONS:
        return f"unknown top-k form {case.form!r} (known: {', '.join(FUNCTIONS)})"
    if case.form == "plain" and case.topk > case.context_len // (case.compress_ratio or 1):
        return "FlashInfer top_k takes k <= the row width (the transforms pad with -1)"
    return None


def signature_reason(fn, form: str, version: str) -> str | None:
    """Why this build's function cannot take the call this adapter makes (a parameter it
    lacks), or None."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None  # a builtin without a signature: called as documented
    missing = [p for p in NEEDED[form] if p not in params]
    if missing and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return f"flashinfer {version} {FUNCTIONS[form]} has no parameter {', '.join(missing)}"
    return None


def prepare(case: Case, x: dict, device: str, fn, version: str) -> Prepared:
    """The timed call of one form (fn: that form's FlashInfer function, None when absent)."""
    import torch

    reason = supports(case)
    if reason:
        raise Unsupported(reason)
    if fn is None:
        raise Unsupported(f"flashinfer {version} has no flashinfer.topk.{FUNCTIONS[case.form]}")
    reason = signature_reason(fn, case.form, version)
    if reason:
        raise Unsupported(reason)
    logits, k = x["logits"].float().contiguous(), case.topk
    lengths = x["lengths"].to(torch.int32).contiguous()
    starts = x.get("row_starts")
    starts = None if starts is None or not bool(starts.any()) else starts.to(torch.int32)
    info = {"kernel": f"flashinfer.topk.{FUNCTIONS[case.form]}", "logits_bytes": logits.nbytes}
    out = None
    if case.form == "plain":
        if starts is not None:
            raise Unsupported("FlashInfer top_k takes no row starts (its transforms do)")

        def run():
            values, idx = fn(logits, k, sorted=False)
            return torch.where(torch.isneginf(values), -1, idx).to(torch.int32)

        info["mask"] = "-inf picks -> -1 (torch.where, timed)"
    elif case.form == "page_table":
        table = x["block_table"].to(torch.int32).contiguous()
        batch = x["row_to_batch"].to(torch.int32).contiguous()
        out = torch.empty(logits.shape[0], k, dtype=torch.int32, device=logits.device)
        extra = {}
        if starts is not None:
            extra = {"row_starts": starts, "page_table_row_starts": torch.zeros_like(starts)}

        def run():
            return fn(
                logits, table, lengths, k, row_to_batch=batch, page_size=case.page_size,
                out=out, **extra,
            )  # fmt: skip
    else:
        offsets = x["offsets"].to(torch.int32).contiguous()
        extra = {} if starts is None else {"row_starts": starts}

        def run():
            return fn(logits, offsets, lengths, k, **extra)

    return Prepared(
        run=run,
        finish=lambda raw: Output(raw),
        poison=None if out is None else (lambda: out.fill_(POISON)),
        info=info,
    )
