"""Sparse MLA attention with FlashMLA semantics: the oracle every kernel is checked against.

For one query token with valid key set S (one latent KV head shared by all heads):

    logits[h, j] = scale * q[h] . k_j                       j in S
    lse[h]       = log sum_j exp(logits[h, j])              natural log, before any sink
    out[h]       = sum_j exp(logits[h, j] - lse[h]) * v_j   v_j = k_j[:d_v]
    sink s[h]:     out[h] *= exp(lse[h]) / (exp(lse[h]) + exp(s[h]))   (lse unchanged)
    S empty:       out[h] = 0, lse[h] = +inf (prefill max_logits[h] = -inf)

These are the definitions of FlashMLA's tests/ref.py (ref_sparse_attn_decode,
ref_sparse_attn_fwd), which flash_mla_interface.py names as the precise contract. Its
README writes the prefill pseudo-code in base 2 (logits * log2(e), log2sumexp2), but the
kernel outputs are checked against ref.py, which uses natural log and max_logits of the
scaled logits; this module follows ref.py.

Decisions:
- Duplicate indices count once per occurrence (ref.py gathers with index_select, and the
  kernels load each listed token), so a token listed twice gets twice the weight.
- A -1 inside the first ``topk_length`` entries is still invalid (skipped), not an error.
- Decode: an index is invalid only if it is -1 (FlashMLA's rule). Any other index that the
  query uses must be a slot of the cache; anything else raises ValueError, because the kernel
  would read out of bounds and there is nothing to compare against.
- Prefill: an index is invalid if it is < 0 or >= s_kv (FlashMLA's rule).
- Invalid keys contribute exactly nothing, even when the rows they name hold NaN.

All math is fp32 (TF32 is switched off for the duration of a call on CUDA). ``attend`` is
the math for one block of queries over their gathered keys, as ref.py writes it (logits ->
mask -> lse -> weights -> sink -> empty rows); the two entry points validate, block and
gather. Queries are processed in blocks whose working set stays within ``block_bytes``, so
peak extra memory does not grow with the number of tokens. Decode dequantizes each distinct
cache token a block uses once (queries of a request, and of a chunk through the decode
route, share tokens) and copies the rows to every query that lists them; prefill converts
kv to fp32 once per call when that fits in half the budget.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator

import torch

from reference.layout_table import of_cache
from reference.layouts import gather_tokens

BLOCK_BYTES = 128 * 2**20
"""Default working-set budget of one query block on a CPU (bytes)."""

CUDA_BLOCK_BYTES = 2**30
"""Default budget on a GPU: larger blocks mean fewer, larger matmuls and launches."""


def attend(
    q: torch.Tensor,
    keys: torch.Tensor,
    valid: torch.Tensor,
    scale: float,
    d_v: int,
    sink: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sparse MLA attention of n queries, each over its own gathered keys, as ref.py does it.

    q ``(n, h, d)`` and keys ``(n, k, d)`` fp32, keys zero where invalid; valid ``(n, k)``;
    sink ``(h,)`` fp32 or None. Returns out ``(n, h, d_v)``, lse ``(n, h)`` (+inf without a
    valid key) and max_logits ``(n, h)`` (-inf without a valid key).
    """
    n, h, _ = q.shape
    if keys.shape[1] == 0:
        return q.new_zeros(n, h, d_v), q.new_full((n, h), math.inf), q.new_full((n, h), -math.inf)
    # logits = scale * q . k, -inf where invalid: one matmul that adds a 0 / -inf mask.
    mask = torch.zeros_like(valid, dtype=q.dtype).masked_fill_(~valid, -math.inf)
    logits = torch.baddbmm(mask[:, None, :], q, keys.transpose(1, 2), alpha=scale)  # (n, h, k)
    max_logits = logits.amax(dim=-1)
    # lse = log sum exp(logits), shifted by the row max; a row without a valid key (max -inf)
    # shifts by 0 and gets lse = -inf.
    shift = torch.where(max_logits == -math.inf, 0.0, max_logits)
    weights = logits.sub_(shift[..., None]).exp_()  # exp(logits - shift), 0 where invalid
    lse = weights.sum(dim=-1).log_().add_(shift)
    # The sink is one more logit in the denominator only: out *= e^lse / (e^lse + e^sink).
    lse_for_out = lse if sink is None else torch.logaddexp(lse, sink)
    # A row without a valid key (or with a sink of +inf) gets out = 0.
    lse_for_out = torch.where(lse_for_out == -math.inf, math.inf, lse_for_out)
    out = torch.bmm(weights, keys[..., :d_v]).mul_(torch.exp(shift - lse_for_out)[..., None])
    return out, torch.where(lse == -math.inf, math.inf, lse), max_logits


