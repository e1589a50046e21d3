"""vLLM's `_C` ops on the indexer's FP8 key cache and its chunked prefill gathers (vLLM 0.33.0),
called as vllm/model_executor/layers/sparse_attn_indexer.py and
vllm/v1/attention/backends/mla/flashmla_sparse.py call them (backend: vllm_c.VllmOps):

  cache_write (layout indexer-fp8)  _C_cache_ops.indexer_k_quant_and_cache(k, kv_cache,
      slot_mapping, 128, "ue8m0"): k (tokens, 128) bf16 into the (blocks, 64, 132) cache,
      quant_block_size 128 (= head_dim: one fp32 scale a key), scale_fmt as the case's
      convention ("ue8m0" on sm90, DeepSeek V3.2's; "raw" passes "" and the kernel divides by
      amax / 448 where the oracle multiplies by its reciprocal: differing bytes are counted)
  dequant (layout indexer-fp8)  _C_cache_ops.cp_gather_indexer_k_quant_cache(kv_cache, dst_k
      (T, 128) e4m3, dst_scale (T, 4) uint8, block_table, cu_seq_lens): the keys of requests
      0..b-1 gathered in order; the answer is each key's bytes then its scale's, exact
  dequant (v32, tokens > 0)  _C_cache_ops.cp_gather_and_upconvert_fp8_kv_cache per prefill
      chunk (split_prefill_chunks over 5 x max_model_len rows) into that chunk's bf16
      workspace, with the chunk's block-table rows, workspace starts and batch size; no
      seq_starts (FlashMLASparse passes none). The kernel takes each request's length from the
      next request's workspace start (the last one's from dst.size(0)), so every chunk gets a
      workspace of exactly its rows. The indexer's gather runs over the same chunks.

Each chunk's workspace is its own guarded buffer: a kernel writing past its chunk's rows is
caught instead of being overwritten by the next chunk.
"""

from __future__ import annotations

import torch

from dsv4bench.backends.base import Prepared, Unsupported
from dsv4bench.backends.engine_helpers import guard
from dsv4bench.cases.case import Case
from dsv4bench.cases.output import Output

HEAD_DIM = 128
QUANT_BLOCK = 128  # deepseek_v2.py: quant_block_size = 128 (the kernel's 32 lanes x 4)
SCALE_FMT = {"ue8m0": "ue8m0", "raw": ""}  # convention -> the kernel's scale_fmt
NVFP4_REASON = (
    "vLLM's cp_gather_and_upconvert_nvfp4_kv_cache reads nvfp4_ds_mla records (352 B: 256 B "
    "e2m1 NoPE, 64 B e4m3 RoPE without scale, 32 e4m3 scales stored permuted), a layout the "
    "oracle does not hold (v41-fp4 is 288 B: no RoPE, scales in order); and the kernel "
    "requires SM100 (its own check: 'nvfp4_ds_mla KV cache requires SM100')"
)


def request_chunks(case: Case, x: dict) -> list[tuple[int, int]]:
    """[first, end) requests of each chunk; one chunk of every slot as one request without."""
    if case.tokens:
        return [tuple(c) for c in x["chunk_bounds"].tolist()]
    return [(0, 1)]


def _whole_cache(x: dict) -> tuple[torch.Tensor, list[int]]:
    """The one-request form: every slot in order (block table 0..pages-1)."""
    pages, page_size = x["k_cache"].shape[:2]
    table = torch.arange(pages, dtype=torch.int32, device=x["k_cache"].device)[None]
    return table, [pages * page_size]


def _requests(case: Case, x: dict) -> tuple[torch.Tensor, list[int]]:
    if case.tokens:
        return x["block_table"], x["seq_lens"].tolist()
    return _whole_cache(x)


