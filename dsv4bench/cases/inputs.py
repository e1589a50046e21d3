"""Deterministic tensors for a Case, built the way engines lay them out.

Keys by op (every index tensor int32, -1 = invalid, valid entries first in each row):
  decode, and prefill on the decode routes ((b, s_q) = Case.decode_shape: "decode-kernel"
  (tokens, 1), "decode-mixed" (1, tokens)):
    q (b, s_q, h, d_qk) bf16; k_cache uint8 FP8 cache; indices (b, s_q, topk) global slots;
    extra_k_cache, extra_indices (b, s_q, extra_topk) when the case has an extra cache;
    attn_sink (h,) fp32 when the case has a sink; topk_length / extra_topk_length None.
  prefill on route "sparse-prefill":
    q (tokens, h, d_qk) bf16; kv (s_kv, 1, d_qk) bf16 workspace = [main cache; extra cache]
    dequantized; indices (tokens, 1, width) over kv, width padded to 128; topk_length (tokens,).
  dequant: k_cache; with tokens > 0 vLLM's chunked gather (cases/helper_cases.py).
  remap: local_indices (b, s_q, topk), block_table (b, pages); with tokens > 0 the prefill
    form (cases/helper_cases.py). cache_write: kv, slot_mapping, block_table,
    k_cache (cases/helper_cases.py).
  indexer (dsv4bench/cases/indexer_case.py): q e4m3, weights fp32 (rows, heads); paged: kv_cache
    (blocks, page_size, 1, D + 4) uint8, block_table, context_lens (b,) or (b, s_q) for C4;
    ragged: kv e4m3 (keys, D), kv_scales fp32 (keys,), ks, ke (tokens,) int32.
  topk (dsv4bench/cases/topk_case.py): logits fp32 (rows, keys), lengths, row_starts (rows,);
    page_table: block_table, row_to_batch; ragged: offsets.

A ragged batch (Case.context_lens) gives each request its own context: dsv4bench/cases/ragged.py
(V4 decode then passes topk_length / extra_topk_length (b,); a ragged prefill also carries
cu_seqlens_k and ragged_indices). Drawn top-k sets follow Case.index_pattern (cases/patterns.py).

q and the cache's latent rows are drawn as Case.values says (cases/values.py: normal, or
outliers shaped like real activations).

A prefill chunk is the last `tokens` positions of a `context_len` sequence; decode queries are
the last `s_q` positions of each request. V3.2 cases index the whole sequence (top-k of all
visible tokens); V4 cases index a sliding-window cache (the last `window` tokens) as the main
cache and a compressed cache (`context_len // compress_ratio` entries) as the extra cache.
Pages are handed out in a random order, as a block allocator would after some churn. Cache
slots that no index names hold NaN (as in FlashMLA's tests), so reading outside the indices
shows up as an `incorrect` row.
"""

from __future__ import annotations

import hashlib
import json

import torch

from dsv4bench.cases.case import Case
from dsv4bench.cases.tensors import (
    block_table as _block_table,
)
from dsv4bench.cases.tensors import (
    cache as _cache,
)
from dsv4bench.cases.tensors import (
    choose as _choose,
)
from dsv4bench.cases.tensors import (
    extra_local as _extra_local,
)
from dsv4bench.cases.tensors import (
    last_window as _last_window,
)
from dsv4bench.cases.tensors import (
    pages as _pages,
)
from dsv4bench.cases.tensors import (
    poison_unused as _poison_unused,
)
from dsv4bench.cases.tensors import (
    query as _query,
)
from dsv4bench.cases.tensors import (
    remap_pages,
)
from dsv4bench.cases.tensors import (
    sink as _sink,
)
from reference import indices as remap
from reference import layouts


def seed_of(case: Case) -> int:
    """Seed from the problem, not the route: both routes of a prefill chunk see the same data."""
    problem = {k: v for k, v in case.params().items() if k != "route"}
    text = json.dumps(problem, sort_keys=True)
    return int(hashlib.sha1(text.encode()).hexdigest()[:12], 16)