def sparse_mla_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    indices: torch.Tensor,
    softmax_scale: float,
    *,
    d_v: int = 512,
    topk_length: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    extra_k_cache: torch.Tensor | None = None,
    extra_indices: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
    scale_rounding: str | None = None,
    block_bytes: int | None = None,
    layout: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse decode over an FP8 KV cache (FlashMLA ``flash_mla_with_kvcache`` sparse mode).

    Args:
        q: ``(b, s_q, h, d_qk)``, any float dtype, any strides.
        k_cache: FP8 cache of bytes (uint8 or another 1-byte dtype)
            ``(num_pages, page_size, 1, 656)`` (V3.2, d_qk 576) or
            ``(num_pages, page_size, 1, 584)`` (V4, d_qk 512).
        indices: ``(b, s_q, topk)`` global slots ``page * page_size + offset``; -1 = invalid.
        softmax_scale: multiplies ``q . k``.
        d_v: V is the first ``d_v`` dims of K.
        topk_length: ``(b,)``; request r uses only the first ``topk_length[r]`` indices.
        attn_sink: ``(h,)`` fp32 per-head sink logit.
        extra_k_cache, extra_indices ``(b, s_q, extra_topk)``, extra_topk_length ``(b,)``:
            a second cache of the same layout joined into the same softmax.
        scale_rounding: passed to ``gather_tokens`` (how the kernel reads V3.2 scales).
        block_bytes: working-set budget of one query block (default by device).
        layout: the caches' layout name (reference.layout_table); None: the one layout of
            the cache's width.

    Returns:
        ``out`` fp32 ``(b, s_q, h, d_v)`` and ``lse`` fp32 ``(b, h, s_q)``.
    """
    if q.dim() != 4:
        raise ValueError(f"q must be (b, s_q, h, d_qk), got {tuple(q.shape)}")
    b, s_q, h, d_qk = q.shape
    _check_cache(k_cache, d_qk, "k_cache", layout)
    _check_d_v(d_v, d_qk)
    parts = [_DecodePart(k_cache, indices, topk_length, b, s_q, "indices")]
    if (extra_k_cache is None) != (extra_indices is None):
        raise ValueError("extra_k_cache and extra_indices must be given together")
    if extra_topk_length is not None and extra_k_cache is None:
        raise ValueError("extra_topk_length needs extra_k_cache and extra_indices")
    if extra_k_cache is not None:
        _check_cache(extra_k_cache, d_qk, "extra_k_cache", layout)
        parts.append(
            _DecodePart(extra_k_cache, extra_indices, extra_topk_length, b, s_q, "extra_indices")
        )
    sink = _check_sink(attn_sink, h, q.device)

    num_tokens = b * s_q
    width = sum(p.width for p in parts)
    budget = _budget(block_bytes, q.device)
    # A quarter of the budget for the cache reader's temporaries (raw bytes and about three
    # fp32 copies of the rows: under 16 bytes a value), the rest for the block, whose table of
    # distinct tokens is at worst as large as its keys.
    chunk = max(256, budget // 4 // (16 * d_qk))
    per_query = _bytes_per_query(width, h, d_qk, d_v, staged_bytes_per_key=4 * d_qk)
    step = _block_step(num_tokens, per_query, budget * 3 // 4)
    out = torch.empty(num_tokens, h, d_v, dtype=torch.float32, device=q.device)
    lse = torch.empty(num_tokens, h, dtype=torch.float32, device=q.device)

    with _exact_fp32(q.device), torch.no_grad():
        # Reused by every block: fresh large allocations cost page faults on a CPU.
        keys_buf = torch.empty(step * width * d_qk, dtype=torch.float32, device=q.device)
        for start in range(0, num_tokens, step):
            stop = min(start + step, num_tokens)
            tokens = torch.arange(start, stop, device=q.device)
            slots = [part.block_slots(start, stop, q.device) for part in parts]
            readers = [_token_reader(part.cache, scale_rounding, layout) for part in parts]
            keys = keys_buf[: (stop - start) * width * d_qk].view(stop - start, width, d_qk)
            _gather_distinct(readers, slots, chunk, keys)
            valid = torch.cat(slots, dim=1) >= 0
            q_blk = q[tokens // s_q, tokens % s_q].float()
            out[start:stop], lse[start:stop], _ = attend(
                q_blk, keys, valid, softmax_scale, d_v, sink
            )

    out = out.view(b, s_q, h, d_v)
    lse = lse.view(b, s_q, h).transpose(1, 2).contiguous()
    return out, lse


def sparse_mla_prefill(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    *,
    d_v: int = 512,
    attn_sink: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
    block_bytes: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sparse prefill over a flat KV (FlashMLA ``flash_mla_sparse_fwd``).

    Args:
        q: ``(s_q, h, d_qk)``, any float dtype, any strides.
        kv: ``(s_kv, 1, d_qk)`` (or ``(s_kv, d_qk)``), bf16 or another float dtype.
        indices: ``(s_q, 1, topk)`` or ``(s_q, topk)``; invalid if ``< 0`` or ``>= s_kv``.
        sm_scale: multiplies ``q . k``.
        d_v: V is the first ``d_v`` dims of K.
        attn_sink: ``(h,)`` fp32 per-head sink logit (affects ``out`` only).
        topk_length: ``(s_q,)``; query i uses only its first ``topk_length[i]`` indices.
        block_bytes: working-set budget of one query block (default by device).

    Returns:
        ``out`` fp32 ``(s_q, h, d_v)``, ``max_logits`` fp32 ``(s_q, h)`` (max of the scaled
        logits, -inf without a valid key) and ``lse`` fp32 ``(s_q, h)`` (natural log, +inf
        without a valid key).
    """
    if q.dim() != 3:
        raise ValueError(f"q must be (s_q, h, d_qk), got {tuple(q.shape)}")
    s_q, h, d_qk = q.shape
    if kv.dim() == 3:
        if kv.shape[1] != 1:
            raise ValueError(f"kv must have one KV head, got shape {tuple(kv.shape)}")
        kv = kv[:, 0]
    if kv.dim() != 2 or kv.shape[1] != d_qk:
        raise ValueError(f"kv must be (s_kv, 1, {d_qk}) to match q, got {tuple(kv.shape)}")
    if indices.dim() == 3:
        if indices.shape[1] != 1:
            raise ValueError(f"indices must be (s_q, 1, topk), got {tuple(indices.shape)}")
        indices = indices[:, 0]
    if indices.dim() != 2 or indices.shape[0] != s_q:
        raise ValueError(f"indices must be ({s_q}, 1, topk), got {tuple(indices.shape)}")
    _check_d_v(d_v, d_qk)
    lengths = _check_lengths(topk_length, s_q, "topk_length (s_q,)", q.device)
    sink = _check_sink(attn_sink, h, q.device)
    s_kv, topk = kv.shape[0], indices.shape[1]
    kv = kv.to(q.device)

    budget = _budget(block_bytes, q.device)
    # kv in fp32 once, behind a zero row that invalid entries read, when that fits in half
    # the budget: then a block's keys are one gather. Otherwise each block converts its rows.
    table_bytes = (s_kv + 1) * d_qk * 4
    whole_table = table_bytes <= budget // 2
    staged = 0 if whole_table else kv.element_size() * d_qk
    per_query = _bytes_per_query(topk, h, d_qk, d_v, staged_bytes_per_key=staged)
    step = _block_step(s_q, per_query, budget - table_bytes if whole_table else budget)
    out = torch.empty(s_q, h, d_v, dtype=torch.float32, device=q.device)
    max_logits = torch.empty(s_q, h, dtype=torch.float32, device=q.device)
    lse = torch.empty(s_q, h, dtype=torch.float32, device=q.device)

    with _exact_fp32(q.device), torch.no_grad():
        if whole_table:
            table = torch.empty(s_kv + 1, d_qk, dtype=torch.float32, device=q.device)
            table[0] = 0.0
            table[1:] = kv
        else:
            raw_buf = torch.empty(step * topk, d_qk, dtype=kv.dtype, device=q.device)
        keys_buf = torch.empty(step * topk * d_qk, dtype=torch.float32, device=q.device)
        for start in range(0, s_q, step):
            stop = min(start + step, s_q)
            slots = indices[start:stop].to(q.device, torch.long)
            valid = (slots >= 0) & (slots < s_kv)
            if lengths is not None:
                valid &= torch.arange(topk, device=q.device) < lengths[start:stop, None]
            slots = torch.where(valid, slots, -1)
            n = (stop - start) * topk
            keys = keys_buf[: n * d_qk].view(stop - start, topk, d_qk)
            if whole_table:
                torch.index_select(table, 0, slots.flatten() + 1, out=keys.view(n, d_qk))
            else:
                raw = torch.index_select(kv, 0, slots.flatten().clamp_min(0), out=raw_buf[:n])
                keys.view(n, d_qk).copy_(raw)
                invalid = (~valid).flatten().nonzero().squeeze(1)
                keys.view(n, d_qk).index_fill_(0, invalid, 0.0)  # writes only those rows
            q_blk = q[start:stop].float()
            out[start:stop], lse[start:stop], max_logits[start:stop] = attend(
                q_blk, keys, valid, sm_scale, d_v, sink
            )
    return out, max_logits, lse


