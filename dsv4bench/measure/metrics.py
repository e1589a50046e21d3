"""Accuracy against the oracle, and throughput numbers (FLOP, bytes, fraction of peak).

Accuracy is reduced in float64 over chunks of CHUNK elements, on the device the actual output
lives on (on the CPU when expected and actual live apart), so a 32768x128x512 output never
needs its 8 GiB float64 copy at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from dsv4bench.cases.case import DEFAULT_COS_DIFF_OTHER, Case, Tolerance
from reference.layout_table import LAYOUTS

CHUNK = 1 << 22  # elements per reduction step: 32 MiB per float64 operand

# max_rel divides by max(|expected|, REL_FLOOR * rms(expected)): elements below a tenth of the
# typical magnitude are judged against that tenth, so cancellation near zero reads as the
# absolute error it is rather than as an unbounded ratio.
REL_FLOOR = 0.1

BF16, FP32, INT32 = 2, 4, 4


# ----------------------------------------------------------------------------- accuracy


def accuracy(expected, actual) -> dict:
    """Compare two Outputs (.out, .lse). Non-finite values in `actual` where `expected` is
    finite (or any mismatch of non-finite values) count in `nonfinite` and make cos_diff inf.

    cos_diff = 1 - 2<a,b>/(|a|^2+|b|^2), computed as |a-b|^2/(|a|^2+|b|^2) (the same number,
    without cancellation) over the positions finite in both.
    """
    out = compare_tensors(expected.out, actual.out)
    lse = _compare_side(getattr(expected, "lse", None), getattr(actual, "lse", None))
    found = {
        "cos_diff": out["cos_diff"],
        "max_abs": out["max_abs"],
        "max_rel": out["max_rel"],
        "rel_eps": out["rel_eps"],
        "mismatched": out["mismatched"],
        "nonfinite": out["nonfinite"],
        "lse_max_abs": lse["max_abs"] if lse else None,
        "lse_mismatch": lse["nonfinite"] if lse else 0,
    }
    if str(getattr(expected.out, "dtype", "")) == "torch.uint8":  # cache bytes (cache_write)
        found["bytes_differ"] = out["mismatched"]
        found["bytes_total"] = expected.out.numel()
    # sparse prefill's max_logits, where both sides have one (-inf: no valid key)
    maxl = _compare_side(getattr(expected, "max_logits", None), getattr(actual, "max_logits", None))
    if maxl:
        found["max_logits_max_abs"] = maxl["max_abs"]
        found["max_logits_mismatch"] = maxl["nonfinite"]
    return found


def _compare_side(expected, actual) -> dict | None:
    """An lse or a max_logits; None when either side has none. Where the expected value is not
    finite (a query with no valid key: lse +inf, max_logits -inf) the actual one must be the
    same; any other value there counts as a mismatch."""
    if expected is None or actual is None:
        return None
    return compare_tensors(expected, actual)


def compare_tensors(expected, actual) -> dict:
    """Elementwise comparison in float64: cos_diff, max_abs, max_rel, mismatched, nonfinite."""
    import torch

    if tuple(expected.shape) != tuple(actual.shape):
        raise ValueError(
            f"shape mismatch: expected {tuple(expected.shape)}, actual {tuple(actual.shape)}"
        )
    sq_diff = sq_exp = sq_act = 0.0
    max_abs = 0.0
    nonfinite = mismatched = finite_count = 0
    for e, a in _chunk_pairs(expected, actual):
        both = torch.isfinite(e) & torch.isfinite(a)
        nonfinite += int((~both & (e != a)).sum())
        mismatched += int((e != a).sum())
        e, a = e[both], a[both]
        finite_count += e.numel()
        if not e.numel():
            continue
        d = e - a
        sq_diff += float((d * d).sum())
        sq_exp += float((e * e).sum())
        sq_act += float((a * a).sum())
        max_abs = max(max_abs, float(d.abs().max()))

    rms = math.sqrt(sq_exp / finite_count) if finite_count else 0.0
    eps = max(REL_FLOOR * rms, torch.finfo(torch.float32).tiny)
    max_rel = _max_rel(expected, actual, eps) if max_abs > 0 else 0.0
    denom = sq_exp + sq_act
    cos_diff = sq_diff / denom if denom > 0 else 0.0
    if nonfinite:
        cos_diff = math.inf
    return {
        "cos_diff": cos_diff,
        "max_abs": max_abs,
        "max_rel": max_rel,
        "rel_eps": eps,
        "mismatched": mismatched,
        "nonfinite": nonfinite,
    }


def _max_rel(expected, actual, eps: float) -> float:
    """Second pass: eps depends on the rms of the whole tensor."""
    import torch

    best = 0.0
    for e, a in _chunk_pairs(expected, actual):
        both = torch.isfinite(e) & torch.isfinite(a)
        e, a = e[both], a[both]
        if e.numel():
            rel = (e - a).abs() / e.abs().clamp_min(eps)
            best = max(best, float(rel.max()))
    return best


def _chunk_pairs(expected, actual) -> Iterator[tuple[Any, Any]]:
    """Flat float64 chunks of both tensors on one device."""
    import torch

    device = actual.device if actual.device == expected.device else torch.device("cpu")
    e_flat, a_flat = expected.reshape(-1), actual.reshape(-1)
    for start in range(0, e_flat.numel(), CHUNK):
        stop = start + CHUNK
        yield (
            e_flat[start:stop].to(device=device, dtype=torch.float64),
            a_flat[start:stop].to(device=device, dtype=torch.float64),
        )


def beyond_tolerance(acc: dict, tolerance: Tolerance | dict) -> list[tuple[str, str]]:
    """(what, why) for each accuracy number outside tolerance, the most telling first.

    The one tolerance check: the worker judges rows with it, the report and compare re-read
    them with it (and the row's own tolerance). what: nonfinite, lse_mismatch, cos_diff, lse,
    max_logits_mismatch, max_logits (sparse prefill), then the exact_* ones (beyond_exact)."""
    tol = tolerance if isinstance(tolerance, dict) else asdict(tolerance)
    cos_tol = tol.get("cos_diff")
    cos_tol = DEFAULT_COS_DIFF_OTHER if cos_tol is None else cos_tol
    found = []
    if acc.get("bytes_differ"):
        why = f"{acc['bytes_differ']} of {acc.get('bytes_total', '?')} cache bytes differ"
        found.append(("bytes_differ", why))
    if acc.get("nonfinite"):
        why = f"{acc['nonfinite']} non-finite or mismatched non-finite output values"
        found.append(("nonfinite", why))
    if acc.get("lse_mismatch"):
        why = f"{acc['lse_mismatch']} lse values differ in finiteness (+inf: no key)"
        found.append(("lse_mismatch", why))
    cos = acc.get("cos_diff")
    if isinstance(cos, (int, float)) and not cos <= cos_tol:
        found.append(("cos_diff", f"cos_diff {cos:.3g} > {cos_tol:.3g}"))
    lse = acc.get("lse_max_abs")
    if isinstance(lse, (int, float)) and not lse <= tol["lse_abs"]:
        found.append(("lse", f"lse_max_abs {lse:.3g} > {tol['lse_abs']:.3g}"))
    if acc.get("max_logits_mismatch"):
        why = f"{acc['max_logits_mismatch']} max_logits differ in finiteness (-inf: no key)"
        found.append(("max_logits_mismatch", why))
    # a logit on the lse's scale (lse = max_logits + log of a sum in [1, keys]): lse_abs bounds
    # it unless the row declares its own (Tolerance.max_logits_abs)
    maxl = acc.get("max_logits_max_abs")
    maxl_tol = tol.get("max_logits_abs")
    maxl_tol = tol["lse_abs"] if maxl_tol is None else maxl_tol
    if isinstance(maxl, (int, float)) and not maxl <= maxl_tol:
        found.append(("max_logits", f"max_logits_max_abs {maxl:.3g} > {maxl_tol:.3g}"))
    return found + beyond_exact(acc, tol)


def beyond_exact(acc: dict, tol: dict) -> list[tuple[str, str]]:
    """(what, why) for the answer's distance to the kernel's own model (accuracy `exact_*`)
    past the bounds its backend declared (tolerance `exact_cos_diff`, `exact_lse_abs`); none
    where nothing is declared. A declared bound without its number fails: it went unchecked."""
    cos_bound, lse_bound = tol.get("exact_cos_diff"), tol.get("exact_lse_abs")
    if cos_bound is None and lse_bound is None:
        return []
    found = []
    differ = sum(acc.get(k) or 0 for k in EXACT_FINITENESS)
    if differ:
        found.append(("exact_nonfinite", f"{differ} values differ in finiteness from the "
                      "kernel's own model"))  # fmt: skip
    checks = [("exact_cos_diff", cos_bound)]
    checks += [(k, lse_bound) for k in ("exact_lse_max_abs", "exact_max_logits_max_abs")]
    for key, bound in checks:
        value = acc.get(key)
        if bound is None or (value is None and key != "exact_cos_diff"):
            continue  # an lse or max_logits neither side has
        if value is None:
            found.append((key, f"{key} not measured: the bound {bound:.3g} went unchecked"))
        elif not value <= bound:
            found.append((key, f"{key} {value:.3g} > {bound:.3g} (the kernel's own model)"))
    return found


# accuracy keys counting values whose finiteness differs from the kernel's own model
EXACT_FINITENESS = ("exact_nonfinite", "exact_lse_mismatch", "exact_max_logits_mismatch")


def within_tolerance(acc: dict, tolerance: Tolerance | dict) -> tuple[bool, str]:
    """(True, "") when acc is within tolerance, else (False, the first reason, one line)."""
    found = beyond_tolerance(acc, tolerance)
    return (False, found[0][1]) if found else (True, "")


# ----------------------------------------------------------------------------- throughput


def topk_total(case: Case) -> int:
    """Keys each query attends to: main-cache top-k plus extra-cache top-k."""
    return case.topk + case.extra_topk


def attention_flops(case: Case, heads: int | None = None) -> int:
    """2 * query tokens * heads * keys * (d_qk + d_v): QK^T and PV, FlashMLA's own count.

    `heads` defaults to the useful heads; pass the padded count for the work a kernel does.
    Zero for dequant, remap and page_split.
    """
    if case.op == "indexer":
        from dsv4bench.cases import indexer_case

        return indexer_case.flops(case)
    if case.op not in ("decode", "prefill"):
        return 0
    h = case.num_heads if heads is None else heads
    return 2 * case.query_tokens * h * topk_total(case) * (case.d_qk + case.d_v)


def kv_token_bytes(case: Case) -> int:
    """Bytes per KV token the timed kernel reads. Sparse prefill reads the dequantized bf16
    workspace whatever the cache layout; decode (and prefill through the decode kernel) reads
    the cache itself."""
    if case.op == "prefill" and case.route == "sparse-prefill":
        return BF16 * case.d_qk
    # docs/kernel-facts.md, V3.2 656-byte record and V4 584-byte page layout
    return LAYOUTS[case.layout].bytes_per_token(case.d_qk)


def attention_bytes(case: Case, *, unique: bool = False) -> int:
    """Bytes a kernel must at least move: q (bf16), KV tokens, out (bf16), lse (fp32), indices.

    unique=False: every query reads its own topk_total tokens, with no reuse across queries
    (an upper estimate of the KV traffic a kernel without cross-query reuse makes).
    unique=True: a lower bound, each request reads its distinct tokens once; a request touches
    at least topk (capped by its cache) main and extra_topk (capped) extra tokens.
    """
    if case.op == "dequant":  # each request's tokens read, written bf16 (indexer keys: as is)
        token = LAYOUTS[case.layout].bytes_per_token(case.d_qk)
        written = token if case.layout == "indexer-fp8" else BF16 * case.d_qk
        return sum(case.request_lens) * (token + written)
    if case.op == "page_split":  # every token's bytes read once and written once
        tokens = case.context_len * case.batch_size
        return 2 * tokens * LAYOUTS[case.layout].bytes_per_token(case.d_qk)
    if case.op == "remap":
        return case.query_tokens * topk_total(case) * 2 * INT32
    if case.op == "cache_write":  # each row read in bf16, its record written
        token = LAYOUTS[case.layout].bytes_per_token(case.d_qk)
        return case.query_tokens * (BF16 * case.d_qk + token)
    if case.op == "indexer":
        from dsv4bench.cases import indexer_case

        return indexer_case.bytes_moved(case)
    if case.op == "topk":
        from dsv4bench.cases import topk_case

        return topk_case.bytes_moved(case)
    q = case.query_tokens
    h = case.num_heads
    if unique:
        kv_tokens = _requests(case) * _distinct_keys(case)
    else:
        kv_tokens = q * topk_total(case)
    return (
        q * h * case.d_qk * BF16
        + kv_tokens * kv_token_bytes(case)
        + q * h * case.d_v * BF16
        + q * h * FP32
        + q * topk_total(case) * INT32
    )


def _requests(case: Case) -> int:
    """Requests sharing one KV set: decode batch entries; a prefill chunk is one request."""
    if case.op == "prefill":  # decode-kernel: T requests; decode-mixed, sparse-prefill: one
        return case.decode_shape[0] if case.decode_shape else 1
    return case.batch_size


def _distinct_keys(case: Case) -> int:
    extra_len = case.context_len // case.compress_ratio if case.compress_ratio else case.context_len
    return min(case.topk, case.context_len) + min(case.extra_topk, extra_len)


# ----------------------------------------------------------------------------- the registry


@dataclass
class MetricInput:
    """What a derived metric is computed from; `found` holds the metrics registered before it."""

    case: Case
    ms: float | None  # the median time, None when there is none
    hw: Any  # hardware.GpuSpec (peak_bf16, peak_bw) or None
    padded_heads: int | None
    found: dict = field(default_factory=dict)
    precision: str = "bf16"  # the kernel's tensor-core inputs: its compute roof (bf16, fp8)


@dataclass(frozen=True)
class Metric:
    name: str
    compute: Callable[[MetricInput], Any]
    column: str = ""  # the report's kernel-table column; "" keeps it out of the report
    show: Callable[[Any], str] = lambda v: "" if v is None else f"{v:.4g}"
    timed: bool = True  # needs a time: None without one; numeric: an amount per second


DERIVED: dict[str, Metric] = {}


def register_metric(name: str, *, column: str = "", show=None, timed: bool = True):
    """Register `fn(MetricInput) -> value` as the derived number `name` (in registration
    order: a metric may use those before it via input.found). The worker writes every
    registered metric into a row's `derived`; the report's kernel table shows those with a
    `column` (tritonbench's register_metric)."""

    def add(fn):
        kw = {"show": show} if show else {}
        DERIVED[name] = Metric(name, fn, column, timed=timed, **kw)
        return fn

    return add


@register_metric("flops", timed=False)
def _flops(x: MetricInput) -> int:
    return attention_flops(x.case)


@register_metric("flops_padded", timed=False)
def _flops_padded(x: MetricInput) -> int | None:
    """The work a kernel does on zero-padded heads too."""
    return None if x.padded_heads is None else attention_flops(x.case, heads=x.padded_heads)


@register_metric("bytes", timed=False)
def _bytes(x: MetricInput) -> int:
    return attention_bytes(x.case)


@register_metric("bytes_unique", timed=False)
def _bytes_unique(x: MetricInput) -> int:
    return attention_bytes(x.case, unique=True)


@register_metric("tflops", column="TFLOP/s")
def _tflops(x: MetricInput) -> float:
    return x.found["flops"] / (x.ms * 1e-3) / 1e12


# an attention call that attends to nothing (a 0-token chunk, no query row): its time is the
# launch alone, and the bytes it was given are not bytes it moved
NO_WORK_FIGURES = ("gbps", "peak_fraction", "bound")


def does_no_work(op: str | None, found: dict) -> bool:
    """An attention call (decode, prefill) whose count of useful FLOP is 0."""
    return op in ("decode", "prefill") and found.get("flops") == 0


@register_metric("gbps", column="GB/s")
def _gbps(x: MetricInput) -> float | None:
    """GB/s and the memory roof use the bytes a kernel must move at least (`bytes_unique`):
    with the no-reuse estimate (`bytes`), a prefill chunk, whose queries share most keys,
    would appear to beat the memory bandwidth. None for a call that does no work."""
    if does_no_work(x.case.op, x.found):
        return None
    return x.found["bytes_unique"] / (x.ms * 1e-3) / 1e9


def _roofs(x: MetricInput) -> tuple[float, float] | None:
    """(fraction of peak compute, fraction of peak bandwidth), None without both peaks or for
    a call that does no work (no fraction of any peak)."""
    if does_no_work(x.case.op, x.found):
        return None
    # the indexer's logits are an FP8 GEMM; attention runs in bf16 unless the kernel says fp8
    fp8 = x.case.op == "indexer" or x.precision == "fp8"
    peak_flops = getattr(x.hw, "peak_fp8" if fp8 else "peak_bf16", None)
    peak_bw = getattr(x.hw, "peak_bw", None)
    if not (peak_flops and peak_bw):
        return None
    seconds = x.ms * 1e-3
    return x.found["flops"] / seconds / peak_flops, x.found["bytes_unique"] / seconds / peak_bw


@register_metric("peak_fraction", column="peak", show=lambda v: "" if v is None else f"{v:.1%}")
def _peak_fraction(x: MetricInput) -> float | None:
    roofs = _roofs(x)
    return None if roofs is None else max(roofs)


@register_metric("bound", column="bound", show=lambda v: v or "")
def _bound(x: MetricInput) -> str | None:
    roofs = _roofs(x)
    return None if roofs is None else ("compute" if roofs[0] >= roofs[1] else "memory")


def derived_at(found: dict, from_ms: float | None, to_ms: float | None) -> dict:
    """Derived metrics computed at `from_ms`, at another time of the same call (a report's
    timer): every numeric timed metric is an amount per second of the call, so it scales by
    from_ms / to_ms; the rest (FLOP, bytes, the binding roof) stays."""
    if not (from_ms and to_ms) or from_ms == to_ms:
        return dict(found)
    scale = from_ms / to_ms
    out = dict(found)
    for m in DERIVED.values():
        v = found.get(m.name)
        if m.timed and isinstance(v, (int, float)) and not isinstance(v, bool):
            out[m.name] = v * scale
    return out


def derived(
    case: Case,
    timing: dict | None,
    hw,
    padded_heads: int | None = None,
    precision: str = "bf16",
) -> dict:
    """Every registered metric of one timed case (hw: hardware.GpuSpec; precision: the
    kernel's tensor-core inputs, which pick its compute roof)."""
    ms = (timing or {}).get("median_ms")
    timed = bool(ms) and math.isfinite(ms) and ms > 0
    x = MetricInput(case, ms if timed else None, hw, padded_heads, precision=precision)
    for m in DERIVED.values():
        x.found[m.name] = m.compute(x) if timed or not m.timed else None
    return dict(x.found)
