"""sglang's calls of its Triton sparse MLA kernels, built from a case's inputs outside the timed
call (sglang 0.5.23).

V4 (srt/layers/attention/deepseek_v4_backend.py, the FP8 paged decode path): every query token
is a row of its own, q (T, h, 512) -> q.unsqueeze(1) (T, 1, h, 512), indices (T, 1, W) and
topk_length (T,), W a multiple of 64 (the backend asserts it; the suite pads with -1), and the
kernel is handed the keyword arguments of flash_mla_with_kvcache:
  q, k_cache (pages, page_size, 1, 584), head_dim_v, softmax_scale, indices, topk_length,
  attn_sink (h,) fp32, extra_k_cache, extra_indices_in_kvcache (T, 1, W'), extra_topk_length
and returns (out (T, 1, h, 512) bf16, lse). A case's decode (b, s_q) is T = b * s_q rows (each
request's lengths repeated per token), a prefill chunk on route decode-kernel T rows of one.

V3.2 (srt/layers/attention/dsa_backend.py): a bf16 cache of every slot (slots, 1, 576), each
token's top-k as global slots (page_table_1, -1 where invalid):
  decode  triton_sparse_mla_decode_splitk(q_nope (T, h, 512), q_rope (T, h, 64), kv,
          indices=page_table_1.unsqueeze(1), sm_scale, d_v, workspace) -> (1, T, h, 512)
  prefill sparse_mla_prefill(q_all (T, h, 576), kv, page_table_1 (T, W), sm_scale, d_v,
          topk_length=(T,) or None, union=0|2|4) -> (T, h, 512)
"""

from __future__ import annotations

import math

from dsv4bench.backends import paged_rows
from dsv4bench.backends.base import pad_heads, pad_sink
from dsv4bench.cases.case import Case
from dsv4bench.cases.output import Output

INDEX_BLOCK = 64  # sglang's V4 backend asserts each index row's width % 64 == 0


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def pad_width(idx, multiple: int = INDEX_BLOCK):
    """idx (..., W) with -1 columns up to a multiple of `multiple`."""
    import torch

    width = idx.shape[-1]
    to = round_up(width, multiple)
    if to == width:
        return idx.contiguous()
    pad = idx.new_full((*idx.shape[:-1], to - width), -1)
    return torch.cat([idx, pad], dim=-1).contiguous()


def _per_token(length, s_q: int, t: int, width: int, device):
    """A request's length (b,) as every token's (T,); None: the full width (sglang always
    passes lengths: absent ones are the width)."""
    import torch

    if length is None:
        return torch.full((t,), width, dtype=torch.int32, device=device)
    return length.to(torch.int32).repeat_interleave(s_q).contiguous()


def v4_kwargs(case: Case, x: dict, heads: int) -> dict:
    """flash_mla_with_kvcache's keyword arguments as sglang's V4 backend builds them."""
    import torch

    b, s_q, h, d = x["q"].shape
    t = b * s_q  # may be 0 (an empty chunk): widths come from the last axes, never inferred
    q = pad_heads(x["q"].reshape(t, h, d), heads, 1).to(torch.bfloat16).unsqueeze(1)
    idx = x["indices"].reshape(t, x["indices"].shape[-1])
    kwargs = dict(
        q=q,
        k_cache=x["k_cache"],
        head_dim_v=case.d_v,
        softmax_scale=case.scale,
        indices=pad_width(idx.to(torch.int32)).unsqueeze(1),
        topk_length=_per_token(x.get("topk_length"), s_q, t, idx.shape[-1], q.device),
        attn_sink=pad_sink(x.get("attn_sink"), heads),
        extra_k_cache=None,
        extra_indices_in_kvcache=None,
        extra_topk_length=None,
    )
    if x.get("extra_k_cache") is not None:
        extra = x["extra_indices"].reshape(t, x["extra_indices"].shape[-1])
        kwargs["extra_k_cache"] = x["extra_k_cache"]
        kwargs["extra_indices_in_kvcache"] = pad_width(extra.to(torch.int32)).unsqueeze(1)
        kwargs["extra_topk_length"] = _per_token(
            x.get("extra_topk_length"), s_q, t, extra.shape[-1], q.device
        )
    return kwargs


def v4_finish(case: Case, lse_kind: str):
    """(out (T, 1, hp, 512), lse) -> the oracle's shapes. lse_kind: "keys" (the keys' lse,
    the oracle's), "sink" (the kernel folds the sink in: not the oracle's, not reported) or
    "none"."""
    h = case.num_heads

    def finish(raw) -> Output:
        out, lse = raw[0], raw[1]
        t = out.shape[0]
        out = out.reshape(t, out.shape[-2], out.shape[-1])[:, :h]
        lse = None if lse_kind != "keys" else lse.reshape(t, math.prod(lse.shape[1:]))[:, :h]
        if lse is not None:
            lse = paged_rows.no_key_lse(lse.float())
        if case.op == "prefill":
            return Output(out, lse)
        b, s_q = case.decode_shape
        out = out.reshape(b, s_q, h, -1)
        return Output(out, None if lse is None else lse.reshape(b, s_q, h).transpose(1, 2))

    return finish


def dsa_rows(case: Case, x: dict, heads: int) -> dict:
    """(q (T, hp, 576) bf16, kv (slots, 1, 576) bf16, indices (T, W) int32 with -1 where not
    in the row's list, topk_length (T,) or None) of a V3.2 case."""
    import torch

    q, rows, idx, ok = paged_rows.bf16_rows(case, x)
    kept = torch.where(ok, idx, torch.full_like(idx, -1)).to(torch.int32).contiguous()
    length = x.get("topk_length")
    if length is not None and case.decode_shape is not None:
        length = length.repeat_interleave(case.decode_shape[1])
    return dict(
        q=pad_heads(q, heads, 1).to(torch.bfloat16),
        kv=rows.view(rows.shape[0], 1, rows.shape[1]).contiguous(),
        indices=kept,
        topk_length=None if length is None else length.to(torch.int32).contiguous(),
    )


def dsa_finish(case: Case):
    h = case.num_heads

    def finish(raw) -> Output:
        out = raw.reshape(-1, raw.shape[-2], raw.shape[-1])[:, :h]
        if case.op == "prefill":
            return Output(out, None)
        b, s_q = case.decode_shape
        return Output(out.reshape(b, s_q, h, -1), None)

    return finish