class _DecodePart:
    """One KV set of a decode call (the main cache or the extra cache) and its indices."""

    def __init__(
        self,
        cache: torch.Tensor,
        indices: torch.Tensor,
        lengths: torch.Tensor | None,
        b: int,
        s_q: int,
        name: str,
    ) -> None:
        if indices.dim() != 3 or indices.shape[:2] != (b, s_q):
            raise ValueError(f"{name} must be ({b}, {s_q}, topk), got {tuple(indices.shape)}")
        self.cache = cache
        self.width = indices.shape[2]
        self.indices = indices.reshape(b * s_q, self.width)  # one row per query token
        self.s_q = s_q
        self.num_slots = cache.shape[0] * cache.shape[1]
        self.lengths = _check_lengths(lengths, b, f"length of {name} (b,)", indices.device)
        self.name = name

    def block_slots(self, start: int, stop: int, device: torch.device) -> torch.Tensor:
        """Slots ``(n, width)`` of query tokens [start, stop), -1 wherever the query uses none."""
        slots = self.indices[start:stop].to(device, torch.long)
        valid = slots != -1
        if self.lengths is not None:
            req = torch.arange(start, stop, device=device) // self.s_q
            valid &= torch.arange(self.width, device=device) < self.lengths.to(device)[req, None]
        bad = valid & ((slots < 0) | (slots >= self.num_slots))
        if bool(bad.any()):
            raise ValueError(
                f"{self.name} holds slot {int(slots[bad][0])}, outside the cache's "
                f"{self.num_slots} slots (only -1 marks an invalid index)"
            )
        return torch.where(valid, slots, -1)


