"""The engines' failure shapes (Case.edge): inputs engines really hand the kernels, built from
a case's ordinary inputs (inputs.make_inputs).

empty-chunk       a prefill call of 0 query tokens: q, indices and topk_length keep their
                  widths and lose every row (vLLM issue 51486: a chunk of zero-query-len
                  requests reaches flash_mla_sparse_fwd with s_q == 0). The kv workspace is
                  the case's chunk's; the oracle's answer is empty too.
empty-request     a decode batch where one request (the middle one, so it sits inside the
                  batch) has no context: no valid index, its counts 0 (V4 passes topk_length
                  and extra_topk_length (b,), as ragged batches do). A kernel that splits the
                  batch into per-request segments gets one of zero extent (vLLM issue 56563,
                  FA3 sparse: TMA descriptors of zero-token segments).
graph-pad-vllm    a decode batch of batch_size real requests replayed in a graph captured at
graph-pad-sglang  graph_batch, the rows past the real ones padded as the engine pads them
                  (PADDING); judged on the real rows only (vLLM issues 56771, 57388).
graph-refill-vllm    as the engines run a captured graph step after step: captured on another
graph-refill-sglang  batch (other_batch: other lengths and indices, padded the same way), then
                  this batch and its padding copied into the captured call's buffers in place
                  and replayed (run/padded.py); judged on this batch's real rows.

Padded rows get zero queries in both engines' forms (the model computes them from padded
token ids; their output is dropped). The padded call reads the real rows' caches: padding
adds rows, never slots.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from dsv4bench.cases.case import Case
from dsv4bench.cases.output import Output

ROW_KEYS = ("q", "indices", "extra_indices", "topk_length", "extra_topk_length")


@dataclass(frozen=True)
class Padding:
    """How an engine fills the captured batch's rows past the real ones."""

    engine: str
    seq_len: int  # the padded rows' sequence length (what their index counts become)
    reads: str  # what a padded row's indices name
    source: str  # where the engine does it


PADDING: dict[str, Padding] = {
    "graph-pad-vllm": Padding(
        "vllm",
        0,
        "nothing: every index -1 (block table rows of padded requests are -1)",
        "vllm/v1/worker/gpu_model_runner.py _prepare_inputs: `self.seq_lens.np[num_reqs:]"
        ".fill(0)` ('Fill unused with 0 for full cuda graph mode') and query_start_loc past "
        "num_reqs repeats the last value (0 query tokens per padded request); padded block "
        "table rows are -1 (vLLM PR 35969, which clamps both for FlashMLA FP8 decode)",
    ),
    "graph-pad-sglang": Padding(
        "sglang",
        1,
        "one slot of a live request: the stale req_pool_indices of padded rows name another "
        "request's pages, read up to seq_len_fill_value (1) tokens",
        "sglang python/sglang/srt/model_executor/cuda_graph_runner.py replay_prepare: "
        "`self.seq_lens.fill_(self.seq_len_fill_value)` when bs != raw_bs, then only "
        "`req_pool_indices[:raw_bs]` is rewritten (padded rows keep the previous batch's)",
    ),
}


PADDING["graph-refill-vllm"] = PADDING["graph-pad-vllm"]
PADDING["graph-refill-sglang"] = PADDING["graph-pad-sglang"]
REFILL = ("graph-refill-vllm", "graph-refill-sglang")


def apply(case: Case, x: dict) -> dict:
    """The inputs of an empty-chunk or empty-request case from its ordinary ones; other cases'
    unchanged (a graph-pad case's oracle sees the real rows only: padded() builds the rest)."""
    if case.edge == "empty-chunk":
        return {k: (v[:0] if k in ROW_KEYS and v is not None else v) for k, v in x.items()}
    if case.edge == "empty-request":
        return empty_request(case, x, case.batch_size // 2)
    return x


def empty_request(case: Case, x: dict, r: int) -> dict:
    """Request r of a decode batch with no context: -1 indices, counts 0 (V4)."""
    y = dict(x)
    for key in ("indices", "extra_indices"):
        if y.get(key) is not None:
            y[key] = y[key].clone()
            y[key][r] = -1
    return with_counts(case, y)


def with_counts(case: Case, x: dict) -> dict:
    """V4 (d_qk 512) inputs with the per-request counts engines pass FlashMLA for a ragged
    batch: the valid entries of each request's last query row."""
    if case.d_qk != 512:
        return x
    y = dict(x)
    y["topk_length"] = (y["indices"][:, -1] >= 0).sum(-1).to(torch.int32)
    if y.get("extra_indices") is not None:
        y["extra_topk_length"] = (y["extra_indices"][:, -1] >= 0).sum(-1).to(torch.int32)
    return y


def padded(case: Case, x: dict) -> tuple[Case, dict]:
    """The captured batch a graph-pad case replays: graph_batch rows, the first batch_size
    real (x's), the rest padded as PADDING[case.edge] says. The Case is the one the backend
    prepares (a ragged batch: padded requests have the padding's sequence length)."""
    pad = PADDING[case.edge]
    n = case.graph_batch - case.batch_size
    y = dict(x)
    q = x["q"]
    y["q"] = torch.cat([q, q.new_zeros((n, *q.shape[1:]))])
    for key in ("indices", "extra_indices"):
        idx = x.get(key)
        if idx is None:
            continue
        rows = idx.new_full((n, *idx.shape[1:]), -1)
        if pad.seq_len:  # a stale request's first selected slot, seq_len tokens of it
            live = idx[0][idx[0] >= 0]
            if live.numel():
                rows[..., : pad.seq_len] = live[: pad.seq_len]
        y[key] = torch.cat([idx, rows])
    lens = case.request_lens + (pad.seq_len,) * n
    wide = replace(case, batch_size=case.graph_batch, context_lens=lens, graph_batch=0, edge="")
    return wide, with_counts(wide, y)


def other_batch(case: Case, x: dict) -> tuple[Case, dict]:
    """The batch a graph-refill case's graph is captured with, before this one: the same shapes,
    each request's query and indices from the next request (rolled by one), and the first
    request's valid entries halved (its count and length change). Whatever of it a refill
    leaves behind in the captured call makes the replay's answer differ from this batch's."""
    y = dict(x)
    y["q"] = x["q"].roll(1, dims=0)
    for key in ("indices", "extra_indices"):
        idx = x.get(key)
        if idx is None:
            continue
        idx = idx.roll(1, dims=0).clone()
        first = idx[0]
        valid = first >= 0
        keep = valid.sum(-1, keepdim=True) // 2  # per query row of the first request
        first[valid & (valid.cumsum(-1) > keep)] = -1
        y[key] = idx
    lens = list(case.request_lens)
    lens = [max(1, lens[-1] // 2), *lens[:-1]]
    return replace(case, context_lens=tuple(lens)), with_counts(case, y)


def real_rows(out: Output, batch_size: int) -> Output:
    """The real requests' answer from a padded batch's (decode: out (b, s_q, h, d_v), lse
    (b, h, s_q))."""
    lse = None if out.lse is None else out.lse[:batch_size]
    return Output(out.out[:batch_size], lse)
