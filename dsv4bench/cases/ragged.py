"""Inputs of a ragged batch (Case.context_lens): each request its own context, as engines
batch them.

decode: request r's s_q queries sit at the end of its own context_lens[r] tokens. Its caches
  hold only its own pages (window span, compressed entries), handed out in a random order; the
  block table is -1 past a request's pages. Index widths are the case's (topk, extra_topk,
  sized by the longest request); a shorter request's rows are -1 past what it sees. V4 cases
  also pass the counts per request as engines do for FlashMLA (topk_length, extra_topk_length
  (b,): the valid entries of the request's last query); V3.2's sm90 kernel takes none, so its
  rows carry -1 only. FlashInfer/FA3 and Triton read the same tensors (their adapters turn the
  counts into per-row index lists or masks).
prefill (sglang's NSA ragged top-k, sglang #20606): request r's chunk of `tokens` queries ends
  at context_lens[r]; each request's workspace [window part; compressed part] is built as a
  lone chunk would be, the workspaces are concatenated into one kv, and the request-relative
  indices are offset by cu_seqlens_k[r] (reference.indices.ragged_to_global). The inputs also
  keep `cu_seqlens_k` and the request-relative `ragged_indices`: the oracle attends per request
  over its own workspace slice with those (cases/oracle.py), so a wrong offset shows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from dsv4bench.cases import tensors
from dsv4bench.cases.case import Case
from reference import indices as remap


def block_table(pages: list[int], device, g) -> torch.Tensor:
    """(requests, max pages) int32: each request its own pages of one shuffled pool, -1 after."""
    perm = torch.randperm(sum(pages), generator=g, device=device).to(torch.int32)
    table = torch.full((len(pages), max(pages)), -1, dtype=torch.int32, device=device)
    start = 0
    for r, n in enumerate(pages):
        table[r, :n] = perm[start : start + n]
        start += n
    return table


def decode(case: Case, device, g) -> dict:
    b, s_q, h = case.batch_size, case.s_q, case.num_heads
    lens = torch.tensor(case.context_lens, device=device)
    req = torch.arange(b, device=device).repeat_interleave(s_q)
    pos = lens[req] - s_q + torch.arange(s_q, device=device).repeat(b)
    x = query_sets(case, pos, req, lens, device, g)
    x = {k: v.view(b, s_q, -1) if k.endswith("indices") else v for k, v in x.items()}
    if case.d_qk == 512:  # V4: the counts per request, as engines hand FlashMLA
        x["topk_length"] = (x["indices"][:, -1] >= 0).sum(-1).to(torch.int32)
        if case.extra_topk:
            x["extra_topk_length"] = (x["extra_indices"][:, -1] >= 0).sum(-1).to(torch.int32)
    x["q"] = tensors.query(case, (b, s_q, h, case.d_qk), device, g)
    x["attn_sink"] = tensors.sink(case, device, g)
    return {k: (v.to(torch.int32) if k.endswith("indices") else v) for k, v in x.items()}


def query_sets(case: Case, pos, req, lens, device, g) -> dict:
    """FP8 caches and global indices for queries at positions pos of requests req, request r
    owning the pages of its own context lens[r]."""
    x: dict = {}
    page = case.page_size
    if case.window:
        first = torch.zeros_like(lens).scatter_reduce(0, req, pos, "amin", include_self=False)
        start = (first - case.window + 1).clamp(min=0)
        spans = (lens - start).tolist()
        local = tensors.last_window(pos, start[req][:, None], case.window, case.topk)
    else:
        spans = lens.tolist()
        local = tensors.choose(pos + 1, case.topk, g, case.index_pattern, req)
    pages = [tensors.pages(n, page) for n in spans]
    x["k_cache"], _ = tensors.cache(case, sum(pages) * page, device, g)
    table = block_table(pages, device, g)
    x["indices"] = remap.to_global_slots(local[:, None, :], table[req], page)[:, 0]
    tensors.poison_unused(case, x["k_cache"], x["indices"])
    if case.extra_topk:
        pages_c = [max(1, tensors.pages(n // case.compress_ratio, page)) for n in lens.tolist()]
        x["extra_k_cache"], _ = tensors.cache(case, sum(pages_c) * page, device, g)
        table_c = block_table(pages_c, device, g)
        local_c = tensors.extra_local(case, pos, g, req)
        x["extra_indices"] = remap.to_global_slots(local_c[:, None, :], table_c[req], page)[:, 0]
        tensors.poison_unused(case, x["extra_k_cache"], x["extra_indices"])
    return x


def prefill(case: Case, device, g, chunk: Callable[[Case, object, object], dict]) -> dict:
    """One sparse-prefill call over every request's chunk (see the module docstring); `chunk`
    builds one request's lone chunk (inputs.py's prefill)."""
    t = case.tokens
    parts = []
    for n in case.context_lens:  # each request's chunk, as a lone chunk of its context
        alone = replace(case, context_lens=(), ragged="", batch_size=1, context_len=n)
        parts.append(chunk(alone, device, g))
    sizes = torch.tensor([p["kv"].shape[0] for p in parts], device=device)
    cu = torch.zeros(len(parts) + 1, dtype=torch.int32, device=device)
    cu[1:] = torch.cumsum(sizes, 0)
    width = max(p["indices"].shape[-1] for p in parts)
    local = torch.cat([remap.pad_to(p["indices"][:, 0], width) for p in parts])
    req = torch.arange(len(parts), device=device).repeat_interleave(t)
    return {
        "q": torch.cat([p["q"] for p in parts]),
        "kv": torch.cat([p["kv"] for p in parts]),
        "indices": remap.ragged_to_global(local, cu[:-1], req)[:, None],
        "topk_length": torch.cat([p["topk_length"] for p in parts]),
        "attn_sink": parts[0]["attn_sink"],  # one layer: one sink for every request
        "cu_seqlens_k": cu,
        "ragged_indices": local[:, None],
    }