def _token_reader(
    cache: torch.Tensor, scale_rounding: str | None, layout: str | None
) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda slots: gather_tokens(cache, slots, scale_rounding=scale_rounding, layout=layout)


def _gather_distinct(
    readers: list[Callable[[torch.Tensor], torch.Tensor]],
    slots: list[torch.Tensor],
    chunk: int,
    keys: torch.Tensor,
) -> None:
    """Fill keys ``(n, sum of widths, d)`` with the rows ``readers[i]`` gives for ``slots[i]``
    ``(n, width_i)``, side by side, and zeros where a slot is -1. Each distinct slot is read
    once (in pieces of ``chunk`` rows) into a table, and the table copied to every query."""
    distinct, where, rows = [], [], 0
    for part_slots in slots:
        used, inverse = torch.unique(part_slots, return_inverse=True)  # sorted: -1 first
        distinct.append(used)
        where.append(inverse + rows)
        rows += used.numel()
    table = torch.empty(rows, keys.shape[-1], dtype=torch.float32, device=keys.device)
    row = 0
    for read, used in zip(readers, distinct, strict=True):
        first = int(used[:1].lt(0).sum())  # the zero row that -1 maps to, if any
        table[row : row + first] = 0.0
        for c in range(first, used.numel(), chunk):
            piece = used[c : c + chunk]
            table[row + c : row + c + piece.numel()] = read(piece)
        row += used.numel()
    index = torch.cat(where, dim=1).flatten()
    torch.index_select(table, 0, index, out=keys.view(-1, keys.shape[-1]))


