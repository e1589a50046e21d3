"""FlashInfer on sm100: the trtllm-gen sparse MLA decode kernels over plain rows.

  V3.2  flashinfer.decode.trtllm_batch_decode_with_kv_cache_mla: one query per row (q_len 1),
        block_tables = each row's valid global slots first, seq_lens = their count.
  V4    flashinfer.mla.trtllm_batch_decode_sparse_mla_dsv4: two pools, the first 128 index
        columns the window (SWA) pool, the rest the compressed pool.
Outside the timed call: the FP8 cache dequantized into plain rows (bf16, exact for V4 and for
power-of-two V3.2 scales; or per-tensor e4m3 with q quantized the same way), V3.2's 576
columns kept, each row's valid indices first, the index width padded with -1 to the kernel's
alignment. trtllm-gen returns no lse: rows compare `out` only. Argument names and limits:
backend.py's docstring (read in FlashInfer's source, not run here).
"""

from __future__ import annotations

import math

from dsv4bench.backends.base import Prepared, Unsupported, pad_heads, pad_sink
from dsv4bench.backends.flashinfer.convert import (
    INDEX_ALIGN,
    SWA_WIDTH,
    cache_scale,
    pad_indices,
    plain_rows,
    round_up,
    trtllm_dsv4_indices,
    valid_first,
)
from dsv4bench.cases.case import Case
from dsv4bench.cases.output import Output
from reference.layouts import E4M3_MAX

TRTLLM_MIN_TOPK = 128


def supports(case: Case) -> str | None:
    """Why trtllm-gen cannot take this case (beyond the family's common rules); None if it can."""
    if case.layout == "v32" and case.topk < TRTLLM_MIN_TOPK:
        return f"FlashInfer trtllm-gen sparse MLA needs topk >= {TRTLLM_MIN_TOPK}, got {case.topk}"
    if case.layout == "v4" and case.topk > SWA_WIDTH:
        return (
            f"FlashInfer trtllm-gen DSv4 takes a {SWA_WIDTH}-slot window as the main cache; "
            f"topk {case.topk} > {SWA_WIDTH}"
        )
    return None


def _query(q, heads: int, kscale, kv_dtype: str):
    """Query rows (T, 1, heads, d) in the kv dtype, and (bmm1 factor, bmm2 scale)."""
    import torch

    from reference import layouts

    b, s_q, h, d = q.shape
    qp = pad_heads(q.reshape(b * s_q, 1, h, d), heads, 2)
    if kv_dtype == "bf16":
        return qp.to(torch.bfloat16), 1.0, 1.0
    qf = qp.float()
    qscale = layouts.e4m3_scale(qf.abs().amax())
    q8 = (qf / qscale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q8, float(qscale) * float(kscale), float(kscale)


def _workspace(device, workspace_bytes: int):
    import torch

    return torch.zeros(workspace_bytes, dtype=torch.uint8, device=device)


def _finish_rows(case: Case, b: int, s_q: int):
    h = case.num_heads

    def finish(raw) -> Output:  # raw: out (b*s_q, 1, heads, 512)
        return Output(raw.reshape(b, s_q, raw.shape[-2], raw.shape[-1])[:, :, :h], None)

    return finish


def prepare_v32(case: Case, x: dict, fn, heads: int, info: dict, kv_dtype: str, workspace: int):
    """trtllm_batch_decode_with_kv_cache_mla over plain rows of the V3.2 cache (576 columns)."""
    import torch

    q = x["q"]
    b, s_q = q.shape[:2]
    t = b * s_q
    idx, lengths = valid_first(x["indices"].reshape(t, -1))
    width = round_up(max(idx.shape[-1], TRTLLM_MIN_TOPK), INDEX_ALIGN)
    table = pad_indices(idx, width).view(t, 1, width)
    rows, kscale = plain_rows(x["k_cache"], dtype=kv_dtype, layout=case.layout)
    query, qk, bmm2 = _query(q, heads, kscale, kv_dtype)
    out = torch.empty((t, 1, heads, case.d_v), dtype=torch.bfloat16, device=q.device)
    sink = pad_sink(x.get("attn_sink"), heads)
    kwargs = dict(
        query=query,
        kv_cache=rows,
        workspace_buffer=_workspace(q.device, workspace),
        qk_nope_head_dim=128,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        block_tables=table,
        seq_lens=lengths,
        max_seq_len=width,
        sparse_mla_top_k=width,
        out=out,
        bmm1_scale=case.scale * qk,
        bmm2_scale=bmm2,
        sinks=None if sink is None else [sink],
        backend="trtllm-gen",
    )
    info.update(index_width=width, kv_dtype=kv_dtype, lse="not returned by trtllm-gen")
    run = lambda: fn(**kwargs)
    return Prepared(run, _finish_rows(case, b, s_q), lambda: out.fill_(math.nan), info)


def prepare_v4(case: Case, x: dict, fn, heads: int, info: dict, kv_dtype: str, workspace: int):
    """trtllm_batch_decode_sparse_mla_dsv4 over two plain-row pools (window, compressed)."""
    import torch

    q = x["q"]
    b, s_q = q.shape[:2]
    t = b * s_q
    extra = x.get("extra_indices")
    table, topk_lens, seq_lens = trtllm_dsv4_indices(
        x["indices"].reshape(t, -1), None if extra is None else extra.reshape(t, -1)
    )
    if t and int(seq_lens.min()) < 1:
        raise Unsupported(
            "FlashInfer trtllm-gen DSv4 derives the window from seq_lens >= 1; "
            "a query with an empty window cannot be expressed"
        )
    caches = [x["k_cache"]] + ([x["extra_k_cache"]] if extra is not None else [])
    scale = None
    if kv_dtype == "e4m3":  # one bmm scale for both pools: one shared kv scale
        scale = max((cache_scale(c, layout=case.layout) for c in caches), key=float)
    pools = [plain_rows(c, dtype=kv_dtype, scale=scale, layout=case.layout)[0] for c in caches]
    query, qk, bmm2 = _query(q, heads, scale if scale is not None else 1.0, kv_dtype)
    out = torch.empty((t, 1, heads, case.d_v), dtype=torch.bfloat16, device=q.device)
    kwargs = dict(
        query=query,
        swa_kv_cache=pools[0],
        workspace_buffer=_workspace(q.device, workspace),
        sparse_indices=table,
        compressed_kv_cache=pools[-1],  # without an extra cache: any valid pool
        sparse_topk_lens=topk_lens,
        seq_lens=seq_lens,
        out=out,
        bmm1_scale=case.scale * qk,
        bmm2_scale=bmm2,
        sinks=pad_sink(x.get("attn_sink"), heads),
        kv_layout="HND",
    )
    info.update(
        index_width=table.shape[-1],
        kv_dtype=kv_dtype,
        lse="not returned by trtllm-gen",
    )
    run = lambda: fn(**kwargs)
    return Prepared(run, _finish_rows(case, b, s_q), lambda: out.fill_(math.nan), info)
