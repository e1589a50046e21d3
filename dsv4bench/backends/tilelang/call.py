"""sglang's call of its TileLang sparse MLA kernel, built from a case's inputs outside the timed
call (sglang 0.5.23, srt/layers/attention/dsa_backend.py `_forward_tilelang`):

  tilelang_sparse_fwd(q=q_all (T, h, 576) bf16, kv=kv_cache (slots, 1, 576) bf16,
      indices=page_table_1.unsqueeze(1) (T, 1, W) int32, sm_scale=layer.scaling, d_v=512)
      -> (1, T, h, 512) bf16, which sglang squeezes; no lse.

page_table_1 holds each query token's top-k as global slots of a page-size-1 pool, -1 where
invalid, its width padded with -1 to a multiple of 64 (the kernel's index block). sglang runs
prefill and decode through this one call: a decode-form case (the FP8 paged cache) becomes one
bf16 pool of every cache slot, as sglang keeps a bf16 cache for this backend; a sparse-prefill
case hands its bf16 workspace over as it is. Entries past a row's `topk_length`, and prefill
entries outside the workspace, become -1 (the kernel masks negative indices). Heads are passed
as sglang passes them (tp_q_head_num, unpadded); an explicit head_padding adds zero queries.
"""

from __future__ import annotations

import time

from dsv4bench.backends import paged_rows
from dsv4bench.backends.base import Prepared, Unsupported, pad_heads
from dsv4bench.cases.case import Case
from dsv4bench.cases.output import Output

D_QK = 576
D_V = 512
INDEX_BLOCK = 64  # sglang pads each index row with -1 to a multiple of it


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def padded_indices(idx, ok):
    """(T, 1, W) int32: idx where ok, else -1, W the next multiple of INDEX_BLOCK."""
    import torch

    from reference.indices import pad_width

    kept = torch.where(ok, idx, torch.full_like(idx, -1))
    return pad_width(kept, INDEX_BLOCK).to(torch.int32).unsqueeze(1).contiguous()


def kernel_inputs(case: Case, x: dict, heads: int) -> dict:
    """The keyword arguments of tilelang_sparse_fwd for the case's inputs."""
    import torch

    q, rows, idx, ok = paged_rows.bf16_rows(case, x)
    return dict(
        q=pad_heads(q, heads, 1).to(torch.bfloat16),
        kv=rows.view(rows.shape[0], 1, rows.shape[1]).contiguous(),
        indices=padded_indices(idx, ok),
        sm_scale=case.scale,
        d_v=case.d_v,
    )


def _finish(case: Case):
    h = case.num_heads

    def finish(raw) -> Output:
        out = raw.squeeze(0)[:, :h]  # (T, heads, d_v), the padded heads dropped
        if case.op == "prefill":  # T tokens in order, whichever route (prefill_output's rows)
            return Output(out, None)
        b, s_q = case.decode_shape
        return Output(out.reshape(b, s_q, h, -1), None)

    return finish


def prepare_call(case: Case, x: dict, device: str, sparse_fwd, heads: int) -> Prepared:
    """The call, built and made once outside the timed call: TileLang compiles the kernel for
    these heads, width and scale on its first use (info["first_call_s"])."""
    import torch

    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)
    sync()
    t0 = time.perf_counter()
    call = kernel_inputs(case, x, heads)
    sync()
    t1 = time.perf_counter()
    try:
        sparse_fwd(**call)
    except AssertionError as e:  # the kernel factory's own limits
        raise Unsupported(f"sglang's TileLang kernel refuses this case: {e}"[:300]) from e
    sync()
    info = {
        "kernel": "sglang tilelang_sparse_fwd (sparse_attention_fwd_kernel_v2)",
        "kv_dtype": "bf16",
        "convert_ms": (t1 - t0) * 1e3,
        "first_call_s": time.perf_counter() - t1,
        "padded_heads": heads,
        "index_width": call["indices"].shape[-1],
        "lse": "not returned by the kernel",
    }
    buffers = tuple(v for v in call.values() if hasattr(v, "data_ptr"))  # q, kv, indices
    return Prepared(lambda: sparse_fwd(**call), _finish(case), None, info, buffers=buffers)
