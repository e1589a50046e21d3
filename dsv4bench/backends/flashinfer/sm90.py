"""FlashInfer on sm90: the FA3 MLA kernel used as sparse attention, as vLLM's
FLASHINFER_MLA_SPARSE_SM90 backend feeds it (decode and prefill).

The kernel is `flashinfer.mla.BatchMLAPagedAttentionWrapper(workspace, backend="fa3")`, a dense
paged MLA kernel. With `page_size=1` a row's `kv_indices` slice is exactly its list of KV slots,
so sparse attention is one "request" per query token (vLLM: "each query token becomes one varlen
batch row whose kv_indices slice is its top-k row and whose kv_len is its valid count"):
    qo_indptr = 0..T (one query row each), kv_indptr = cumsum(valid counts), kv_len_arr =
    valid counts, kv_indices = the valid slots of every row back to back, causal=False (the
    indexer's selection already encodes causality), sm_scale = the case's softmax scale.
MTP (s_q > 1) is the same: every query token is its own row with its own index list. A row's
valid count is its index-list length, so `topk_length` needs no kernel support: the entries past
it are simply not in the list.
  plan(qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads, head_dim_ckv, head_dim_kpe,
       page_size, causal, sm_scale, q_data_type, kv_data_type)   host-side schedule (+ H2D)
  run(q_nope [T, h, 512], q_pe [T, h, kpe], ckv [slots, 1, 512], kpe [slots, 1, kpe], out, lse,
      return_lse, return_lse_base_on_e, *, ckv_scale, ckv_scale_arr, kpe_scale) -> out, lse
ckv/kpe may be strided views of one [slots, 1, d_qk] tensor (vLLM splits its cache that way).

V3.2 (d_qk 576): head_dim_ckv=512 (latent, also V), head_dim_kpe=64 (rope). V4 (d_qk 512, rope
inside V): head_dim_ckv=512, head_dim_kpe=0 ("NoPE MLA"). That is the same attention: the
kernel computes logits = scale * (q_nope.ckv + q_pe.kpe) and out = softmax . ckv; with kpe
empty, logits = scale * q[:512].k[:512] over the whole 512-wide K, and V = all 512 columns,
which is V4's definition (d_v = d_qk = 512, rope columns included in both).

Heads: the FA3 MLA kernel takes any head count (1..256 ran on an H100, 8 and 16 unpadded), so
nothing is padded (vLLM hands it num_heads per rank); an explicit head_padding pads with zero
queries whose outputs are dropped.

Extra (V4 compressed) cache: one pool [main slots; extra slots] and one index list per row
(valid main slots, then valid extra slots shifted by the main slot count), one softmax.

Sinks (V4): FA3 has none. run() asks for the natural-log lse and scales out by
exp(lse) / (exp(lse) + exp(sink)) = sigmoid(lse - sink) inside the timed call, as an engine
must; the lse stays that of the keys (the oracle's).

KV variants (`kv_dtype`), all conversions outside the timed call, timed as info["convert_ms"]:
  bf16  the FP8 cache dequantized into a bf16 workspace (decode) or the prefill workspace as is.
  e4m3  FlashInfer's FP8 MLA: the kernel dequantizes in shared memory, bf16(e4m3 * scale) with
        a per-token, per-128-column fp32 scale (`ckv_scale_arr`) for ckv and a per-tensor scale
        for kpe. V3.2 decode reads the cache's own latent bytes and fp32 scales in place (656-B
        records, strided view) and converts only the bf16 rope to e4m3 (one power-of-two scale).
        Otherwise the values are requantized: per token and 128 columns, power-of-two scales.
        Power-of-two scales make the kernel's bf16 dequantization exact, so the values it reads
        are known exactly; `Prepared.reads` holds them in the oracle's form and the worker judges
        the kernel against them (conversion error against the original beside it). Lossy parts:
        the rope (bf16 -> e4m3) and, for V4, a 64-column tile sharing a 128-column scale with a
        larger neighbour.
plan() runs outside the timed call: vLLM plans once per step in its metadata builder, shared by
all layers; its host time is info["plan_ms"]. The first plan() of a variant in a process
JIT-compiles the kernel (nvcc): that time is info["compile_s"] on the case that paid it.

Returned lse: natural log with return_lse_base_on_e=True (base 2 otherwise); a row with no key
gives out 0 and lse -inf, turned into the oracle's +inf in finish().
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from dsv4bench.backends import paged_rows
from dsv4bench.backends.base import (
    HeadRule,
    Prepared,
    Unsupported,
    pad_heads,
    pad_sink,
    resolve_heads,
)
from dsv4bench.backends.flashinfer.convert import WORKSPACE_BYTES
from dsv4bench.cases.case import Case
from dsv4bench.cases.output import Output
from reference.layouts import E4M3_MAX

D_CKV = 512
KPE_DIM = {576: 64, 512: 0}  # d_qk -> head_dim_kpe
MAX_HEADS = 256  # largest head count seen running on the H100 (probe)
SCALE_GROUP = 128  # ckv_scale_arr: one scale per token per 128 ckv columns
# How the kernel reads a V3.2 fp32 scale (reference.layouts scale_rounding): the fp32 product
# e4m3 * scale rounded once to bf16, the scale itself unrounded (mla_hopper.cuh,
# repack_fp8_kv_to_bf16: `static_cast<bf16>(static_cast<float>(bf16(e4m3)) * scale)`).
V32_SCALE_READING = "bf16-product"
# What the e4m3 kernel reads of a V3.2 cache (row info.reads_what): found in FlashInfer
# 0.6.18's include/flashinfer/attention/mla_hopper.cuh and the plan() call below
V32_E4M3_READS = {
    "latent": "bf16(e4m3 x fp32 scale): the product rounded once to bf16, the fp32 scale not "
    "rounded (raw scales: unlike sm90 FlashMLA, which rounds the scale to bf16 first)",
    "rope": "e4m3 x one per-tensor power-of-two scale (this backend's conversion of the bf16 "
    "rope; its error is info.conversion)",
    "q": "bf16, not quantized (plan q_data_type bfloat16)",
}
# FlashInfer's MLA planner reserves this many work items (scheduler.cuh, max_total_num_works,
# "adjust it later") and does not check it: with one work per query row, a plan of more rows
# overflows and rows past the limit stay unwritten (measured: 32768 rows -> half NaN; 17000
# faulted the context). So a case past it is `unsupported` with that reason, unless the backend
# option past_planner_limit runs it anyway (its rows are then judged and come out `incorrect`).
PLANNER_WORKS = 16384
_compiled: set[tuple] = set()  # JIT variants already built in this process


@dataclass
class Pool:
    """What the kernel reads: ckv [slots, 1, 512], kpe [slots, 1, kpe] and the FP8 scales."""

    ckv: object
    kpe: object
    scale_kwargs: dict
    reads: object = None  # fp32 [slots, d_qk] of the values read, when they differ from the input
    exact: bool = True  # whether those values are the cache's own (bf16 of e4m3 * 2^k)


def query_rows(case: Case) -> int:
    """Rows the planner gets one work item each for: one per query token."""
    return case.tokens if case.op == "prefill" else case.batch_size * case.s_q


def supports(case: Case, past_planner_limit: bool = False) -> str | None:
    if query_rows(case) > PLANNER_WORKS and not past_planner_limit:
        return (
            f"{query_rows(case)} query rows > the {PLANNER_WORKS} work items FlashInfer's MLA "
            "planner reserves unchecked (rows past it stay unwritten or fault); "
            "flashinfer.past_planner_limit=true runs it anyway"
        )
    if case.d_qk not in KPE_DIM:
        return (
            "FlashInfer's FA3 MLA takes d_qk 576 (ckv 512 + kpe 64) or 512 (kpe 0), "
            f"not {case.d_qk}"
        )
    if case.d_v != D_CKV:
        return f"FlashInfer's FA3 MLA returns the 512-wide ckv as V; d_v {case.d_v} is not 512"
    heads, reason = resolve_heads(case, head_rule(case))
    if reason:
        return reason
    if heads > MAX_HEADS:
        return f"FlashInfer's FA3 MLA was run with at most {MAX_HEADS} heads here, not {heads}"
    return None


def head_rule(case: Case) -> HeadRule:
    """Any head count; no padding by default (vLLM hands it num_heads per rank)."""
    return HeadRule("FlashInfer's FA3 MLA", None, case.num_heads)


def padded_heads(case: Case) -> int:
    """The heads the kernel gets (supports() has checked that they fit)."""
    return resolve_heads(case, head_rule(case))[0]


# ---- conversions --------------------------------------------------------------------------


def pow2_at_least(x):
    """Smallest power of two >= x (elementwise; x > 0), exact at powers of two."""
    import torch

    m, e = torch.frexp(x)  # x = m * 2^e, m in [0.5, 1)
    return torch.ldexp(torch.ones_like(x), torch.where(m == 0.5, e - 1, e))


def e4m3_groups(x):
    """x fp32 [n, 512] -> (e4m3 [n, 512], scales fp32 [n, 4], values read fp32 [n, 512]).

    Scale per token and 128 columns: the power of two >= amax/448 (non-finite rows: 1.0, their
    values stay NaN, so reading an unused slot still shows)."""
    import torch

    g = x.view(x.shape[0], -1, SCALE_GROUP)
    amax = g.abs().amax(-1)
    scale = pow2_at_least((amax / E4M3_MAX).clamp_min(torch.finfo(torch.float32).tiny))
    scale = torch.where(torch.isfinite(scale), scale, torch.ones_like(scale))
    q = (g / scale[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    reads = (q.float() * scale[..., None]).view_as(x)
    return q.view_as(x), scale, reads


def finite_amax(x) -> float:
    import torch

    return float(torch.where(torch.isfinite(x), x.abs(), 0.0).amax()) if x.numel() else 0.0


def pow2_scale(amax: float) -> float:
    """Per-tensor power-of-two scale >= amax/448 (1.0 for an all-zero tensor)."""
    return 2.0 ** math.ceil(math.log2(amax / E4M3_MAX)) if amax > 0 else 1.0


def bf16_pool_from_caches(caches, d_qk: int, layout: str | None = None) -> Pool:
    """The FP8 caches dequantized into one bf16 pool [slots, 1, d_qk] (ckv/kpe: views)."""
    rows, exact = paged_rows.bf16_pool(caches, d_qk, layout, check_exact=True)
    rows = rows.view(rows.shape[0], 1, d_qk)
    return Pool(rows[..., :D_CKV], rows[..., D_CKV:], {}, exact=exact)


def e4m3_pool(x, d_qk: int, kpe_scale: float | None = None) -> Pool:
    """fp32/bf16 values [n, d_qk] -> FP8 pool with per-token ckv scales, per-tensor kpe scale."""
    import torch

    x = x.float()
    q, scale, reads = e4m3_groups(x[:, :D_CKV].contiguous())
    kpe_dim = d_qk - D_CKV
    if kpe_scale is None:
        kpe_scale = pow2_scale(finite_amax(x[:, D_CKV:]))
    kpe = (x[:, D_CKV:] / kpe_scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    reads = torch.cat([reads, kpe.float() * kpe_scale], -1) if kpe_dim else reads
    kw = {"ckv_scale_arr": scale.view(-1, 1, D_CKV // SCALE_GROUP), "kpe_scale": kpe_scale}
    n = x.shape[0]
    return Pool(q.view(n, 1, D_CKV), kpe.view(n, 1, kpe_dim), kw, reads)


def e4m3_pool_from_caches(caches, d_qk: int, layout: str | None = None) -> Pool:
    """Every slot of the FP8 caches requantized (one pool, one kpe scale for all)."""
    import torch

    n, dev = paged_rows.pool_slots(caches), caches[0].device
    kpe_dim = d_qk - D_CKV
    kpe_scale = 1.0
    if kpe_dim:
        amax = max(finite_amax(x[:, D_CKV:]) for _, x in paged_rows.gather_chunks(caches, layout))
        kpe_scale = pow2_scale(amax)
    ckv = torch.empty(n, 1, D_CKV, dtype=torch.float8_e4m3fn, device=dev)
    kpe = torch.empty(n, 1, kpe_dim, dtype=torch.float8_e4m3fn, device=dev)
    scales = torch.empty(n, 1, D_CKV // SCALE_GROUP, dtype=torch.float32, device=dev)
    reads = torch.empty(n, d_qk, dtype=torch.float32, device=dev)
    for s, x in paged_rows.gather_chunks(caches, layout):
        p = e4m3_pool(x, d_qk, kpe_scale)
        e = s + x.shape[0]
        ckv[s:e], kpe[s:e], reads[s:e] = p.ckv, p.kpe, p.reads
        scales[s:e] = p.scale_kwargs["ckv_scale_arr"]
    kw = {"ckv_scale_arr": scales, "kpe_scale": kpe_scale}
    return Pool(ckv, kpe, kw, reads)


def v32_in_place_pool(cache) -> Pool:
    """V3.2 cache read in place: latent e4m3 = a strided view of the 656-B records, ckv_scale_arr
    = their fp32 scales (non-finite -> 1.0: the kernel takes slot 0's scale for padding rows),
    kpe = the bf16 rope as e4m3 with one power-of-two scale. reads: the values the kernel reads,
    bf16(e4m3 * scale) (exact for power-of-two scales) and e4m3(rope) * kpe_scale."""
    import torch

    records = cache.view(torch.uint8).reshape(-1, 1, cache.shape[-1])
    ckv = records.view(torch.float8_e4m3fn)[..., :D_CKV]
    scale = records[..., D_CKV : D_CKV + 16].contiguous().view(torch.float32)
    scale = torch.where(torch.isfinite(scale), scale, torch.ones_like(scale)).contiguous()
    rope = records[..., D_CKV + 16 :].contiguous().view(torch.bfloat16).float()
    kpe_scale = pow2_scale(finite_amax(rope))
    kpe = (rope / kpe_scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    latent = ckv.float().view(-1, 4, SCALE_GROUP) * scale.view(-1, 4, 1)
    read = latent.to(torch.bfloat16).float()
    exact = bool(((read == latent) | ~torch.isfinite(latent)).all())
    reads = torch.cat([read.view(-1, D_CKV), kpe.float()[:, 0] * kpe_scale], -1)
    return Pool(ckv, kpe, {"ckv_scale_arr": scale, "kpe_scale": kpe_scale}, reads, exact)


# ---- the values read, in the oracle's form --------------------------------------------------


def caches_from_reads(reads, caches, case: Case, scale_rounding: str | None = None):
    """FP8 caches (same layout, page size, slots) holding exactly the values `reads` [slots, d]:
    the decode oracle reads only FP8 caches. V3.2: the original records with the rope replaced
    (the latent is read in place). V4: requantized by the layout's own writer, which is exact for
    values that are e4m3 times a power of two per 128 columns. Checked, reading V3.2 scales as
    `scale_rounding` does (the kernel's reading): None where the values are not representable."""
    import torch

    from reference import layouts

    out, base = [], 0
    for cache in caches:
        n = cache.shape[0] * cache.shape[1]
        r = reads[base : base + n]
        base += n
        bad = ~torch.isfinite(r).all(-1)
        if case.layout == "v32":
            new = cache.clone()
            rec = new.view(torch.uint8).view(n, -1)
            rope = r[:, D_CKV:].to(torch.bfloat16).contiguous().view(torch.uint8)
            rec[:, D_CKV + 16 :] = rope.view(n, -1)
        else:
            new = layouts.quantize_v4(r.nan_to_num(0.0, 0.0, 0.0), cache.shape[1])
        if bad.any():
            layouts.poison_tokens(new, bad.nonzero().flatten(), layout=case.layout)
        slots = torch.arange(n, device=new.device)
        back = layouts.gather_tokens(new, slots, scale_rounding=scale_rounding, layout=case.layout)
        ok = (back == r) | bad[:, None]
        if not bool(ok.all()):
            return None
        out.append(new)
    return out


# ---- prepare ------------------------------------------------------------------------------


def prepare(case: Case, inputs: dict, device: str, wrapper_cls, kv_dtype: str,
            past_planner_limit: bool = False) -> Prepared:  # fmt: skip
    """The timed call (run + sink), with conversion and plan done here, outside it."""
    import torch

    _check(case, kv_dtype, past_planner_limit)
    decode_form = case.decode_shape is not None
    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)
    info: dict = {"kernel": "BatchMLAPagedAttentionWrapper(backend='fa3')", "kv_dtype": kv_dtype}
    sync()
    t0 = time.perf_counter()
    if decode_form:
        q4 = inputs["q"]
        b, s_q, h, d = q4.shape
        q = q4.reshape(b * s_q, h, d)
        pool, idx, ok, reads = _decode_pool(case, inputs, kv_dtype, info)
    else:
        q = inputs["q"]
        pool, idx, ok, reads = _prefill_pool(case, inputs, kv_dtype)
    flat, qo_indptr, kv_indptr, lens = paged_rows.flat_lists(idx, ok)
    sync()
    info["convert_ms"] = (time.perf_counter() - t0) * 1e3

    t, h, d = q.shape
    heads = padded_heads(case)
    qp = pad_heads(q, heads, 1).to(torch.bfloat16)
    kpe_dim = KPE_DIM[case.d_qk]
    q_nope, q_pe = qp[..., :D_CKV], qp[..., D_CKV:]
    kv_type = torch.bfloat16 if kv_dtype == "bf16" else torch.float8_e4m3fn
    plan_args = (qo_indptr, kv_indptr, flat, lens, heads, D_CKV, kpe_dim, 1, False, case.scale)
    wrapper = _planned(wrapper_cls, plan_args, (kpe_dim, kv_dtype), kv_type, q.device, sync, info)
    if t > PLANNER_WORKS:
        info["planner_limit"] = (
            f"{t} query rows > FlashInfer's {PLANNER_WORKS} planned work items (unchecked)"
        )
    info.update(
        padded_heads=heads,
        head_dim_ckv=D_CKV,
        head_dim_kpe=kpe_dim,
        plan="outside the timed call (vLLM plans once per step, for all layers)",
        query_rows=t,
        kv_indices=int(kv_indptr[-1]),
    )

    out = torch.empty(t, heads, D_CKV, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty(t, heads, dtype=torch.float32, device=q.device)
    sink = pad_sink(inputs.get("attn_sink"), heads)
    if sink is not None:
        info["sink"] = "out *= sigmoid(lse - sink), inside the timed call"
    kw = dict(out=out, lse=lse, return_lse=True, return_lse_base_on_e=True, **pool.scale_kwargs)
    ckv, kpe = pool.ckv, pool.kpe

    def run():
        wrapper.run(q_nope, q_pe, ckv, kpe, **kw)
        if sink is not None:
            paged_rows.scale_by_sink(out, lse, sink)
        return out, lse

    def finish(raw) -> Output:
        o, l_ = raw[0][:, :h], raw[1][:, :h]
        l_ = paged_rows.no_key_lse(l_)
        if case.op == "decode":
            b, s_q = inputs["q"].shape[:2]
            return Output(o.view(b, s_q, h, -1), l_.view(b, s_q, h).transpose(1, 2))
        return Output(o, l_)

    def poison():
        out.fill_(math.nan)
        lse.fill_(math.nan)

    return Prepared(run, finish, poison, info, reads=reads)


def _check(case: Case, kv_dtype: str, past_planner_limit: bool) -> None:
    if kv_dtype not in paged_rows.KV_DTYPES:
        raise ValueError(f"kv_dtype must be one of {paged_rows.KV_DTYPES}, got {kv_dtype!r}")
    reason = supports(case, past_planner_limit)
    if reason:
        raise Unsupported(reason)


def _plan(wrapper, plan_args: tuple, kv_type) -> None:
    """plan(), with a plan the library itself refuses (0.7.2.post1 checks the planner's work
    items: "FA MLA needs at least N work items; native capacity is 16384") as Unsupported."""
    import torch

    try:
        wrapper.plan(*plan_args, torch.bfloat16, kv_type)
    except Exception as e:
        if type(e).__name__.endswith("PlanUnsupportedError"):
            raise Unsupported(f"FlashInfer's plan refuses it: {e}") from None
        raise


def _planned(wrapper_cls, plan_args: tuple, variant: tuple, kv_type, device, sync, info: dict):
    """A wrapper with plan() done (timed into info; the first plan of a variant compiles)."""
    import torch

    ws = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    wrapper = wrapper_cls(ws, backend="fa3")
    if variant not in _compiled:  # the first plan() of a variant builds (or loads) the kernel
        t0 = time.perf_counter()
        _plan(wrapper, plan_args, kv_type)
        info["compile_s"] = time.perf_counter() - t0
        _compiled.add(variant)
    sync()
    t0 = time.perf_counter()
    _plan(wrapper, plan_args, kv_type)
    sync()
    info["plan_ms"] = (time.perf_counter() - t0) * 1e3
    return wrapper


def _decode_pool(case: Case, x: dict, kv_dtype: str, info: dict):
    """The pool, joined index table (T, k + k_extra) and its list mask, and `reads`."""

    caches, idx, ok = paged_rows.decode_lists(x)
    if kv_dtype == "bf16":
        pool = bf16_pool_from_caches(caches, case.d_qk, case.layout)
        info["reads_exact"] = pool.exact
        return pool, idx, ok, None  # bf16 of e4m3 * power of two: exact
    reading = None
    if case.layout == "v32" and len(caches) == 1:
        pool = v32_in_place_pool(caches[0])
        info["ckv"] = "V3.2 latent bytes and fp32 scales read in place"
        info["reads_what"] = dict(V32_E4M3_READS)
        reading = V32_SCALE_READING
    else:
        pool = e4m3_pool_from_caches(caches, case.d_qk, case.layout)
        info["ckv"] = "requantized, per-token per-128 power-of-two scales"
    info["kpe_scale"] = pool.scale_kwargs["kpe_scale"]
    new = caches_from_reads(pool.reads, caches, case, scale_rounding=reading)
    info["reads_exact"] = pool.exact and new is not None
    if new is None:  # judged against the original cache; the bf16 rounding counts as error
        return pool, idx, ok, None
    reads = dict(x)
    reads["k_cache"] = new[0]
    if len(new) == 2:
        reads["extra_k_cache"] = new[1]
    return pool, idx, ok, reads


def _prefill_pool(case: Case, x: dict, kv_dtype: str):
    import torch

    kv = x["kv"]
    kv = kv if kv.dim() == 3 else kv[:, None]
    idx = x["indices"].flatten(1)
    ok = paged_rows.row_lists(idx, x.get("topk_length"), limit=kv.shape[0])
    if kv_dtype == "bf16":
        kvb = kv.to(torch.bfloat16)
        return Pool(kvb[..., :D_CKV], kvb[..., D_CKV:], {}), idx, ok, None
    pool = e4m3_pool(kv[:, 0], case.d_qk)
    reads = dict(x)
    reads["kv"] = pool.reads.to(torch.bfloat16)[:, None]  # exact: e4m3 * 2^k
    return pool, idx, ok, reads
