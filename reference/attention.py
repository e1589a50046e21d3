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

All math is fp32 (TF32 is switched off for the duration of a call on CUDA). Queries are
processed in blocks whose working set stays near ``block_bytes``, so peak extra memory does
not grow with the number of tokens; only the used cache tokens are dequantized.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch

from reference.layout_table import LAYOUTS
from reference.layouts import gather_tokens

BLOCK_BYTES = 128 * 2**20
"""Default working-set budget of one query block (bytes)."""

GATHER_CHUNK = 4096
"""Cache tokens dequantized per gather_tokens call (keeps its temporaries small)."""

_CACHE_D_QK = {lay.token_bytes: lay.d_qk for lay in LAYOUTS.values() if lay.fp8}


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
    block_bytes: int = BLOCK_BYTES,
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
        block_bytes: working-set budget of one query block.

    Returns:
        ``out`` fp32 ``(b, s_q, h, d_v)`` and ``lse`` fp32 ``(b, h, s_q)``.
    """
    if q.dim() != 4:
        raise ValueError(f"q must be (b, s_q, h, d_qk), got {tuple(q.shape)}")
    b, s_q, h, d_qk = q.shape
    _check_cache(k_cache, d_qk, "k_cache")
    _check_d_v(d_v, d_qk)
    parts = [_DecodePart(k_cache, indices, topk_length, b, s_q, "indices")]
    if (extra_k_cache is None) != (extra_indices is None):
        raise ValueError("extra_k_cache and extra_indices must be given together")
    if extra_topk_length is not None and extra_k_cache is None:
        raise ValueError("extra_topk_length needs extra_k_cache and extra_indices")
    if extra_k_cache is not None:
        _check_cache(extra_k_cache, d_qk, "extra_k_cache")
        parts.append(
            _DecodePart(extra_k_cache, extra_indices, extra_topk_length, b, s_q, "extra_indices")
        )
    sink = _check_sink(attn_sink, h, q.device)

    num_tokens = b * s_q
    width = sum(p.width for p in parts)
    per_token = width * (4 * d_qk + 4 * h + 48) + 4 * h * (d_qk + d_v)
    step = _block_step(num_tokens, per_token, block_bytes)
    out = torch.empty(num_tokens, h, d_v, dtype=torch.float32, device=q.device)
    lse = torch.empty(num_tokens, h, dtype=torch.float32, device=q.device)

    with _exact_fp32(q.device), torch.no_grad():
        # Buffers reused by every block: fresh large allocations cost page faults on a CPU.
        keys_buf = torch.empty(step, width, d_qk, dtype=torch.float32, device=q.device)
        logits_buf = torch.empty(step, h, width, dtype=torch.float32, device=q.device)
        for start in range(0, num_tokens, step):
            stop = min(start + step, num_tokens)
            tokens = torch.arange(start, stop, device=q.device)
            keys, logits = keys_buf[: stop - start], logits_buf[: stop - start]
            keys.zero_()
            valid = torch.empty(stop - start, width, dtype=torch.bool, device=q.device)
            col = 0
            for part in parts:
                ok = part.gather(tokens, s_q, keys[:, col : col + part.width], scale_rounding)
                valid[:, col : col + part.width] = ok
                col += part.width
            q_blk = q[tokens // s_q, tokens % s_q].float()
            lse[start:stop], _ = _attend(
                q_blk, keys, valid, softmax_scale, d_v, sink, logits, out[start:stop]
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
    block_bytes: int = BLOCK_BYTES,
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
        block_bytes: working-set budget of one query block.

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

    per_token = topk * ((4 + kv.element_size()) * d_qk + 4 * h + 24) + 4 * h * (d_qk + d_v)
    step = _block_step(s_q, per_token, block_bytes)
    out = torch.empty(s_q, h, d_v, dtype=torch.float32, device=q.device)
    max_logits = torch.empty(s_q, h, dtype=torch.float32, device=q.device)
    lse = torch.empty(s_q, h, dtype=torch.float32, device=q.device)

    with _exact_fp32(q.device), torch.no_grad():
        # Buffers reused by every block: fresh large allocations cost page faults on a CPU.
        raw_buf = torch.empty(step * topk, d_qk, dtype=kv.dtype, device=q.device)
        keys_buf = torch.empty(step, topk, d_qk, dtype=torch.float32, device=q.device)
        logits_buf = torch.empty(step, h, topk, dtype=torch.float32, device=q.device)
        q_buf = torch.empty(step, h, d_qk, dtype=torch.float32, device=q.device)
        for start in range(0, s_q, step):
            n = min(step, s_q - start)
            idx = indices[start : start + n].to(q.device, torch.long)
            valid = (idx >= 0) & (idx < s_kv)
            if lengths is not None:
                valid &= torch.arange(topk, device=q.device) < lengths[start : start + n, None]
            raw = torch.index_select(
                kv, 0, torch.where(valid, idx, 0).flatten(), out=raw_buf[: n * topk]
            )
            keys = keys_buf[:n]
            keys.view(n * topk, d_qk).copy_(raw)
            keys.masked_fill_(~valid[..., None], 0.0)
            q_blk = q_buf[:n].copy_(q[start : start + n])
            lse[start : start + n], max_logits[start : start + n] = _attend(
                q_blk, keys, valid, sm_scale, d_v, sink, logits_buf[:n], out[start : start + n]
            )
    return out, max_logits, lse


def _attend(
    q: torch.Tensor,
    keys: torch.Tensor,
    valid: torch.Tensor,
    scale: float,
    d_v: int,
    sink: torch.Tensor | None,
    logits: torch.Tensor,
    out: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One block: q ``(n, h, d)``, keys ``(n, k, d)`` (zero where invalid), valid ``(n, k)``.

    Writes ``out (n, h, d_v)`` and uses ``logits (n, h, k)`` as scratch. Returns lse
    ``(n, h)`` (+inf if no valid key) and max_logits ``(n, h)`` (-inf if no valid key).
    """
    n, h, _ = q.shape
    if keys.shape[1] == 0:
        out.zero_()
        return q.new_full((n, h), math.inf), q.new_full((n, h), -math.inf)
    torch.bmm(q, keys.transpose(1, 2), out=logits)
    logits.mul_(scale)
    logits.masked_fill_(~valid[:, None, :], -math.inf)
    max_logits = logits.amax(dim=-1)
    # Softmax shifted by the row max; an empty row (max -inf) shifts by 0 to avoid -inf + inf.
    shift = torch.where(max_logits == -math.inf, 0.0, max_logits)
    weights = logits.sub_(shift[..., None]).exp_()
    lse = weights.sum(dim=-1).log_().add_(shift)
    # The sink is one more logit in the denominator only: out *= e^lse / (e^lse + e^s).
    lse_for_out = lse if sink is None else torch.logaddexp(lse, sink)
    # An empty row (lse = -inf) gives out 0, as does a sink of +inf.
    lse_for_out = torch.where(lse_for_out == -math.inf, math.inf, lse_for_out)
    torch.bmm(weights, keys[..., :d_v], out=out)
    out.mul_(torch.exp(shift - lse_for_out)[..., None])
    lse = torch.where(lse == -math.inf, math.inf, lse)
    return lse, max_logits


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
        self.indices = indices
        self.width = indices.shape[2]
        self.num_slots = cache.shape[0] * cache.shape[1]
        self.lengths = _check_lengths(lengths, b, f"length of {name} (b,)", indices.device)
        self.name = name

    def gather(
        self, tokens: torch.Tensor, s_q: int, keys: torch.Tensor, scale_rounding: str | None
    ) -> torch.Tensor:
        """Dequantize the used keys of the flat query tokens into ``keys (n, width, d)``
        (left untouched where invalid) and return their validity ``(n, width)``."""
        device = tokens.device
        req = tokens // s_q
        slots = self.indices[req.to(self.indices.device), tokens.to(self.indices.device) % s_q]
        slots = slots.to(device, torch.long)
        valid = slots != -1
        if self.lengths is not None:
            valid &= torch.arange(self.width, device=device) < self.lengths.to(device)[req][:, None]
        bad = valid & ((slots < 0) | (slots >= self.num_slots))
        if bool(bad.any()):
            raise ValueError(
                f"{self.name} holds slot {int(slots[bad][0])}, outside the cache's "
                f"{self.num_slots} slots (only -1 marks an invalid index)"
            )
        rows, cols = valid.nonzero(as_tuple=True)
        for c in range(0, rows.numel(), GATHER_CHUNK):
            r, k = rows[c : c + GATHER_CHUNK], cols[c : c + GATHER_CHUNK]
            tokens_kv = gather_tokens(self.cache, slots[r, k], scale_rounding=scale_rounding)
            keys[r, k] = tokens_kv.to(device)
        return valid


def _check_cache(cache: torch.Tensor, d_qk: int, name: str) -> None:
    if cache.element_size() != 1 or cache.dim() != 4 or cache.shape[-1] not in _CACHE_D_QK:
        raise ValueError(
            f"{name} must be a 1-byte FP8 cache (pages, page_size, 1, 656 or 584), "
            f"got {cache.dtype} {tuple(cache.shape)}"
        )
    if _CACHE_D_QK[cache.shape[-1]] != d_qk:
        raise ValueError(
            f"{name} with {cache.shape[-1]} B/token holds d_qk {_CACHE_D_QK[cache.shape[-1]]}, "
            f"but q has d_qk {d_qk}"
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


def _block_step(num_tokens: int, per_token_bytes: int, block_bytes: int) -> int:
    """Query tokens per block: as many as fit in block_bytes, at least 1."""
    return max(1, min(num_tokens, block_bytes // max(1, per_token_bytes)))


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
