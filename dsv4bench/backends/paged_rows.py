"""Sparse MLA through a dense paged kernel: each query token's top-k list as the page table of
one varlen row with page size 1, over one bf16 pool of the cache's slots. FA3 and FlashInfer's
FA3 MLA (sm90) are both fed this way, as vLLM and sglang feed them; everything here runs
outside the timed call except `scale_by_sink`.

The contract:
  lists   a row's list is its index entries that are valid (!= -1; for prefill also < the
          key count) and before the row's length (`topk_length`); decode's extra cache joins
          the main one as more entries of the same list, its slots shifted past the main
          cache's (one pool, one softmax).
  pool    every slot of the FP8 caches (main, then extra) dequantized to bf16 [slots, d_qk].
  sink    the kernels have no sink: out *= sigmoid(lse - sink) inside the timed call, the lse
          staying that of the keys (the oracle's).
  lse     a row with no key gives lse -inf; the oracle says +inf.
"""

from __future__ import annotations

import math

CONVERT_CHUNK = 1 << 16  # cache tokens dequantized at once
KV_DTYPES = ("bf16", "e4m3")  # the plain-row dtypes FA3 and FlashInfer read


def row_lists(idx, length=None, limit: int | None = None):
    """Per row of idx (T, k): a mask of the entries in its list, in order: != -1 (and < limit,
    prefill's rule: invalid if < 0 or >= s_kv) and before the row's length."""
    import torch

    ok = idx >= 0 if limit is not None else idx != -1
    if limit is not None:
        ok &= idx < limit
    if length is not None:
        cols = torch.arange(idx.shape[-1], device=idx.device)
        ok &= cols < length.to(idx.device).view(-1, 1)
    return ok


def decode_lists(x: dict):
    """(caches, idx (T, k + k_extra), ok mask) of decode-form inputs: one list per query token,
    the extra cache's slots shifted past the main cache's (one pool)."""
    import torch

    caches = [x["k_cache"]] + ([x["extra_k_cache"]] if x.get("extra_k_cache") is not None else [])
    b, s_q = x["q"].shape[:2]
    t = b * s_q
    per_token = lambda n: None if n is None else n.repeat_interleave(s_q)  # noqa: E731
    idx = x["indices"].reshape(t, x["indices"].shape[-1])  # t may be 0 (an empty chunk)
    ok = row_lists(idx, per_token(x.get("topk_length")))
    if len(caches) == 2:
        main_slots = caches[0].shape[0] * caches[0].shape[1]
        extra = x["extra_indices"].reshape(t, x["extra_indices"].shape[-1])
        ok_e = row_lists(extra, per_token(x.get("extra_topk_length")))
        idx = torch.cat([idx, torch.where(extra >= 0, extra + main_slots, extra)], -1)
        ok = torch.cat([ok, ok_e], -1)
    return caches, idx, ok


def bf16_rows(case, x: dict):
    """(q (T, h, d), bf16 key rows (slots, d_qk), idx (T, k), ok mask) of a case's inputs, one
    query row per token: decode caches dequantized into one pool, prefill's kv as it is."""
    import torch

    if case.decode_shape is not None:
        b, s_q, h, d = x["q"].shape
        caches, idx, ok = decode_lists(x)
        return x["q"].reshape(b * s_q, h, d), bf16_pool(caches, case.d_qk, case.layout)[0], idx, ok
    rows = x["kv"].flatten(1).to(torch.bfloat16).contiguous()
    idx = x["indices"].flatten(1)
    return x["q"], rows, idx, row_lists(idx, x.get("topk_length"), limit=rows.shape[0])


def page_table(idx, ok):
    """(table int32 (T, width), lens int32 (T,)): each row's listed slots first, 0 after."""
    import torch

    order = torch.argsort((~ok).to(torch.int8), dim=-1, stable=True)
    table = idx.gather(-1, order)
    lens = ok.sum(-1).to(torch.int32)
    cols = torch.arange(idx.shape[-1], device=idx.device)
    table = torch.where(cols < lens[:, None], table, torch.zeros_like(table))
    return table.to(torch.int32).contiguous(), lens.contiguous()


def flat_lists(idx, ok):
    """kv_indices (flat valid slots, row-major), and host qo_indptr, kv_indptr, kv_len_arr."""
    import torch

    lens = ok.sum(-1).to(torch.int32)
    flat = idx[ok].to(torch.int32)
    if flat.numel() == 0:  # a kernel wrapper copies kv_indices; keep it non-empty
        flat = torch.zeros(1, dtype=torch.int32, device=idx.device)
    lens_h = lens.cpu()
    t = lens_h.shape[0]
    kv_indptr = torch.zeros(t + 1, dtype=torch.int32)
    kv_indptr[1:] = torch.cumsum(lens_h, 0)
    qo_indptr = torch.arange(t + 1, dtype=torch.int32)
    return flat, qo_indptr, kv_indptr, lens_h


def pool_slots(caches) -> int:
    return sum(c.shape[0] * c.shape[1] for c in caches)


def gather_chunks(caches, layout: str | None = None, chunk: int = CONVERT_CHUNK):
    """(start slot in the pool, fp32 values [n, d_qk]) over every slot of each cache in order."""
    import torch

    from reference import layouts

    base = 0
    for cache in caches:
        n = cache.shape[0] * cache.shape[1]
        for s in range(0, n, chunk):
            slots = torch.arange(s, min(s + chunk, n), device=cache.device)
            yield base + s, layouts.gather_tokens(cache, slots, layout=layout)
        base += n


def bf16_pool(caches, d_qk: int, layout: str | None = None, check_exact: bool = False):
    """(rows bf16 [slots, d_qk], exact): every slot of the FP8 caches dequantized; `exact`
    (with check_exact, else None): whether bf16 holds every finite value unrounded."""
    import torch

    rows = torch.empty(pool_slots(caches), d_qk, dtype=torch.bfloat16, device=caches[0].device)
    exact = True
    for s, x in gather_chunks(caches, layout):
        y = x.to(torch.bfloat16)
        if check_exact:
            exact &= bool(((y.float() == x) | ~torch.isfinite(x)).all())
        rows[s : s + x.shape[0]] = y
    return rows, (exact if check_exact else None)


def scale_by_sink(out, lse, sink) -> None:
    """out (T, h, d_v) *= sigmoid(lse - sink) = exp(lse) / (exp(lse) + exp(sink)), lse (T, h)
    natural log of the keys, sink (h,): the sink's share of the softmax, inside the timed call."""
    import torch

    out.mul_(torch.sigmoid(lse - sink).unsqueeze(-1))


def no_key_lse(lse):
    """The kernel's -inf lse of a row without keys as the oracle's +inf."""
    import torch

    return lse.masked_fill(torch.isneginf(lse), math.inf)
