"""Sparse MLA prefill over FP8 (e4m3) q and kv, as sglang's SM90 "Q8KV8" kernel computes it
(sglang 0.5.23, sglang/kernels/jit/csrc/sparse_mla_q8kv8_prefill_sm90/kernel.cuh): the oracle
of what that kernel claims, beside attention.py's oracle of what the model means.

The kernel multiplies e4m3 q by e4m3 kv (fp32 accumulate), scales the logits by
q_scale * kv_scale * sm_scale (in log2 units), and runs an online softmax over each query's
index list in blocks of P_BLOCK (B_TOPK = 64) entries, in list order. Block j's probabilities
are taken against the running max after that block, m_j = max(m_{j-1}, max of block j)
(online_softmax_and_rescale_o; the two warpgroups' max exchange gives the same sequence),
rounded to e4m3 (flash::convert_type_out: round to nearest even, below 2^-10 to 0) and
multiplied by the e4m3 V (the first d_v columns of kv) in fp32; earlier sums are rescaled by
exp(m_{j-1} - m_j). The denominator L sums the probabilities before rounding. At the end
(store_O) out = kv_scale * acc / (L + exp(sink - m)), rounded to bf16 by the kernel.

The rescaling is exact in real arithmetic, so entry t of block j weighs
    e4m3(exp(s_t - m_j)) * exp(m_j - m_final),   m_j = cumulative max of the block maxima,
which `sparse_mla_prefill_fp8` computes for all blocks at once. (The kernel floors one
cross-warpgroup rescale at 2^-30; weights that small vanish against the fp8 rounding.)

Validity (the kernel's producer): with topk_length, an index is valid when 0 <= idx < s_kv
and its position < topk_length; without it, when idx >= 0 (a -1 is loaded from a zero pad
row at s_kv - topk + position and masked; any other index must be < s_kv).
lse is natural-log: log(L) + m_final (the kernel's logf(rL) + rM * ln 2); max_logits m_final;
a query without a valid key gets out 0, lse +inf, max_logits -inf.
"""

from __future__ import annotations

import math

import torch

from reference.layouts import E4M3_MAX

E4M3 = torch.float8_e4m3fn
P_BLOCK = 64  # B_TOPK: the top-k entries of one online-softmax step
LOG2E = 1.0 / math.log(2.0)
BLOCK_BYTES = 256 * 2**20


def to_e4m3(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """x / scale as e4m3, round to nearest even, saturated at +-448 (the satfinite casts of
    sglang's Triton gathers; torch's own cast saturates too)."""
    y = x.float() if scale == 1.0 else x.float() / scale
    return y.clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)


def sparse_mla_prefill_fp8(
    q8: torch.Tensor,
    kv8: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    *,
    q_scale: float = 1.0,
    kv_scale: float = 1.0,
    d_v: int = 512,
    attn_sink: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
    round_p: bool = True,
    block_bytes: int = BLOCK_BYTES,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The Q8KV8 kernel's answer.

    q8 ``(s_q, h, d)`` and kv8 ``(s_kv, 1, d)`` e4m3; indices ``(s_q, 1, topk)`` int;
    attn_sink ``(h,)`` fp32; topk_length ``(s_q,)``. ``round_p`` False keeps P in fp32 (the
    plain softmax over the same FP8 q and kv). Returns out fp32 ``(s_q, h, d_v)``,
    max_logits and lse fp32 ``(s_q, h)``.
    """
    if q8.dim() != 3 or kv8.dim() != 3 or indices.dim() != 3:
        raise ValueError("q8 (s_q, h, d), kv8 (s_kv, 1, d) and indices (s_q, 1, topk) expected")
    s_q, h, _ = q8.shape
    per_query = indices.shape[-1] * (h * 4 * 6 + q8.shape[-1] * 4)
    rows = max(1, block_bytes // max(1, per_query))
    out = torch.empty(s_q, h, d_v, device=q8.device)
    max_logits = torch.empty(s_q, h, device=q8.device)
    lse = torch.empty(s_q, h, device=q8.device)
    scale2 = q_scale * kv_scale * sm_scale * LOG2E
    for a in range(0, s_q, rows):
        b = min(s_q, a + rows)
        length = None if topk_length is None else topk_length[a:b]
        got = _block(q8[a:b], kv8, indices[a:b, 0], scale2, kv_scale, d_v, attn_sink, length,
                     round_p)  # fmt: skip
        out[a:b], max_logits[a:b], lse[a:b] = got
    return out, max_logits, lse


def _valid(idx: torch.Tensor, s_kv: int, topk_length: torch.Tensor | None) -> torch.Tensor:
    if topk_length is None:
        return idx >= 0
    position = torch.arange(idx.shape[-1], device=idx.device)
    return (idx >= 0) & (idx < s_kv) & (position < topk_length[:, None].to(idx.device))


def _block(q8, kv8, idx, scale2, kv_scale, d_v, sink, topk_length, round_p):
    n, h, _ = q8.shape
    s_kv, k = kv8.shape[0], idx.shape[-1]
    valid = _valid(idx.long(), s_kv, topk_length)
    keys = kv8[idx.long().clamp(0, s_kv - 1), 0].float()  # (n, k, d)
    keys = torch.where(valid[..., None], keys, 0.0)
    logits = torch.bmm(q8.float(), keys.transpose(1, 2)) * scale2  # log2 units
    logits = logits.masked_fill(~valid[:, None, :], -math.inf)
    pad = -k % P_BLOCK
    if pad:
        logits = torch.nn.functional.pad(logits, (0, pad), value=-math.inf)
        keys = torch.nn.functional.pad(keys, (0, 0, 0, pad))
    block_max = logits.unflatten(-1, (-1, P_BLOCK)).amax(-1)  # (n, h, blocks)
    frame = block_max.cummax(-1).values
    final = frame[..., -1]
    frame = torch.where(frame == -math.inf, 0.0, frame).repeat_interleave(P_BLOCK, -1)
    final0 = torch.where(final == -math.inf, 0.0, final)
    p = torch.exp2(logits - frame)  # 0 where invalid
    rescale = torch.exp2(frame - final0[..., None])
    total = (p * rescale).sum(-1)
    if round_p:
        p = p.to(E4M3).float()
    acc = torch.bmm(p * rescale, keys[..., :d_v])
    denom = total if sink is None else total + torch.exp2(sink.float() * LOG2E - final0)
    empty = total == 0
    factor = torch.where(empty, 0.0, kv_scale / torch.where(empty, 1.0, denom))
    out = acc * factor[..., None]
    lse = torch.where(empty, math.inf, torch.log(total) + final0 / LOG2E)
    max_logits = torch.where(empty, -math.inf, final / LOG2E)
    return out, max_logits, lse
