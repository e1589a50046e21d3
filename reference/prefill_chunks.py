"""vLLM's chunked sparse prefill over an FP8 cache (FlashMLASparse, vLLM 0.33.0): the prefill
requests split into chunks whose contexts fit one bf16 workspace, each chunk's contexts gathered
and upconverted into it, and every token's top-k mapped to workspace rows.

Sources (vLLM 0.33.0): vllm/v1/attention/backends/utils.py `split_prefill_chunks`;
vllm/v1/attention/backends/mla/flashmla_sparse.py (`get_prefill_workspace_size`,
`_build_fp8_separate_prefill_decode`: the workspace starts, shifted to 0 at each chunk's first
request); vllm/config/attention.py (`sparse_mla_prefill_workspace_factor`: 5 x max_model_len
rows up to 256K tokens, else 2); sparse_utils.py (`triton_convert_req_index_to_global_index`).

Conventions as reference/indices.py: -1 is invalid; a local index is a request-local token
position; a slot is `page * page_size + offset`.
"""

from __future__ import annotations

import torch

WORKSPACE_FACTOR = 5  # rows per max_model_len up to LONG_CONTEXT tokens
LONG_CONTEXT_FACTOR = 2
LONG_CONTEXT = 256 * 1024


def workspace_rows(max_model_len: int, factor: int | None = None) -> int:
    """Rows of the bf16 prefill workspace vLLM reserves (each d_qk wide)."""
    if factor is None:
        factor = WORKSPACE_FACTOR if max_model_len <= LONG_CONTEXT else LONG_CONTEXT_FACTOR
    return max_model_len * factor


def split_prefill_chunks(seq_lens: list[int], rows: int) -> list[tuple[int, int]]:
    """Greedy [start, end) request ranges whose contexts sum to at most `rows` each."""
    if any(s > rows for s in seq_lens):
        raise ValueError(f"a prefill context of {max(seq_lens)} tokens exceeds the {rows} rows")
    bounds, i = [], 0
    while i < len(seq_lens):
        start, total = i, 0
        while i < len(seq_lens) and total + seq_lens[i] <= rows:
            total += seq_lens[i]
            i += 1
        bounds.append((start, i))
    return bounds


def workspace_starts(seq_lens: list[int], chunks: list[tuple[int, int]]) -> list[int]:
    """Each prefill request's first row in its chunk's workspace (0 for a chunk's first)."""
    starts = [0] * len(seq_lens)
    for start, end in chunks:
        row = 0
        for r in range(start, end):
            starts[r] = row
            row += seq_lens[r]
    return starts


def remap(
    local: torch.Tensor,
    req_of_token: torch.Tensor,
    block_table: torch.Tensor,
    page_size: int,
    prefill_request: torch.Tensor,
    starts: torch.Tensor,
) -> torch.Tensor:
    """Top-k of a mixed batch -> what the attention kernels read, as vLLM's remap does.

    local (t, k) request-local positions; req_of_token (t,) each token's block-table row;
    prefill_request (t,) -1 for a decode token, else its prefill request's index into
    `starts` (each prefill request's workspace row, workspace_starts()). A decode token's
    entry becomes its global slot (indices.to_global_slots' rule: -1 past the block table), a
    prefill token's `starts[p] + i`; -1 stays -1."""
    if local.dim() != 2 or req_of_token.shape != (local.shape[0],):
        raise ValueError(
            f"local must be (t, k) with req_of_token (t,), got {tuple(local.shape)} and "
            f"{tuple(req_of_token.shape)}"
        )
    if prefill_request.shape != req_of_token.shape:
        raise ValueError(f"prefill_request must be ({local.shape[0]},) like req_of_token")
    flat = local.long()
    block = torch.div(flat, page_size, rounding_mode="floor")
    pages = block_table.long()[req_of_token.long()]
    valid = (flat >= 0) & (block < pages.shape[1])
    page = pages.gather(1, torch.where(valid, block, 0))
    slots = torch.where(valid & (page >= 0), page * page_size + flat % page_size, -1)
    is_prefill = (prefill_request >= 0)[:, None]
    start = starts.long()[prefill_request.long().clamp_min(0)][:, None]
    rows = torch.where(flat >= 0, start + flat, -1)
    return torch.where(is_prefill, rows, slots).to(local.dtype)


def gather_workspace(
    cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: list[int],
    starts: list[int],
    rows: int,
    *,
    layout: str,
) -> torch.Tensor:
    """One chunk's bf16 workspace [rows, d_qk]: request r's context tokens 0..seq_lens[r]-1 at
    rows starts[r].. (vLLM's cp_gather_and_upconvert_fp8_kv_cache); rows past them stay 0."""
    from reference.layouts import gather_tokens

    page_size = cache.shape[1]
    slot_parts, row_parts = [], []
    for r, (length, start) in enumerate(zip(seq_lens, starts, strict=True)):
        pos = torch.arange(length, device=cache.device)
        slot_parts.append(
            block_table[r].long().to(cache.device)[pos // page_size] * page_size + pos % page_size
        )
        row_parts.append(start + pos)
    slots, at = torch.cat(slot_parts), torch.cat(row_parts)
    values = gather_tokens(cache, slots, layout=layout).to(torch.bfloat16)
    out = torch.zeros(rows, values.shape[1], dtype=torch.bfloat16, device=cache.device)
    out[at] = values
    return out