def make_inputs(case: Case, device: str | torch.device) -> dict:
    g = torch.Generator(device=device)
    g.manual_seed(seed_of(case))
    make = {
        "decode": _decode,
        "prefill": _prefill,
        "dequant": _dequant,
        "remap": _remap,
        "indexer": _indexer,
        "page_split": _dequant,  # the same cache: context_len * batch_size tokens
        "topk": _topk,
        "cache_write": _cache_write,
    }
    x = make[case.op](case, torch.device(device), g)
    if case.edge:  # an engine's failure shape (cases/edges.py)
        from dsv4bench.cases import edges

        x = edges.apply(case, x)
    return x


def fingerprint(inputs: dict) -> str:
    """Hash of shapes, dtypes and a strided sample of every tensor (cheap for GB-sized caches)."""
    h = hashlib.sha1()
    for name in sorted(inputs):
        t = inputs[name]
        if t is None:
            continue
        flat = t.reshape(-1) if t.is_contiguous() else t.contiguous().reshape(-1)
        step = max(1, flat.numel() // (1 << 20))
        sample = flat[::step].cpu()
        if sample.dtype not in (torch.uint8, torch.int32, torch.int64, torch.float32):
            sample = sample.float()
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        h.update(sample.numpy().tobytes())
    return h.hexdigest()[:16]


# ---- building blocks --------------------------------------------------------------------


def _query_sets(case: Case, pos: torch.Tensor, req: torch.Tensor, nreq: int, device, g) -> dict:
    """FP8 caches and global indices for queries at positions pos of requests req."""
    x: dict = {}
    if case.window:
        # the window cache keeps, per request, the tokens the first query's window starts at
        start = int(max(0, int(pos.min()) - case.window + 1)) if pos.numel() else 0
        span = min(case.context_len, int(pos.max()) + 1) - start
        local = _last_window(pos, start, case.window, case.topk)
    else:
        start, span = 0, case.context_len
        local = _choose(pos + 1, case.topk, g, case.index_pattern, req)
    per_req = _pages(span, case.page_size)
    x["k_cache"], _ = _cache(case, nreq * per_req * case.page_size, device, g)
    table = _block_table(nreq, per_req, device, g)
    x["indices"] = remap.to_global_slots(local[:, None, :], table[req], case.page_size)[:, 0]
    _poison_unused(case, x["k_cache"], x["indices"])
    if case.extra_topk:
        entries = case.context_len // case.compress_ratio
        per_req_c = max(1, _pages(entries, case.page_size))
        x["extra_k_cache"], _ = _cache(case, nreq * per_req_c * case.page_size, device, g)
        table_c = _block_table(nreq, per_req_c, device, g)
        local_c = _extra_local(case, pos, g, req)
        x["extra_indices"] = remap.to_global_slots(
            local_c[:, None, :], table_c[req], case.page_size
        )[:, 0]
        _poison_unused(case, x["extra_k_cache"], x["extra_indices"])
    return x


def _to_int32(x: dict) -> dict:
    return {k: (v.to(torch.int32) if k.endswith("indices") else v) for k, v in x.items()}


# ---- ops --------------------------------------------------------------------------------


def _decode(case: Case, device, g) -> dict:
    if case.context_lens:  # a ragged batch: each request its own context
        from dsv4bench.cases import ragged

        return ragged.decode(case, device, g)
    b, s_q, h = case.batch_size, case.s_q, case.num_heads
    req = torch.arange(b, device=device).repeat_interleave(s_q)
    pos = (case.context_len - s_q + torch.arange(s_q, device=device)).repeat(b)
    x = _query_sets(case, pos, req, b, device, g)
    x = {k: v.view(b, s_q, -1) if k.endswith("indices") else v for k, v in x.items()}
    x["q"] = _query(case, (b, s_q, h, case.d_qk), device, g)
    x["attn_sink"] = _sink(case, device, g)
    return _to_int32(x)


def _prefill(case: Case, device, g) -> dict:
    if case.context_lens:  # one chunk per request over one ragged workspace (sglang NSA)
        from dsv4bench.cases import ragged

        return ragged.prefill(case, device, g, chunk=_prefill)
    t, h = case.tokens, case.num_heads
    pos = case.context_len - t + torch.arange(t, device=device)
    req = torch.zeros(t, dtype=torch.int64, device=device)
    x = _query_sets(case, pos, req, 1, device, g)
    q = _query(case, (t, h, case.d_qk), device, g)
    sink = _sink(case, device, g)
    if case.decode_shape:  # the same chunk as T requests of 1 token or 1 request of T
        b, s_q = case.decode_shape
        x = {k: v.view(b, s_q, -1) if k.endswith("indices") else v for k, v in x.items()}
        return _to_int32({**x, "q": q.view(b, s_q, h, case.d_qk), "attn_sink": sink})
    kv = layouts.to_workspace(x["k_cache"], layout=case.layout)
    if case.extra_topk:
        valid = x["indices"] >= 0
        valid_c = x["extra_indices"] >= 0
        idx, lengths = remap.merge_window_extra(
            x["indices"],
            valid.sum(1),
            x["extra_indices"],
            valid_c.sum(1),
            kv.shape[0],
            pad_to=128,
        )
        kv = torch.cat([kv, layouts.to_workspace(x["extra_k_cache"], layout=case.layout)])
    else:
        idx = remap.pad_width(x["indices"], 128)
        lengths = (x["indices"] >= 0).sum(1)
    return {
        "q": q,
        "kv": kv,
        "indices": idx.to(torch.int32).view(t, 1, -1),
        "topk_length": lengths.to(torch.int32),
        "attn_sink": sink,
    }


def _dequant(case: Case, device, g) -> dict:
    if case.op == "dequant" and case.tokens:  # vLLM's chunked prefill gather
        from dsv4bench.cases import helper_cases

        return helper_cases.chunked_gather_inputs(case, device, g)
    cache, _ = _cache(case, case.batch_size * case.context_len, device, g)
    return {"k_cache": cache}


def _cache_write(case: Case, device, g) -> dict:
    from dsv4bench.cases import helper_cases

    return helper_cases.cache_write_inputs(case, device, g)


def _remap(case: Case, device, g) -> dict:
    if case.tokens:  # vLLM's prefill form over its sparse-prefill workspace
        from dsv4bench.cases import helper_cases

        return helper_cases.workspace_remap_inputs(case, device, g)
    b, s_q = case.batch_size, case.s_q
    pos = (case.context_len - s_q + torch.arange(s_q, device=device)).repeat(b)
    local = _choose(pos + 1, case.topk, g).view(b, s_q, case.topk).to(torch.int32)
    per_req = remap_pages(case)
    return {"local_indices": local, "block_table": _block_table(b, per_req, device, g)}


def _indexer(case: Case, device, g) -> dict:
    from dsv4bench.cases import indexer_case as ic
    from reference import indexer

    h, d, r, n = case.num_heads, ic.head_dim(case), ic.ratio(case), ic.keys(case)
    rows = ic.rows(case)
    q = torch.randn(rows, h, d, generator=g, device=device).to(torch.float8_e4m3fn)
    w = torch.randn(rows, h, generator=g, device=device)
    if case.tokens:  # ragged: one chunk, keys contiguous (vLLM gathers them so for prefill)
        keys = torch.randn(n, d, generator=g, device=device)
        kv, scales = indexer.split_key_cache(indexer.quantize_key_cache(keys, case.page_size), n)
        pos = case.context_len - case.tokens + torch.arange(case.tokens, device=device)
        ke = ((pos + 1) // r).to(torch.int32)
        ks = torch.zeros_like(ke)
        return {"q": q, "weights": w, "kv": kv, "kv_scales": scales, "ks": ks, "ke": ke}
    b, next_n = case.batch_size, case.s_q
    per_req = max(1, _pages(n, case.page_size))
    keys = torch.randn(b * per_req * case.page_size, d, generator=g, device=device)
    cache = indexer.quantize_key_cache(keys, case.page_size)
    table = _block_table(b, per_req, device, g)
    if r == 1:  # causal over the last next_n positions: DeepGEMM's 1-D context_lens
        lens = torch.full((b,), case.context_len, dtype=torch.int32, device=device)
    else:  # C4: each row sees (pos + 1) // 4 entries: 2-D context_lens
        pos = case.context_len - next_n + torch.arange(next_n, device=device)
        lens = ((pos + 1) // r).to(torch.int32).repeat(b, 1)
    return {
        "q": q.view(b, next_n, h, d),
        "weights": w,
        "kv_cache": cache,
        "block_table": table,
        "context_lens": lens,
    }


def _topk(case: Case, device, g) -> dict:
    from dataclasses import replace

    from dsv4bench.cases import topk_case

    g.manual_seed(seed_of(replace(case, form="")))  # every form reads the same logits
    return topk_case.make_inputs(case, device, g)
