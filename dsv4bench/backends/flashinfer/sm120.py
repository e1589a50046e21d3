"""FlashInfer on sm120: the sparse MLA decode kernels over the packed FP8 cache.

  V4    sparse_mla_sm120_decode_dsv4(q [T, h, 512], kv_cache 584 B in 64-token pages, indices
        with topk in {128, 512, 1024}, mid_out, mid_lse, output, out_lse, sm_scale, *,
        topk_length, attn_sink, extra_kv_cache, extra_indices, extra_topk_length)
  V3.2  sparse_mla_sm120_decode_dsv3_2(... 656 B records ...): no extra cache; topk in
        {128, 512, 1024, 2048}
Outside the timed call: the cache re-paged to 64-token pages (V4 split_pages_v4, V3.2 a view
of its token-major records; slots unchanged), the index width padded with -1 to the kernel's
dispatch set (extra width to a multiple of 64). The kernels write out_lse in base 2 with the
sink merged; finish() converts it (convert.sm120_lse_to_natural). Page stride rules and what
is unverified: backend.py's docstring.
"""

from __future__ import annotations

import math

from dsv4bench.backends.base import Prepared, Unsupported, pad_heads, pad_sink
from dsv4bench.backends.flashinfer.convert import (
    SM120_PAGE,
    pad_indices,
    repage_v4,
    repage_v32,
    round_up,
    sm120_lse_to_natural,
    sm120_page_layout,
)
from dsv4bench.cases.case import Case
from dsv4bench.cases.output import Output

SM120_STRIDE_ALIGN = 16  # page starts must be 16-byte aligned: the kernel's cp.async.bulk
SM120_MAX_TOKENS = 64  # above this FlashInfer routes to its sm120 prefill kernel
SM120_SPLIT = 64  # candidates per split-K chunk (mid_out / mid_lse)
SM120_TOPKS = {"v4": (128, 512, 1024), "v32": (128, 512, 1024, 2048)}


def supports(case: Case) -> str | None:
    """Why the sm120 kernels cannot take this case (beyond the common rules); None if they can."""
    tokens = case.batch_size * case.s_q
    if tokens > SM120_MAX_TOKENS:
        return (
            f"FlashInfer's sm120 sparse MLA decode kernels take at most {SM120_MAX_TOKENS} "
            f"query tokens (b*s_q), got {tokens}"
        )
    topks = SM120_TOPKS[case.layout]
    if case.topk > topks[-1]:
        allowed = ", ".join(map(str, topks))
        return f"FlashInfer's sm120 {case.layout} decode takes topk {allowed}; got {case.topk}"
    if case.layout == "v4" and case.page_size % SM120_PAGE:
        return (
            f"FlashInfer's sm120 DSv4 decode reads {SM120_PAGE}-token pages; page_size "
            f"{case.page_size} does not split into them"
        )
    return None


def prepare(case: Case, x: dict, fn, heads: int, info: dict) -> Prepared:
    """The sm120 decode kernel (V4 or V3.2) over the packed cache in 64-token pages."""
    import torch

    q = x["q"]
    b, s_q, h, d = q.shape
    t = b * s_q
    v4 = case.layout == "v4"
    repage = repage_v4 if v4 else repage_v32
    qf = pad_heads(q.reshape(t, h, d), heads, 1).to(torch.bfloat16)
    idx = x["indices"].reshape(t, -1)
    width = next(w for w in SM120_TOPKS[case.layout] if w >= idx.shape[-1])
    kv = repage(x["k_cache"])
    page, stride = sm120_page_layout(kv)
    if page != SM120_PAGE or stride % SM120_STRIDE_ALIGN or stride < page * kv.shape[-1]:
        raise Unsupported(
            f"the sm120 kernel reads {SM120_PAGE}-token pages at a 16-byte aligned stride of "
            f"at least {SM120_PAGE * kv.shape[-1]} B; got {page} tokens, {stride} B"
        )
    sink = pad_sink(x.get("attn_sink"), heads)
    kwargs = {"topk_length": None, "attn_sink": sink}
    splits = width // SM120_SPLIT
    extra = x.get("extra_indices")
    if v4 and extra is not None:
        extra = extra.reshape(t, -1)
        extra_width = round_up(max(extra.shape[-1], 1), SM120_SPLIT)
        kwargs.update(
            extra_kv_cache=repage(x["extra_k_cache"]),
            extra_indices=pad_indices(extra, extra_width),
            extra_topk_length=None,
        )
        splits += extra_width // SM120_SPLIT
        info["extra_width"] = extra_width
    indices = pad_indices(idx, width)
    dev = q.device
    mid_out = torch.empty((t, heads, splits, case.d_v), dtype=torch.bfloat16, device=dev)
    mid_lse = torch.empty((t, heads, splits), dtype=torch.float32, device=dev)
    output = torch.empty((t, heads, case.d_v), dtype=torch.bfloat16, device=dev)
    out_lse = torch.empty((t, heads), dtype=torch.float32, device=dev)
    args = (qf, kv, indices, mid_out, mid_lse, output, out_lse, case.scale)
    info.update(
        index_width=width,
        page_size=SM120_PAGE,
        page_stride_bytes=stride,
        num_splits=splits,
        lse="base 2 with the sink merged; converted",
    )
    user_sink = x.get("attn_sink")

    def finish(raw) -> Output:
        o = output.view(b, s_q, heads, case.d_v)[:, :, :h]
        lse = sm120_lse_to_natural(out_lse[:, :h], user_sink)
        return Output(o, lse.view(b, s_q, h).transpose(1, 2))

    def poison():
        output.fill_(math.nan)
        out_lse.fill_(math.nan)

    return Prepared(lambda: fn(*args, **kwargs), finish, poison, info)