def indexer_write(case: Case, x: dict, op) -> Prepared:
    if case.scale_convention not in SCALE_FMT:
        raise Unsupported(f"vLLM's indexer writer has no scale convention {case.scale_convention}")
    k = x["kv"].contiguous()
    cache = guard.Guarded.copy_of(x["k_cache"], "its cache")
    original = cache.inner_bytes().clone()
    pages, page_size = cache.tensor.shape[:2]
    kv_cache = cache.tensor.view(pages, page_size, -1)
    slots = x["slot_mapping"].to(torch.int64)
    fmt = SCALE_FMT[case.scale_convention]
    run = lambda: op(k, kv_cache, slots, QUANT_BLOCK, fmt)  # noqa: E731

    def finish(_) -> Output:
        cache.check()
        return Output(cache.inner_bytes().clone())

    poison = lambda: cache.inner_bytes().copy_(original)  # noqa: E731
    info = {"kernel": f"vllm indexer_k_quant_and_cache ({case.scale_convention})"}
    return Prepared(run, finish, poison, info, buffers=(k, slots))


def indexer_gather(case: Case, x: dict, op) -> Prepared:
    src = x["k_cache"]
    pages, page_size = src.shape[:2]
    kv_cache = src.view(torch.uint8).view(pages, page_size, -1)
    table, lens = _requests(case, x)
    calls, outs = [], []
    for first, end in request_chunks(case, x):
        rows = sum(lens[first:end])
        k = guard.Guarded.empty((rows, HEAD_DIM), torch.uint8, src.device, "its keys")
        s = guard.Guarded.empty((rows, 4), torch.uint8, src.device, "its scales")
        cu = torch.tensor([0, *lens[first:end]], device=src.device).cumsum(0).to(torch.int32)
        calls.append((k.tensor.view(torch.float8_e4m3fn), s.tensor, table[first:end], cu))
        outs.append((k, s))

    def run():
        for dst_k, dst_scale, rows_table, cu in calls:
            op(kv_cache, dst_k, dst_scale, rows_table, cu)

    def finish(_) -> Output:
        guard.check_all(*(g for pair in outs for g in pair))
        return Output(torch.cat([torch.cat([k.tensor, s.tensor], -1) for k, s in outs]))

    def poison():
        for k, s in outs:
            k.tensor.fill_(0x7F)  # e4m3 NaN
            s.tensor.fill_(0xFF)  # an fp32 NaN scale

    info = {"kernel": "vllm cp_gather_indexer_k_quant_cache", "chunks": len(calls)}
    return Prepared(run, finish, poison, info, buffers=(kv_cache, table))


def upconvert_chunks(case: Case, x: dict, op) -> Prepared:
    """cp_gather_and_upconvert_fp8_kv_cache per chunk (or once over every slot)."""
    src = x["k_cache"]
    pages, page_size = src.shape[:2]
    src3 = src.view(torch.uint8).view(pages, page_size, -1)
    table, lens = _requests(case, x)
    starts = (
        x["workspace_starts"]
        if case.tokens
        else torch.zeros(1, dtype=torch.int32, device=src.device)
    )
    calls, outs = [], []
    for first, end in request_chunks(case, x):
        rows = sum(lens[first:end])
        dst = guard.Guarded.empty((rows, case.d_qk), torch.bfloat16, src.device, "its workspace")
        calls.append((dst.tensor, table[first:end], starts[first:end], end - first))
        outs.append(dst)

    def run():
        for dst, rows_table, chunk_starts, n in calls:
            op(src3, dst, rows_table, chunk_starts, n, None)

    def finish(_) -> Output:
        guard.check_all(*outs)
        return Output(torch.cat([dst.tensor for dst in outs]))

    def poison():
        for dst in outs:
            dst.tensor.fill_(float("nan"))

    info = {"kernel": "vllm cp_gather_and_upconvert_fp8_kv_cache", "chunks": len(calls),
            "requests": len(lens)}  # fmt: skip
    return Prepared(run, finish, poison, info, buffers=(src3, table, starts))