def _check_cache(cache: torch.Tensor, d_qk: int, name: str, layout: str | None) -> None:
    if cache.element_size() != 1 or cache.dim() != 4:
        raise ValueError(
            f"{name} must be a 1-byte FP8 cache (pages, page_size, 1, token bytes), "
            f"got {cache.dtype} {tuple(cache.shape)}"
        )
    entry = of_cache(cache, layout)
    if entry.d_qk != d_qk:
        raise ValueError(
            f"{name} with {cache.shape[-1]} B/token holds d_qk {entry.d_qk}, but q has d_qk {d_qk}"
        )


def _check_d_v(d_v: int, d_qk: int) -> None:
    if not 0 < d_v <= d_qk:
        raise ValueError(f"d_v must lie in [1, d_qk={d_qk}], got {d_v}")


def _check_lengths(
    lengths: torch.Tensor | None, n: int, what: str, device: torch.device
) -> torch.Tensor | None:
    if lengths is None:
        return None
    if lengths.dim() != 1 or lengths.shape[0] != n:
        raise ValueError(f"{what} must have {n} entries, got {tuple(lengths.shape)}")
    return lengths.to(device, torch.long)


def _check_sink(sink: torch.Tensor | None, h: int, device: torch.device) -> torch.Tensor | None:
    if sink is None:
        return None
    if sink.shape != (h,):
        raise ValueError(f"attn_sink must be ({h},) (one per head), got {tuple(sink.shape)}")
    return sink.to(device, torch.float32)


def _budget(block_bytes: int | None, device: torch.device) -> int:
    if block_bytes is not None:
        return block_bytes
    return CUDA_BLOCK_BYTES if device.type == "cuda" else BLOCK_BYTES


def _bytes_per_query(width: int, h: int, d_qk: int, d_v: int, staged_bytes_per_key: int) -> int:
    """Working set of one query: its fp32 keys and their staging (table rows, raw rows), its
    logits, index temporaries, q and out (the block's and its copy)."""
    return width * (4 * d_qk + staged_bytes_per_key + 4 * h + 48) + 4 * h * (d_qk + 2 * d_v)


def _block_step(num_tokens: int, per_query_bytes: int, budget: int) -> int:
    """Query tokens per block: as many as fit in the budget, at least 1."""
    return max(1, min(num_tokens, budget // max(1, per_query_bytes)))


@contextlib.contextmanager
def _exact_fp32(device: torch.device) -> Iterator[None]:
    """Switch TF32 off for CUDA matmuls while the oracle runs (restored afterwards)."""
    if device.type != "cuda":
        yield
        return
    matmul = torch.backends.cuda.matmul
    saved = matmul.fp32_precision
    matmul.fp32_precision = "ieee"
    try:
        yield
    finally:
        matmul.fp32_precision = saved
