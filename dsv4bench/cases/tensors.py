"""The building blocks of a case's tensors, shared by inputs.py (one context per batch) and
ragged.py (a context per request): FP8 caches written in the Case's layout, block tables,
drawn index sets, NaN-poisoned unused slots, sinks."""

from __future__ import annotations

import torch

from dsv4bench.cases import patterns, values
from dsv4bench.cases.case import DCP_FORMS, Case
from reference import dcp, layout_table, layouts


def pages(n: int, page_size: int) -> int:
    return -(-n // page_size)


def remap_pages(case: Case) -> int:
    """A remap case's block-table width: the whole context's pages, or (form dcp) a rank's
    (vLLM: cdiv(max_model_len, page_size * dcp_size); context_len plays max_model_len)."""
    if case.form in DCP_FORMS:
        return dcp.table_pages(case.context_len, case.page_size, case.dcp_size)
    return pages(case.context_len, case.page_size)


def cache(case: Case, n_tokens: int, device, g) -> tuple[torch.Tensor, int]:
    """A random FP8 cache of at least n_tokens tokens, its latent drawn as case.values says
    (cases/values.py); returns (cache, number of slots)."""
    d = case.d_qk
    num_pages = max(1, pages(n_tokens, case.page_size))
    kv = values.draw(case.values, (num_pages * case.page_size, d), g, device, "kv", case.seed)
    kv = kv.to(torch.bfloat16)
    layout = layout_table.layout(case.layout)
    if not layout.fp8:
        raise ValueError(f"no FP8 cache for layout {case.layout!r}")
    cache = layout.writer()(kv, case.page_size, case.scale_convention)
    return cache, num_pages * case.page_size


def block_table(num_requests: int, pages_per_request: int, device, g) -> torch.Tensor:
    perm = torch.randperm(num_requests * pages_per_request, generator=g, device=device)
    return perm.view(num_requests, pages_per_request).to(torch.int32)


def choose(visible: torch.Tensor, k: int, g, pattern: str = "uniform", req=None):
    """Per row, k distinct positions drawn from [0, visible), -1 past visible (valid first),
    picked as the case's index_pattern says (cases/patterns.py; uniform: as always)."""
    return patterns.choose(visible, k, g, pattern, req)


def last_window(pos: torch.Tensor, start, window: int, width: int) -> torch.Tensor:
    """Offsets (from buffer start: an int, or a (rows, 1) tensor) of the last `window`
    positions up to pos, -1 padded."""
    first = (pos - window + 1).clamp(min=0)
    offs = first[:, None] + torch.arange(width, device=pos.device)
    valid = (offs <= pos[:, None]) & (torch.arange(width, device=pos.device) < window)
    return torch.where(valid, offs - start, torch.full_like(offs, -1))


def extra_local(case: Case, pos: torch.Tensor, g, req=None) -> torch.Tensor:
    """Compressed entries each query sees: C4 picks top-k of them, C128 takes all."""
    visible = (pos + 1) // case.compress_ratio
    if case.compress_ratio == 4:
        return choose(visible, case.extra_topk, g, case.index_pattern, req)
    cols = torch.arange(case.extra_topk, device=pos.device)
    return torch.where(cols < visible[:, None], cols, torch.full_like(cols, -1))


def poison_unused(case: Case, cache: torch.Tensor, indices: torch.Tensor) -> None:
    """NaN into every slot no index names: a kernel reading outside its indices fails."""
    used = torch.zeros(cache.shape[0] * cache.shape[1], dtype=torch.bool, device=cache.device)
    used[indices[indices >= 0].long()] = True
    layouts.poison_tokens(cache, (~used).nonzero().flatten(), layout=case.layout)


def sink(case: Case, device, g) -> torch.Tensor | None:
    if not case.sink:
        return None
    return torch.randn(case.num_heads, generator=g, device=device, dtype=torch.float32)


def query(case: Case, shape: tuple[int, ...], device, g) -> torch.Tensor:
    """q (..., d_qk) bf16, drawn as case.values says (cases/values.py)."""
    return values.draw(case.values, shape, g, device, "q", case.seed).to(torch.bfloat16)
