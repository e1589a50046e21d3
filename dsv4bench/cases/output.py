"""What a kernel returns, in the oracle's shapes: the one answer every backend and the oracle
give, so the judge compares like with like."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Output:
    """What a kernel returns, in the oracle's shapes: out (..., num_heads, d_v) and lse.

    decode: out (b, s_q, h, d_v), lse (b, h, s_q); prefill: out (tokens, h, d_v), lse (tokens, h);
    dequant: out (tokens, d) and lse None; remap: out the global index tensor and lse None;
    indexer: out the fp32 logits (rows, keys), topk the (rows, topk) int32 picks (-1 padded).
    topk: out the (rows, topk) int32 picks in the case's form (reference/topk.py), -1 padded.
    max_logits: the sparse prefill kernel's (tokens, h) largest scaled logit (-inf without a
    valid key); engines read it beside the lse, so it is judged too (None: the kernel has none).
    """

    out: Any
    lse: Any = None
    topk: Any = None
    max_logits: Any = None


def prefill_output(out, lse) -> Output:
    """A prefill chunk run through the decode kernel (either decode route), back in prefill
    shapes: out (b, s_q, h, d_v) -> (tokens, h, d_v), lse (b, h, s_q) -> (tokens, h), where
    b * s_q = tokens ((T, 1) or (1, T): Case.decode_shape)."""
    b, s_q, h, d_v = out.shape
    return Output(out.reshape(b * s_q, h, d_v), lse.transpose(1, 2).reshape(b * s_q, h))
