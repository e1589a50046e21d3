"""The shapes and dtypes of a case's inputs (inputs.make_inputs) by arithmetic on its fields,
without making a tensor: what sizes a case too large to build here (a 1M-token cache, a
batch of 64 long requests) would hand a kernel. tests/cases/test_input_shapes.py holds this to
make_inputs on small cases of every op, route, ragged batch and edge."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsv4bench.cases import indexer_case
from dsv4bench.cases.case import Case
from dsv4bench.cases.edges import ROW_KEYS
from dsv4bench.cases.tensors import remap_pages
from reference.layout_table import layout as layout_entry

INT32, FP32, BF16, BYTES = torch.int32, torch.float32, torch.bfloat16, torch.uint8
E4M3 = torch.float8_e4m3fn


@dataclass(frozen=True)
class Shape:
    """One input tensor: its dims and dtype."""

    dims: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        n = self.dtype.itemsize
        for d in self.dims:
            n *= d
        return n


def input_shapes(case: Case) -> dict[str, Shape]:
    """{name: Shape} of every tensor make_inputs(case) gives (None entries left out)."""
    make = {
        "decode": _decode,
        "prefill": _prefill,
        "dequant": _whole_cache,
        "page_split": _whole_cache,
        "remap": _remap,
        "indexer": _indexer,
        "topk": _topk,
        "cache_write": _helper_shapes,
    }
    if case.op in ("remap", "dequant") and case.tokens:
        make[case.op] = _helper_shapes
    x = make[case.op](case)
    if case.edge == "empty-chunk":  # edges.apply: the row tensors lose every row
        x = {k: (Shape((0, *s.dims[1:]), s.dtype) if k in ROW_KEYS else s) for k, s in x.items()}
    elif case.edge == "empty-request" and case.d_qk == 512:  # edges.with_counts
        x |= _counts(case, case.batch_size)
    return x


def _helper_shapes(case: Case) -> dict[str, Shape]:
    from dsv4bench.cases import helper_cases

    found = {
        "cache_write": helper_cases.cache_write_shapes,
        "dequant": helper_cases.chunked_gather_shapes,
        "remap": helper_cases.workspace_remap_shapes,
    }[case.op](case)
    return {k: Shape(dims, dtype) for k, (dims, dtype) in found.items()}


def _pages(n: int, page_size: int) -> int:
    return -(-n // page_size)


def _cache(case: Case, pages: int) -> Shape:
    """tensors.cache: at least one page of page_size tokens of the layout's records."""
    token_bytes = layout_entry(case.layout).bytes_per_token(case.d_qk)
    return Shape((max(1, pages), case.page_size, 1, token_bytes), BYTES)


def _main_span(case: Case, first_pos: int, context: int) -> int:
    """Tokens a request's main cache holds: the window from its first query's, or all."""
    if not case.window:
        return context
    return context - max(0, first_pos - case.window + 1)


