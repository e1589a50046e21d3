"""The project's Triton sparse MLA attention: decode straight from the FP8 caches (V3.2 656 B
records, V4 584 B pages) and sparse prefill over a flat bf16 kv, with FlashMLA's contract
(docs/kernel-facts.md, FlashMLA sparse kernels; oracle: reference/attention.py).

One kernel serves all three KV sources (LAYOUT: bf16 rows, V3.2 records, V4 pages). A program
takes BLOCK_H heads of one query token and a range of its key blocks (BLOCK_N keys each),
gathers the keys by computed byte addresses, dequantizes them in registers (e4m3 * scale per
tile, rope bf16) into a 512-wide tile that is K's first 512 columns and all of V, and runs an
online softmax in base 2 with scale * log2(e). V3.2 (d_qk 576) adds the 64 rope columns as a
second, K-only tile. Keys past a request's topk_length, index -1 (decode) or outside
[0, slots) are masked: their bytes are never read, so NaN-poisoned slots cannot leak in.

Split-KV: when one program per (token, head block) would leave SMs idle, the key blocks of the
main and the extra cache (joined into one list) are cut into `splits` ranges; every range
writes its normalized partial output and base-2 lse, and a combine kernel merges them, applies
the sink and writes bf16 out and natural-log lse. With one split the attention kernel writes
the final output itself.

On a GPU whose Triton has Gluon, config_for (tuning.py: measured rules) picks a second kernel
with the same arguments for the FP8 caches and for sparse prefill above 16 (d_qk 576) or 32
(512) heads: kernels/gluon_attention.py, FlashMLA's producer/consumer schedule (one warpgroup
dequantizes the next key block into shared memory while two run the dots; at 16-32 heads the
heads are the wgmma's N). Rows say which ran (info.gluon, info.narrow).

Host side (this module): plan_attention() checks the inputs, builds one descriptor per cache
(CacheDesc: base pointers, index list, lengths, strides; the layout is the caller's value,
case.layout, checked against the cache, never inferred from its width), allocates the outputs
and picks the launch shape; launch() only launches. Kernels: kernels/attention.py.

On CPU tensors the kernels run in Triton's interpreter (tests), which multiplies bf16 tiles
wrongly and rounds fp32 -> bf16 by truncation: there (EXACT=True) the tiles stay fp32 and the
final bf16 rounding is done with integer round-to-nearest-even.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from dsv4bench.backends.base import Prepared, Unsupported
from dsv4bench.backends.triton import jit
from dsv4bench.backends.triton.kernels.layout import D_V, FP8_LAYOUTS, LAYOUT_IDS
from dsv4bench.backends.triton.tuning import Config, config_for, gluon_meta, gluon_options
from dsv4bench.cases.case import Case
from dsv4bench.cases.output import Output, prefill_output
from reference.layout_table import LAYOUTS

LOG2E = 1.4426950408889634
CPU_SMS = 4  # the interpreter's "SM count": few programs, yet small cases still split
MAX_SPLITS = 64
CTAS_SMALL = 3  # CTAs per SM the split planner counts on below BLOCK_H 64
MIN_SPLIT_BLOCKS = 4  # a split's key blocks (the partial output costs a write and a read)
INT32_SPAN = 2**31 - 1  # caches from this many bytes need 64-bit offsets (WIDE)


# ---- the kernels' grouped arguments ----------------------------------------------------------


class QueryDesc(NamedTuple):
    ptr: Any  # bf16 (T, H, d_qk), last dim contiguous
    st: int  # token stride (elements)
    sh: int  # head stride


class CacheDesc(NamedTuple):
    """One KV source as the attention kernel reads it."""

    u8: Any  # FP8 caches: the bytes from the first one; bf16 rows: the rows
    u16: Any  # the same storage as 16-bit words (the rope of the FP8 caches)
    f32: Any  # the same storage as float32 words (V3.2 scales), else the bytes
    idx: Any  # int32 (T, width) slot indices, contiguous
    width: int  # indices per token
    lens: Any  # int32 (T // LENS_DIV,) topk lengths (read with HAS_LENS / HAS_X_LENS)
    slots: int  # valid indices are [0, slots)
    s0: int  # bf16: row stride (elements); V3.2: block stride; V4: page stride (bytes)
    s1: int  # V3.2: token stride (bytes)


class OutDesc(NamedTuple):
    out: Any  # bf16 (T, H, 512)
    st: int
    sh: int
    lse: Any  # fp32: token t, head h at (t // S_Q) * lse_sb + (t % S_Q) * lse_ss + h * lse_sh
    lse_sb: int
    lse_ss: int
    lse_sh: int
    maxl: Any  # fp32 (T, H) contiguous (read with HAS_MAXL)


class PartDesc(NamedTuple):
    o: Any  # fp32 (T, splits, H, 512)
    lse: Any  # fp32 (T, splits, H), base 2
    maxl: Any  # fp32 (T, splits, H): the split's max logit, base 2 (read with HAS_MAXL)


def cache_bytes(cache, layout: str):
    """An FP8 cache as uint8 (a view), checked for the shape and byte strides of `layout`."""
    import torch

    width = LAYOUTS[layout].token_bytes
    if not (
        isinstance(cache, torch.Tensor)
        and cache.dim() == 4
        and cache.shape[2] == 1
        and cache.shape[3] == width
        and cache.element_size() == 1
    ):
        shape = tuple(cache.shape) if isinstance(cache, torch.Tensor) else type(cache).__name__
        raise ValueError(f"{layout} cache must be a 1-byte tensor (pages, P, 1, {width}), {shape}")
    num_pages, page_size = cache.shape[:2]
    if cache.stride(3) != 1:
        raise ValueError(
            f"{layout} cache bytes of a token must be contiguous, got {cache.stride()}"
        )
    if layout == "v4" and page_size > 1 and cache.stride(1) != width:
        raise ValueError(f"V4 cache must have stride(1) == {width}, got {cache.stride(1)}")
    if layout == "v4" and num_pages > 1 and cache.stride(0) < page_size * width:
        raise ValueError(f"V4 page stride {cache.stride(0)} < page_size * {width}: pages overlap")
    return cache if cache.dtype == torch.uint8 else cache.view(torch.uint8)


def _fp8_cache(cache, layout: str, idx, lens) -> tuple[CacheDesc, int, bool]:
    """(descriptor, tokens per page, needs 64-bit offsets) of an FP8 cache; the wider views
    need the cache aligned as every engine allocates it."""
    import torch

    u8 = cache_bytes(cache, layout)
    align = 4 if layout == "v32" else 2
    if u8.data_ptr() % align or any(s % align for s in u8.stride()[:2]):
        raise ValueError(
            f"{layout} cache must be {align}-byte aligned (pointer and strides) for the attention "
            f"kernel's wide loads, got strides {u8.stride()}"
        )
    u16 = _as_dtype(u8, torch.int16)
    f32 = _as_dtype(u8, torch.float32) if layout == "v32" else u8
    slots = u8.shape[0] * u8.shape[1]
    desc = CacheDesc(u8, u16, f32, idx, idx.shape[1], lens, slots, u8.stride(0), u8.stride(1))
    return desc, u8.shape[1], _span(u8) >= INT32_SPAN


def _bf16_rows(kv, d_qk: int, idx, lens) -> CacheDesc:
    """The descriptor of sparse prefill's bf16 (s_kv, 1, d_qk) kv."""
    import torch

    kv2 = kv[:, 0] if kv.dim() == 3 else kv
    if kv2.dim() != 2 or kv2.shape[1] != d_qk or kv2.dtype != torch.bfloat16:
        raise ValueError(f"kv must be bf16 (s_kv, 1, {d_qk}), got {kv.dtype} {tuple(kv.shape)}")
    if kv2.stride(1) != 1:
        kv2 = kv2.contiguous()
    return CacheDesc(kv2, kv2, kv2, idx, idx.shape[1], lens, kv2.shape[0], kv2.stride(0), 0)


