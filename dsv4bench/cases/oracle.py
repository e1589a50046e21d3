"""The expected answer: the oracle (reference/) called for a Case and its inputs.

The worker judges every kernel against this; the `torch` backend times the same call.
"""

from __future__ import annotations

from collections.abc import Callable

from dsv4bench.cases.case import DCP_FORMS, SPLIT_PAGE, Case
from dsv4bench.cases.output import Output, prefill_output
from reference import attention, cache_write, dcp, indices, layouts, prefill_chunks, topk


def oracle_call(
    case: Case, inputs: dict, scale_rounding: str | None = None
) -> Callable[[], Output]:
    """A zero-argument call computing the oracle's answer for this case and inputs."""
    x = inputs
    if case.decode_shape:

        def decode() -> Output:
            out, lse = attention.sparse_mla_decode(
                x["q"],
                x["k_cache"],
                x["indices"],
                case.scale,
                d_v=case.d_v,
                topk_length=x.get("topk_length"),
                attn_sink=x.get("attn_sink"),
                extra_k_cache=x.get("extra_k_cache"),
                extra_indices=x.get("extra_indices"),
                extra_topk_length=x.get("extra_topk_length"),
                scale_rounding=scale_rounding,
                layout=case.layout,
            )
            if case.op == "prefill":  # (T, 1) or (1, T) -> the prefill shapes
                return prefill_output(out, lse)
            return Output(out, lse)

        return decode
    if case.op == "prefill" and "cu_seqlens_k" in x:
        return lambda: ragged_prefill(case, x)
    if case.op == "prefill":

        def prefill() -> Output:
            out, max_logits, lse = attention.sparse_mla_prefill(
                x["q"],
                x["kv"],
                x["indices"],
                case.scale,
                d_v=case.d_v,
                attn_sink=x.get("attn_sink"),
                topk_length=x.get("topk_length"),
            )
            return Output(out, lse, max_logits=max_logits)

        return prefill
    if case.op == "dequant":
        return lambda: Output(dequant_answer(case, x, scale_rounding))
    if case.op == "cache_write":
        return lambda: Output(written_bytes(case, x))
    if case.op == "remap":
        return lambda: Output(remapped(case, x))
    if case.op == "indexer":
        return lambda: indexer_call(case, x)
    if case.op == "topk":
        return lambda: Output(topk.select(x, case.topk, case.form, case.page_size))
    if case.op == "page_split":  # the (pages, 64, 1, 584) view: every token's bytes, no padding
        return lambda: Output(layouts.split_pages_v4(x["k_cache"], SPLIT_PAGE))
    raise ValueError(f"no oracle for op {case.op!r}")


def remapped(case: Case, x: dict):
    """A remap case's answer in its form: vLLM's prefill workspace rows (tokens > 0), one DCP
    rank's slots (form dcp), else global slots."""
    if case.tokens:
        return prefill_chunks.remap(
            x["local_indices"],
            x["req_of_token"],
            x["block_table"],
            case.page_size,
            x["prefill_request"],
            x["workspace_starts"],
        )
    if case.form in DCP_FORMS:
        ranks = case.dcp_size, case.dcp_rank, case.dcp_interleave
        slots = dcp.local_slots(x["local_indices"], x["block_table"], case.page_size, *ranks)
        return dcp.compact(slots) if case.form == "dcp-compact" else slots
    return indices.to_global_slots(x["local_indices"], x["block_table"], case.page_size)


def dequant_answer(case: Case, x: dict, scale_rounding: str | None = None):
    """bf16 rows (d_qk) of every slot in order, or with tokens > 0 of every chunk's workspace
    (vLLM's chunked prefill gather, chunk after chunk). The indexer's cache is gathered, not
    upconverted: each token's record bytes (its e4m3 key then its fp32 scale), judged exactly."""
    import torch

    from reference import layouts_indexer

    cache = x["k_cache"]
    indexer_keys = case.layout == layouts_indexer.LAYOUT
    if not case.tokens:
        if indexer_keys:
            return cache_write.token_records(cache, case.layout).clone()
        workspace = layouts.to_workspace(cache, scale_rounding=scale_rounding, layout=case.layout)
        return workspace.squeeze(1)
    lens, starts = x["seq_lens"].tolist(), x["workspace_starts"].tolist()
    parts = []
    for first, end in x["chunk_bounds"].tolist():
        table = x["block_table"][first:end]
        if indexer_keys:
            parts.append(layouts_indexer.gather_requests(cache, table, lens[first:end]))
            continue
        rows = sum(lens[first:end])
        parts.append(
            prefill_chunks.gather_workspace(
                cache, table, lens[first:end], starts[first:end], rows, layout=case.layout
            )
        )
    return torch.cat(parts)


def written_bytes(case: Case, x: dict):
    """Every byte of the cache after the write (page padding included), flat uint8."""
    out = cache_write.cache_write(
        x["kv"],
        x["slot_mapping"],
        x["k_cache"],
        layout=case.layout,
        convention=case.scale_convention,
    )
    return storage_bytes(out)


def storage_bytes(cache):
    """The bytes of a cache's whole storage, flat uint8 (a copy)."""
    import torch

    storage = cache.untyped_storage()
    flat = torch.empty(0, dtype=torch.uint8, device=cache.device)
    return flat.set_(storage, 0, (storage.nbytes(),), (1,)).clone()


def indexer_call(case: Case, x: dict) -> Output:
    """The indexer oracle: logits in DeepGEMM's paged or ragged form, then top-k."""
    from reference import indexer

    logits = indexer_logits(case, x)
    return Output(logits, None, indexer.topk_indices(logits, case.topk))


def indexer_logits(case: Case, x: dict):
    """The indexer oracle's logits alone (rows, keys) fp32, -inf where a row sees no key."""
    from dsv4bench.cases import indexer_case
    from reference import indexer

    if "kv" in x:
        return indexer.mqa_logits(x["q"], (x["kv"], x["kv_scales"]), x["weights"], x["ks"], x["ke"])
    return indexer.paged_mqa_logits(
        x["q"],
        x["kv_cache"],
        x["weights"],
        x["context_lens"],
        x["block_table"],
        indexer_case.keys(case),
    )


def ragged_prefill(case: Case, x: dict) -> Output:
    """A ragged prefill batch (sglang NSA) attended per request: request r's rows over its own
    workspace slice kv[cu[r]:cu[r+1]] with its request-relative indices, never through the
    offsets the kernel reads (so a wrong cu_seqlens_k offset shows as a wrong answer)."""
    import torch

    cu, t = x["cu_seqlens_k"].tolist(), case.tokens
    outs, lses, maxes = [], [], []
    for r in range(len(cu) - 1):
        rows = slice(r * t, (r + 1) * t)
        out, max_logits, lse = attention.sparse_mla_prefill(
            x["q"][rows],
            x["kv"][cu[r] : cu[r + 1]],
            x["ragged_indices"][rows],
            case.scale,
            d_v=case.d_v,
            attn_sink=x.get("attn_sink"),
            topk_length=x["topk_length"][rows],
        )
        outs.append(out)
        lses.append(lse)
        maxes.append(max_logits)
    return Output(torch.cat(outs), torch.cat(lses), max_logits=torch.cat(maxes))