def _extra_pages(case: Case, context: int) -> int:
    return max(1, _pages(context // case.compress_ratio, case.page_size))


def _counts(case: Case, b: int) -> dict[str, Shape]:
    """V4's per-request counts (b,) (ragged batches, empty-request)."""
    x = {"topk_length": Shape((b,), INT32)}
    if case.extra_topk:
        x["extra_topk_length"] = Shape((b,), INT32)
    return x


def _decode_form(case: Case, b: int, s_q: int, owners: list[tuple[int, int]]) -> dict:
    """q (b, s_q, ...), indices and the caches of the requests `owners` (each its first query's
    position and its context: the pages it owns)."""
    ps = case.page_size
    x = {
        "k_cache": _cache(case, sum(_pages(_main_span(case, *o), ps) for o in owners)),
        "indices": Shape((b, s_q, case.topk), INT32),
    }
    if case.extra_topk:
        x["extra_k_cache"] = _cache(case, sum(_extra_pages(case, o[1]) for o in owners))
        x["extra_indices"] = Shape((b, s_q, case.extra_topk), INT32)
    x["q"] = Shape((b, s_q, case.num_heads, case.d_qk), BF16)
    if case.sink:
        x["attn_sink"] = Shape((case.num_heads,), FP32)
    return x


def _decode(case: Case) -> dict[str, Shape]:
    b, s_q = case.batch_size, case.s_q
    owners = [(n - s_q, n) for n in case.request_lens]
    x = _decode_form(case, b, s_q, owners)
    if case.context_lens and case.d_qk == 512:  # ragged.decode: V4 passes the counts
        x |= _counts(case, b)
    return x


def _prefill(case: Case) -> dict[str, Shape]:
    if case.decode_shape:  # the chunk's one request, its T queries as (b, s_q)
        ctx = case.context_len
        return _decode_form(case, *case.decode_shape, [(ctx - case.tokens, ctx)])
    chunks = case.context_lens or (case.context_len,)  # ragged.prefill: a lone chunk each
    rows = len(chunks) * case.tokens
    width = -(-(case.topk + case.extra_topk) // 128) * 128  # indices.pad_width / merge
    kv = sum(_workspace_rows(case, n) for n in chunks)
    x = {
        "q": Shape((rows, case.num_heads, case.d_qk), BF16),
        "kv": Shape((kv, 1, case.d_qk), BF16),
        "indices": Shape((rows, 1, width), INT32),
        "topk_length": Shape((rows,), INT32),
    }
    if case.sink:
        x["attn_sink"] = Shape((case.num_heads,), FP32)
    if case.context_lens:
        x["cu_seqlens_k"] = Shape((len(chunks) + 1,), INT32)
        x["ragged_indices"] = x["indices"]
    return x


def _workspace_rows(case: Case, context: int) -> int:
    """Rows of a lone chunk's bf16 workspace: its main cache's slots, then its extra cache's."""
    ps = case.page_size
    rows = max(1, _pages(_main_span(case, context - case.tokens, context), ps)) * ps
    return rows + (_extra_pages(case, context) * ps if case.extra_topk else 0)


def _whole_cache(case: Case) -> dict[str, Shape]:
    return {"k_cache": _cache(case, _pages(case.batch_size * case.context_len, case.page_size))}


def _remap(case: Case) -> dict[str, Shape]:
    b = case.batch_size
    return {
        "local_indices": Shape((b, case.s_q, case.topk), INT32),
        "block_table": Shape((b, remap_pages(case)), INT32),
    }


def _indexer(case: Case) -> dict[str, Shape]:
    h, d, n = case.num_heads, indexer_case.head_dim(case), indexer_case.keys(case)
    rows = indexer_case.rows(case)
    weights = Shape((rows, h), FP32)
    if case.tokens:  # the ragged form: contiguous keys
        t = case.tokens
        return {
            "q": Shape((rows, h, d), E4M3),
            "weights": weights,
            "kv": Shape((n, d), E4M3),
            "kv_scales": Shape((n,), FP32),
            "ks": Shape((t,), INT32),
            "ke": Shape((t,), INT32),
        }
    b, s_q = case.batch_size, case.s_q
    per_req = max(1, _pages(n, case.page_size))
    lens = (b,) if indexer_case.ratio(case) == 1 else (b, s_q)
    return {
        "q": Shape((b, s_q, h, d), E4M3),
        "weights": weights,
        "kv_cache": Shape((b * per_req, case.page_size, 1, d + 4), BYTES),
        "block_table": Shape((b, per_req), INT32),
        "context_lens": Shape(lens, INT32),
    }


def _topk(case: Case) -> dict[str, Shape]:
    m, n = indexer_case.rows(case), indexer_case.keys(case)
    x = {
        "logits": Shape((m, n), FP32),
        "lengths": Shape((m,), INT32),
        "row_starts": Shape((m,), INT32),
    }
    if case.form == "page_table":
        requests = 1 if case.tokens else case.batch_size
        x["block_table"] = Shape((requests, max(1, _pages(n, case.page_size))), INT32)
        x["row_to_batch"] = Shape((m,), INT32)
    elif case.form == "ragged":
        x["offsets"] = Shape((m,), INT32)
    return x
