"""Determinism and batch invariance of a kernel, as accuracy fields of its row.

determinism: the same prepared call run twice on the same inputs (outputs poisoned in
between): bitwise equal or not, and the largest difference.
batch invariance: a few requests of the batch (first, middle, last) run alone, each as a case
of batch 1 prepared by the backend itself, against the same request inside the full batch:
largest difference in bf16 ULPs, and how many (query, head) rows change the argmax over their
output. A request is a batch entry of a decode case (and of a prefill chunk on the
decode-kernel route, where every token is a request), and one query token of a sparse-prefill
or decode-mixed chunk (there the chunk is one request of s_q = tokens: a token is sliced along
s_q). Caches and sinks are shared; every per-request tensor is sliced.
"""

from __future__ import annotations

import dataclasses

import torch

PER_REQUEST = ("q", "indices", "extra_indices", "topk_length", "extra_topk_length")
PER_QUERY = ("q", "indices", "extra_indices")  # (b, s_q, ...): what a decode-mixed token owns


def bf16_ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a - b| in units in the last place of bf16 at the larger magnitude of the two,
    elementwise (0 where both are 0). Counting representable values between them instead would
    make two tiny values of opposite sign thousands of ULPs apart."""
    a32, b32 = a.to(torch.bfloat16).float(), b.to(torch.bfloat16).float()
    big = torch.maximum(a32.abs(), b32.abs())
    tiny = torch.finfo(torch.bfloat16).tiny
    ulp = torch.exp2(torch.floor(torch.log2(big.clamp_min(tiny))) - 7)
    return ((a32 - b32).abs() / ulp).round()


def compare_runs(first, second) -> dict:
    """bitwise equality and the largest differences between two Outputs of one call."""
    out_a, out_b = first.out, second.out
    equal = _bitwise_equal(out_a, out_b) and _bitwise_equal(first.lse, second.lse)
    return {
        "bitwise_equal": equal,
        "max_abs": _max_abs(out_a, out_b),
        "max_ulps": _max_ulps(out_a, out_b),
    }


def determinism(prepared) -> dict:
    """Run `prepared` twice more and compare the two outputs."""
    runs = []
    for _ in range(2):
        if prepared.poison is not None:
            prepared.poison()
        out = prepared.finish(prepared.run())
        # a kernel writing into preallocated outputs returns the same buffers every run
        runs.append(type(out)(out.out.clone(), None if out.lse is None else out.lse.clone()))
    return compare_runs(*runs)


def sample_requests(n: int, most: int = 3) -> list[int]:
    return sorted({0, n // 2, n - 1})[:most] if n > 1 else []


def single_request(case, inputs: dict, r: int):
    """(case, inputs) of request r alone."""
    if case.op == "prefill" and case.route == "decode-mixed":
        x = {k: (v[:, r : r + 1] if k in PER_QUERY else v) for k, v in inputs.items()}
        return dataclasses.replace(case, tokens=1), x
    x = {k: (v[r : r + 1] if k in PER_REQUEST and v is not None else v) for k, v in inputs.items()}
    if case.op == "prefill":
        return dataclasses.replace(case, tokens=1), x
    lens = case.context_lens[r : r + 1]  # a ragged batch: the request's own context
    return dataclasses.replace(case, batch_size=1, context_lens=lens), x


def batch_invariance(backend, case, inputs: dict, batched, device: str) -> dict | None:
    """Requests run alone vs inside the batch; None when the batch holds a single request."""
    n = case.tokens if case.op == "prefill" else inputs["q"].shape[0]
    picked = sample_requests(n)
    if not picked:
        return None
    worst_ulps: int | None = 0
    worst_abs, argmax_changed, rows = 0.0, 0, 0
    for r in picked:
        sub_case, sub_inputs = single_request(case, inputs, r)
        prepared = backend.prepare(sub_case, sub_inputs, device)
        if prepared.poison is not None:
            prepared.poison()
        alone = prepared.finish(prepared.run()).out[0]
        inside = batched.out[r]
        ulps = _max_ulps(alone, inside)
        worst_ulps = None if ulps is None or worst_ulps is None else max(worst_ulps, ulps)
        worst_abs = max(worst_abs, _max_abs(alone, inside))
        a, b = alone.float().flatten(0, -2), inside.float().flatten(0, -2)
        argmax_changed += int((a.argmax(-1) != b.argmax(-1)).sum())
        rows += a.shape[0]
    return {
        "requests": picked,
        "max_ulps": worst_ulps,
        "max_abs": worst_abs,
        "argmax_changed": argmax_changed,
        "rows": rows,
    }


def _bitwise_equal(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and torch.equal(_bits(a), _bits(b))


def _bits(x: torch.Tensor) -> torch.Tensor:
    by_size = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return x.contiguous().view(by_size[x.element_size()])


def _max_abs(a, b) -> float:
    d = (a.float() - b.float()).abs()
    d = torch.where(torch.isnan(d), torch.full_like(d, float("inf")), d)
    return float(d.max()) if d.numel() else 0.0


def _max_ulps(a, b) -> int | None:
    """None when either side holds a NaN (no distance in ULPs)."""
    if bool((torch.isnan(a.float()) | torch.isnan(b.float())).any()):
        return None
    u = bf16_ulps(a, b)
    return int(u.max()) if u.numel() else 0