def _as_dtype(u8, dtype):
    """The cache's storage, from its first byte, as a flat tensor of dtype (for base pointers)."""
    import torch

    size = dtype.itemsize
    span = (u8.shape[0] - 1) * u8.stride(0) + (u8.shape[1] - 1) * u8.stride(1) + u8.shape[-1]
    flat = torch.as_strided(u8, (span - span % size,), (1,))
    return flat.view(dtype)


def _span(t) -> int:
    """Elements from a tensor's first to one past its last element."""
    return (
        1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True)) if t.numel() else 0
    )


def _int32(t, tokens: int | None, device):
    """t as contiguous int32 on device ((tokens, -1) when tokens is given); None stays None."""
    import torch

    if t is None:
        return None
    if tokens is not None:  # tokens may be 0 (an empty chunk): no -1 to infer
        t = t.reshape(tokens, t.numel() // tokens if tokens else t.shape[-1])
    return t.to(device, torch.int32).contiguous()


# ---- host side: plan, then launch ------------------------------------------------------------


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _sm_count(device) -> int:
    if device.type != "cuda":
        return CPU_SMS
    import torch

    return torch.cuda.get_device_properties(device).multi_processor_count


def _split_plan(tokens: int, heads: int, blocks: int, cfg: Config, device, splits: int | None):
    """(head blocks, splits, key blocks per split). Without a given split count: enough
    programs to fill every SM with the CTAs that fit (1 at BLOCK_H 64, whose tiles take most
    of the shared memory, else CTAS_SMALL). A split keeps at least MIN_SPLIT_BLOCKS key blocks
    (its partial output costs a write and a read) unless the batch is so small that fewer than
    a quarter of the SMs would have a program: then latency rules and one block is enough."""
    head_blocks = _cdiv(heads, cfg.block_h)
    if splits is None:
        programs = tokens * head_blocks
        sms = _sm_count(device)
        target = sms * (1 if cfg.block_h >= 64 or cfg.gluon else CTAS_SMALL)
        min_blocks = 1 if 4 * programs < sms else MIN_SPLIT_BLOCKS
        splits = max(1, min(target // max(1, programs), blocks // min_blocks, MAX_SPLITS))
    splits = max(1, min(splits, max(1, blocks)))
    per_split = _cdiv(max(1, blocks), splits)
    splits = _cdiv(max(1, blocks), per_split)
    return head_blocks, splits, per_split


@dataclass
class Inputs:
    """The checked inputs of one call: query, caches, and the shapes the kernels need."""

    op: str
    layout: str  # "bf16" (prefill's rows), "v32" or "v4"
    query: QueryDesc
    cache: CacheDesc
    extra: CacheDesc | None
    page: int  # tokens per page of the FP8 caches (1 for bf16 rows)
    wide: bool
    b: int
    s_q: int
    heads: int
    d_qk: int
    sink: Any


@dataclass
class AttentionPlan:
    """A prepared call: launch(plan) (or plan.run()) only launches into the outputs here."""

    tokens: int
    grid: tuple
    args: tuple
    meta: dict
    opts: dict
    combine: tuple | None  # (grid, args, meta, opts) of the combine kernel
    out: Any
    lse: Any
    max_logits: Any
    info: dict
    stage: Any = None  # run first in every call: copies q into its head-padded rows

    def run(self):
        return launch(self)


def _inputs(q, kv, indices, layout: str, op: str, kw: dict) -> Inputs:
    """Check the call's tensors against the op and the layout; build the cache descriptors."""
    import torch

    if op not in ("decode", "prefill"):
        raise ValueError(f"op must be decode or prefill, got {op!r}")
    want = 4 if op == "decode" else 3
    if q.dim() != want:
        shape = "(b, s_q, h, d_qk)" if op == "decode" else "(s_q, h, d_qk)"
        raise ValueError(f"{op} q must be {shape}, got {tuple(q.shape)}")
    b, s_q = q.shape[:2] if op == "decode" else (q.shape[0], 1)  # prefill: one row a "request"
    tokens, heads, d_qk = b * s_q, q.shape[-2], q.shape[-1]
    if d_qk not in (512, 576):
        raise ValueError(f"d_qk must be 512 or 576, got {d_qk}")
    dev = q.device
    idx = _int32(indices, tokens, dev)
    lens = _int32(kw.get("topk_length"), None, dev)
    if op == "prefill":
        if layout != "bf16" or kw.get("extra_kv") is not None:
            raise ValueError("sparse prefill takes one bf16 kv (the workspace), no extra cache")
        cache, page, wide, extra = _bf16_rows(kv, d_qk, idx, lens), 1, False, None
    else:
        if layout not in FP8_LAYOUTS or LAYOUTS[layout].d_qk != d_qk:
            raise ValueError(f"decode reads a {' or '.join(FP8_LAYOUTS)} cache of its d_qk; "
                             f"got layout {layout!r} with d_qk {d_qk}")  # fmt: skip
        if indices.shape[:2] != (b, s_q):
            raise ValueError(f"indices must be ({b}, {s_q}, topk), got {tuple(indices.shape)}")
        cache, page, wide = _fp8_cache(kv, layout, idx, lens)
        extra = _extra_cache(kw, layout, page, tokens, dev)
        wide = wide or (extra is not None and _span(extra.u8) >= INT32_SPAN)
    sink = kw.get("attn_sink")
    sink = None if sink is None else sink.to(dev, torch.float32).contiguous()
    if sink is not None and sink.shape != (heads,):
        raise ValueError(f"attn_sink must be ({heads},), got {tuple(sink.shape)}")
    q3 = q.reshape(tokens, heads, d_qk)
    q3 = q3 if q3.stride(2) == 1 else q3.contiguous()
    query = QueryDesc(q3, q3.stride(0), q3.stride(1))
    return Inputs(op, layout, query, cache, extra, page, wide, b, s_q, heads, d_qk, sink)


def _extra_cache(kw: dict, layout: str, page: int, tokens: int, dev) -> CacheDesc | None:
    """The extra cache's descriptor (same layout and page size as the main cache), or None."""
    extra_kv = kw.get("extra_kv")
    if extra_kv is None:
        return None
    if kw.get("extra_indices") is None:
        raise ValueError("extra_kv needs extra_indices")
    x_idx = _int32(kw["extra_indices"], tokens, dev)
    x_lens = _int32(kw.get("extra_topk_length"), None, dev)
    desc, x_page, _ = _fp8_cache(extra_kv, layout, x_idx, x_lens)
    if x_page != page:
        raise ValueError(f"extra cache pages hold {x_page} tokens, the main cache's {page}")
    return desc


def _outputs(x: Inputs, dev):
    """(OutDesc, out, lse, max_logits): decode lse (b, h, s_q); prefill lse and max (T, h)."""
    import torch

    tokens, h = x.b * x.s_q, x.heads
    out = torch.empty(tokens, h, D_V, dtype=torch.bfloat16, device=dev)
    if x.op == "decode":
        lse = torch.empty(x.b, h, x.s_q, dtype=torch.float32, device=dev)
        lse_strides = (lse.stride(0), lse.stride(2), lse.stride(1))
        max_logits = None
    else:
        lse = torch.empty(tokens, h, dtype=torch.float32, device=dev)
        lse_strides = (h, 0, 1)
        max_logits = torch.empty(tokens, h, dtype=torch.float32, device=dev)
    maxl = out if max_logits is None else max_logits  # never read without HAS_MAXL
    desc = OutDesc(out, out.stride(0), out.stride(1), lse, *lse_strides, maxl)
    return desc, out, lse, max_logits


def plan_attention(q, kv, indices, scale: float, *, layout: str, op: str = "decode",
                   splits: int | None = None, config: Config | None = None,
                   **kw) -> AttentionPlan:  # fmt: skip
    """Check, allocate and plan one call; launch(plan) only launches kernels.

    decode: q (b, s_q, h, d_qk), kv an FP8 cache of `layout` ("v32" or "v4"), indices
      (b, s_q, topk) (-1 invalid); keywords topk_length (b,), attn_sink (h,), extra_kv (a
      second cache of the same layout), extra_indices, extra_topk_length; out (b, s_q, h, 512)
      bf16, lse (b, h, s_q) fp32.
    prefill: layout "bf16", q (s_q, h, d_qk), kv bf16 (s_kv, 1, d_qk), indices (s_q, 1, topk)
      (invalid: < 0 or >= s_kv), topk_length (s_q,), attn_sink; out (s_q, h, 512), max_logits
      and lse (s_q, h).
    """
    import torch

    known = {"topk_length", "attn_sink", "extra_kv", "extra_indices", "extra_topk_length"}
    if set(kw) - known:
        raise TypeError(f"unknown arguments {sorted(set(kw) - known)}")
    dev = q.device
    exact = dev.type == "cpu"
    cfg = config or config_for(q.shape[-2], layout, not exact and jit.has_gluon(),
                               q.shape[-1])  # fmt: skip
    q, kw, stage, heads = _pad_prefill_heads(q, kw, op, cfg)
    x = _inputs(q, kv, indices, layout, op, kw)
    tokens, h = x.b * x.s_q, x.heads
    blocks = _cdiv(x.cache.width, cfg.block_n)
    if x.extra is not None:
        blocks += _cdiv(x.extra.width, cfg.block_n)
    head_blocks, splits, per_split = _split_plan(tokens, h, blocks, cfg, dev, splits)
    items = tokens * head_blocks  # (token, head block) pairs: the resident programs' work
    if cfg.persist and (splits > 1 or items <= _sm_count(dev)):
        # one wave of items: a resident program would have one consumer warpgroup busy, a
        # program an item has both on it (and splits the keys if there are few items)
        cfg = replace(cfg, persist=False)
    outs, out, lse, max_logits = _outputs(x, dev)
    parts = PartDesc(out, out, out)  # never read with one split
    if splits > 1:
        f32 = {"dtype": torch.float32, "device": dev}
        parts = PartDesc(
            torch.empty(tokens, splits, h, D_V, **f32),
            torch.empty(tokens, splits, h, **f32),
            torch.empty(tokens, splits, h, **f32),
        )
    sink_arg = out if x.sink is None else x.sink  # never read without HAS_SINK
    extra = x.extra if x.extra is not None else x.cache  # never read with NPARTS 1
    args = (x.query, x.cache, extra, sink_arg, outs, parts, h, x.s_q, x.s_q, scale * LOG2E,
            per_split)  # fmt: skip
    meta = _meta(x, cfg, splits, exact)
    opts = {} if exact else {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    if cfg.gluon:
        meta, opts = gluon_meta(meta, cfg), gluon_options(cfg)
    combine = None
    if splits > 1:
        combine = _combine(x, cfg, (parts, sink_arg, outs, h, x.s_q, splits), tokens, exact)
    info = {
        "kernel": f"triton_sparse_{op}_{layout}",
        **_config_info(cfg),
        "head_blocks": head_blocks,
        "splits": splits,
        "key_blocks_per_split": per_split,
    }
    grid = (head_blocks, splits, tokens)
    if cfg.gluon:  # the Gluon kernel's last argument: the (token, head block) items
        args += (items,)
    if cfg.persist:  # more items than SMs (above): a program an SM
        grid = (_sm_count(dev), 1, 1)
    if stage is not None:  # the caller's heads only
        out, lse, max_logits = out[:, :heads], lse[:, :heads], max_logits[:, :heads]
        info["heads_padded_to"] = h
    return AttentionPlan(tokens, grid, args, meta, opts, combine, out, lse, max_logits, info,
                         stage)  # fmt: skip


def _combine(x: Inputs, cfg: Config, c_args: tuple, tokens: int, exact: bool) -> tuple:
    """(grid, args, meta, options) of the combine kernel that merges the splits."""
    h, splits = c_args[3], c_args[5]
    splits_p2 = 1 << (splits - 1).bit_length()
    c_meta = dict(HAS_SINK=x.sink is not None, SPLITS_P2=splits_p2, EXACT=exact, PDL=cfg.gluon,
                  HAS_MAXL=x.op == "prefill", SPLIT_ROWS=min(8, splits_p2))  # fmt: skip
    # programmatic dependent launch after the Gluon kernel, which lets it start at once:
    # no launch gap between the two (split-KV decode 2-10% faster on the H100)
    c_opts = {"num_warps": 4, "launch_pdl": cfg.gluon}
    return ((h, tokens), c_args, c_meta, {} if exact else c_opts)


def _config_info(cfg: Config) -> dict:
    """The launch shape as a row records it."""
    keys = ("block_h", "block_n", "num_warps", "num_stages", "idx_ahead", "gluon", "narrow",
            "alternate", "async_fill", "pipe", "persist", "prefetch", "split_pv",
            "key_bias", "lead_cols")  # fmt: skip
    return {k: getattr(cfg, k) for k in keys}


def _pad_prefill_heads(q, kw: dict, op: str, cfg: Config):
    """(q, kw, stage, heads): sparse prefill with fewer heads than the Triton kernel's BLOCK_H
    reads q from rows padded to BLOCK_H heads (zeros; sink 0), copied in by `stage` at every
    call: 8 heads in 16-head rows ran 1.23x (V3.2) and 1.07x (V4) faster on an H100, the copy
    included (results/sm90/triton-gluon-h100/NOTES.md). Else (q, kw, None, heads)."""
    import torch

    heads = q.shape[-2]
    sink = kw.get("attn_sink")
    bad_sink = sink is not None and tuple(sink.shape) != (heads,)  # _inputs says what is wrong
    if op != "prefill" or cfg.gluon or q.dim() != 3 or heads >= cfg.block_h or bad_sink:
        return q, kw, None, heads
    padded = torch.zeros(q.shape[0], cfg.block_h, q.shape[2], dtype=q.dtype, device=q.device)
    if sink is not None:
        kw = dict(kw, attn_sink=torch.cat([sink, sink.new_zeros(cfg.block_h - heads)]))
    return padded, kw, lambda: padded[:, :heads].copy_(q), heads


def _meta(x: Inputs, cfg: Config, splits: int, exact: bool) -> dict:
    """The attention kernel's constexprs."""
    return dict(
        LAYOUT=LAYOUT_IDS[x.layout],
        P=x.page,
        HAS_TAIL=x.d_qk == 576,
        NPARTS=1 if x.extra is None else 2,
        HAS_LENS=x.cache.lens is not None,
        HAS_X_LENS=x.extra is not None and x.extra.lens is not None,
        HAS_SINK=x.sink is not None and splits == 1,
        HAS_MAXL=x.op == "prefill",
        SPLIT=splits > 1,
        BLOCK_H=cfg.block_h,
        BLOCK_N=cfg.block_n,
        EXACT=exact,
        WIDE=x.wide,
        IDX_AHEAD=cfg.idx_ahead,
    )


def launch(plan: AttentionPlan):
    """Launch the planned kernels; (out, lse, max_logits)."""
    if plan.tokens == 0:
        return plan.out, plan.lse, plan.max_logits
    dev = plan.out.device
    interpret = dev.type == "cpu"
    if plan.stage is not None:
        plan.stage()
    attn = jit.kernel("gluon_attention" if plan.info["gluon"] else "attention", "attn", dev)
    with jit.interpreting(interpret):
        attn[plan.grid](*plan.args, **plan.meta, **plan.opts)
        if plan.combine is not None:
            grid, args, meta, opts = plan.combine
            jit.kernel("attention", "combine", dev)[grid](*args, **meta, **opts)
    return plan.out, plan.lse, plan.max_logits


def sparse_decode(q, k_cache, indices, scale, *, layout: str, **kw):
    """(out (b, s_q, h, 512) bf16, lse (b, h, s_q) fp32); arguments as plan_attention."""
    out, lse, _ = plan_attention(q, k_cache, indices, scale, layout=layout, **kw).run()
    b, s_q, h, _ = q.shape
    return out.view(b, s_q, h, D_V), lse


def sparse_prefill(q, kv, indices, scale, **kw):
    """(out (s_q, h, 512) bf16, max_logits (s_q, h), lse (s_q, h)) like flash_mla_sparse_fwd."""
    out, lse, max_logits = plan_attention(q, kv, indices, scale, layout="bf16", op="prefill",
                                          **kw).run()  # fmt: skip
    return out, max_logits, lse


def warm_up(plan: AttentionPlan) -> float:
    """Compile (or load from Triton's cache) and run once; seconds taken (recorded in info)."""
    t0 = time.perf_counter()
    plan.run()
    if plan.out.device.type == "cuda":
        import torch

        torch.cuda.synchronize(plan.out.device)
    return time.perf_counter() - t0


# ---- the backend's decode and prefill ops (TritonKernels delegates here) --------------------


def uses_decode_kernel(case: Case) -> bool:
    return case.decode_shape is not None


def case_reason(case: Case) -> str | None:
    """Why the attention kernels cannot take this decode/prefill case; None if they can."""
    if case.d_v != D_V:
        return f"triton attention writes d_v {D_V}, not {case.d_v}"
    if uses_decode_kernel(case):
        if case.layout not in FP8_LAYOUTS or LAYOUTS[case.layout].d_qk != case.d_qk:
            return (
                "triton decode reads the v32 cache with d_qk 576 or the v4 cache with d_qk 512, "
                f"not layout {case.layout} with d_qk {case.d_qk}"
            )
    elif case.d_qk not in (512, 576):
        return f"triton sparse prefill takes d_qk 576 or 512, not {case.d_qk}"
    if case.num_heads < 1:
        return f"num_heads must be >= 1, got {case.num_heads}"
    return None


def plan_for(case: Case, x: dict) -> AttentionPlan:
    """The plan of a suite case: the decode kernel on its FP8 cache (case.layout), or sparse
    prefill on the bf16 workspace."""
    if uses_decode_kernel(case):
        expected = LAYOUTS[case.layout].token_bytes
        if x["k_cache"].shape[-1] != expected:
            raise ValueError(
                f"k_cache rows are {x['k_cache'].shape[-1]} B, {case.layout} is {expected}"
            )
        extra = {"extra_kv": x.get("extra_k_cache"), "extra_indices": x.get("extra_indices"),
                 "extra_topk_length": x.get("extra_topk_length")}  # fmt: skip
        kv, layout, op = x["k_cache"], case.layout, "decode"
    else:
        extra, kv, layout, op = {}, x["kv"], "bf16", "prefill"
    return plan_attention(x["q"], kv, x["indices"], case.scale, layout=layout, op=op,
                          topk_length=x.get("topk_length"), attn_sink=x.get("attn_sink"),
                          **extra)  # fmt: skip


def prepare(case: Case, x: dict, device: str) -> Prepared:
    """Plan, allocate, compile and run once (compile time recorded in info); run() only launches."""
    reason = case_reason(case)
    if reason:
        raise Unsupported(reason)
    plan = plan_for(case, x)
    if uses_decode_kernel(case):
        b, s_q, h, _ = x["q"].shape
        if case.op == "prefill":  # a decode route: (T, 1) or (1, T) -> (T, h, d_v)
            finish = lambda raw: prefill_output(raw[0].view(b, s_q, h, D_V), raw[1])
        else:
            finish = lambda raw: Output(raw[0].view(b, s_q, h, D_V), raw[1])
    else:
        finish = lambda raw: Output(raw[0], raw[1], max_logits=raw[2])
    info = dict(plan.info)
    info["first_call_s"] = round(warm_up(plan), 3)  # compile (or Triton cache load) + one run

    def poison():
        plan.out.fill_(float("nan"))
        plan.lse.fill_(float("nan"))
        if plan.max_logits is not None:
            plan.max_logits.fill_(float("nan"))
        return plan.out

    return Prepared(run=plan.run, finish=finish, poison=poison, info=info)
