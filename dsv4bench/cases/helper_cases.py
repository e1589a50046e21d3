"""The inputs and shapes of the DSA path's helper ops beyond attention (issue 46).

cache_write: every request of the batch (context_lens, or batch_size x context_len) writes its
  last s_q tokens, as a decode step (s_q 1) or a prefill chunk (s_q > 1) does:
    kv (rows + 1, d_qk) bf16: the latent then the rope (vLLM's kv_c | k_pe); the last row is a
      graph-padded row whose slot is -1 (writers must skip it);
    slot_mapping (rows + 1,) int64; block_table (b, pages) int32 (where the slots came from);
    k_cache: the layout's cache of every request's pages, every slot already written with
      other tokens (so a writer touching a neighbour's bytes changes the cache).
  The answer is the whole cache's bytes (padding included), judged byte for byte.
remap with tokens > 0: vLLM's prefill form over its sparse-prefill workspace. Each request is a
  prefill of its last min(tokens, context) tokens; the requests are split into chunks whose
  contexts fit 5 x context_len rows (context_len plays max_model_len;
  reference/prefill_chunks.py), and each request's workspace start is counted from its
  chunk's first request:
    local_indices (t, topk) int32 request-local; req_of_token, prefill_request (t,) int32;
    block_table (b, pages) int32; workspace_starts (b,) int32; seq_lens (b,) int32.
dequant with tokens > 0: vLLM's chunked prefill gather (FlashMLASparse: one
  cp_gather_and_upconvert_fp8_kv_cache per chunk; the indexer's cp_gather_indexer_k_quant_cache
  likewise): every request's whole context (request_lens; ragged requests crossing the chunk
  bounds) gathered chunk by chunk into a workspace, the chunks as the remap's:
    k_cache; block_table (b, pages) int32; seq_lens, workspace_starts (b,) int32 (each
    request's first row in its chunk's workspace); chunk_bounds (chunks, 2) int32 [first,
    end) requests. The answer is every chunk's workspace rows, chunk after chunk.
"""

from __future__ import annotations

import torch

from dsv4bench.cases import values
from dsv4bench.cases.case import Case
from dsv4bench.cases.tensors import block_table, cache, choose, pages
from reference import prefill_chunks
from reference.layout_table import layout as layout_entry

PADDED_ROWS = 1  # rows of slot -1 a cache_write call carries (a CUDA-graph padded batch)


def written_rows(case: Case) -> int:
    """Tokens a cache_write case writes (the padded row not counted)."""
    return case.query_tokens


def _request_slots(case: Case, table: torch.Tensor) -> torch.Tensor:
    parts = []
    for r, n in enumerate(case.request_lens):
        pos = torch.arange(n - min(case.s_q, n), n, device=table.device)
        page = table[r].long()[pos // case.page_size]
        parts.append(page * case.page_size + pos % case.page_size)
    return torch.cat(parts)


def cache_write_inputs(case: Case, device, g) -> dict:
    b, per_req = case.batch_size, pages(case.context_len, case.page_size)
    table = block_table(b, per_req, device, g)
    k_cache, _ = cache(case, b * per_req * case.page_size, device, g)
    slots = _request_slots(case, table)
    rows = len(slots) + PADDED_ROWS
    kv = values.draw(case.values, (rows, case.d_qk), g, device, "kv-new", case.seed)
    pad = torch.full((PADDED_ROWS,), -1, dtype=torch.long, device=device)
    return {
        "kv": kv.to(torch.bfloat16),
        "slot_mapping": torch.cat([slots, pad]),
        "block_table": table,
        "k_cache": k_cache,
    }


def cache_write_shapes(case: Case) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    rows = written_rows(case) + PADDED_ROWS
    per_req = pages(case.context_len, case.page_size)
    token_bytes = layout_entry(case.layout).bytes_per_token(case.d_qk)
    return {
        "kv": ((rows, case.d_qk), torch.bfloat16),
        "slot_mapping": ((rows,), torch.int64),
        "block_table": ((case.batch_size, per_req), torch.int32),
        "k_cache": ((case.batch_size * per_req, case.page_size, 1, token_bytes), torch.uint8),
    }


def prefill_rows(case: Case) -> list[int]:
    """Query tokens of each request in a remap case's prefill form."""
    return [min(case.tokens, n) for n in case.request_lens]


def chunks(case: Case) -> list[tuple[int, int]]:
    rows = prefill_chunks.workspace_rows(case.context_len)
    return prefill_chunks.split_prefill_chunks(list(case.request_lens), rows)


def workspace_remap_inputs(case: Case, device, g) -> dict:
    lens = list(case.request_lens)
    b = len(lens)
    table = block_table(b, pages(case.context_len, case.page_size), device, g)
    counts = prefill_rows(case)
    req = torch.repeat_interleave(
        torch.arange(b, device=device), torch.tensor(counts, device=device)
    )
    pos = torch.cat(
        [torch.arange(n - c, n, device=device) for n, c in zip(lens, counts, strict=True)]
    )
    local = choose(pos + 1, case.topk, g, case.index_pattern, req).to(torch.int32)
    starts = prefill_chunks.workspace_starts(lens, chunks(case))
    return {
        "local_indices": local,
        "req_of_token": req.to(torch.int32),
        "prefill_request": req.to(torch.int32),
        "block_table": table,
        "workspace_starts": torch.tensor(starts, dtype=torch.int32, device=device),
        "seq_lens": torch.tensor(lens, dtype=torch.int32, device=device),
    }


def workspace_remap_shapes(case: Case) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    t, b = sum(prefill_rows(case)), case.batch_size
    return {
        "local_indices": ((t, case.topk), torch.int32),
        "req_of_token": ((t,), torch.int32),
        "prefill_request": ((t,), torch.int32),
        "block_table": ((b, pages(case.context_len, case.page_size)), torch.int32),
        "workspace_starts": ((b,), torch.int32),
        "seq_lens": ((b,), torch.int32),
    }


def chunked_gather_inputs(case: Case, device, g) -> dict:
    lens = list(case.request_lens)
    per_req = pages(case.context_len, case.page_size)
    table = block_table(len(lens), per_req, device, g)
    k_cache, _ = cache(case, len(lens) * per_req * case.page_size, device, g)
    bounds = chunks(case)
    return {
        "k_cache": k_cache,
        "block_table": table,
        "seq_lens": torch.tensor(lens, dtype=torch.int32, device=device),
        "workspace_starts": torch.tensor(
            prefill_chunks.workspace_starts(lens, bounds), dtype=torch.int32, device=device
        ),
        "chunk_bounds": torch.tensor(bounds, dtype=torch.int32, device=device).view(-1, 2),
    }


def chunked_gather_shapes(case: Case) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    b, per_req = case.batch_size, pages(case.context_len, case.page_size)
    token_bytes = layout_entry(case.layout).bytes_per_token(case.d_qk)
    return {
        "k_cache": ((max(1, b * per_req), case.page_size, 1, token_bytes), torch.uint8),
        "block_table": ((b, per_req), torch.int32),
        "seq_lens": ((b,), torch.int32),
        "workspace_starts": ((b,), torch.int32),
        "chunk_bounds": ((len(chunks(case)), 2), torch.int32),
    }
