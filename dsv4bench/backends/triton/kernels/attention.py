"""The sparse MLA attention kernels (host side, contract and docs: ../attention.py).

Arguments come grouped: a query descriptor (ptr, token stride, head stride), one cache
descriptor per cache (attention.CacheDesc: its base pointers, index list, lengths and
strides), an output descriptor and the split-KV partials. The LAYOUT constexpr says which key
source the cache descriptors describe (kernels/layout.py LAYOUT_IDS); byte offsets within a
token are the named constants below.
"""

from __future__ import annotations

import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from dsv4bench.backends.triton.kernels import device_fn
from dsv4bench.backends.triton.kernels import layout as L

BF16 = tl.constexpr(L.LAYOUT_IDS["bf16"])
V32 = tl.constexpr(L.LAYOUT_IDS["v32"])
D_V = tl.constexpr(L.D_V)
ROPE = tl.constexpr(L.ROPE)
V32_TILES = tl.constexpr(L.V32_TILES)
V32_TILE = tl.constexpr(L.V32_TILE)
V32_SCALES_AT = tl.constexpr(L.V32_SCALES_AT)
V32_ROPE_AT = tl.constexpr(L.V32_ROPE_AT)
V4_TILES = tl.constexpr(L.V4_TILES)
V4_TILE = tl.constexpr(L.V4_TILE)
V4_DATA = tl.constexpr(L.V4_DATA_BYTES)
V4_SCALE = tl.constexpr(L.V4_SCALE_BYTES)
V4_ROPE_AT = tl.constexpr(L.V4_ROPE_AT)
LN2 = tl.constexpr(0.6931471805599453)
LOG2E = tl.constexpr(1.4426950408889634)


def attn_kernel(
    q,  # QueryDesc: bf16 (T, H, d_qk), last dim contiguous
    cache,  # CacheDesc of the main cache
    x_cache,  # CacheDesc of the extra cache (NPARTS == 2), else a copy of cache
    sink_ptr,  # fp32 (H,) or unused
    outs,  # OutDesc: bf16 out (T, H, 512), lse, max logits
    parts,  # PartDesc: fp32 (T, splits, H, 512) outputs and (T, splits, H) base-2 lse
    H,
    S_Q,
    LENS_DIV,
    scale2,  # softmax scale * log2(e)
    blocks_per_split,
    LAYOUT: tl.constexpr,
    P: tl.constexpr,  # tokens per page (FP8 caches)
    HAS_TAIL: tl.constexpr,  # d_qk 576: 64 K-only rope columns after the 512
    NPARTS: tl.constexpr,
    HAS_LENS: tl.constexpr,
    HAS_X_LENS: tl.constexpr,
    HAS_SINK: tl.constexpr,
    HAS_MAXL: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EXACT: tl.constexpr,  # interpreter: fp32 tiles and integer bf16 rounding
    WIDE: tl.constexpr,  # 64-bit cache offsets
    IDX_AHEAD: tl.constexpr,  # load block i + 1's indices before block i's rows
):
    hb = tl.program_id(0)
    split = tl.program_id(1)
    t = tl.program_id(2).to(tl.int64)
    if EXACT:
        KDT = tl.float32
    else:
        KDT = tl.bfloat16
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = heads < H
    c = tl.arange(0, D_V)
    q_row = q.ptr + t * q.st + heads[:, None] * q.sh
    q_main = tl.load(q_row + c[None, :], mask=hmask[:, None], other=0.0).to(KDT)
    q_tail = q_main
    if HAS_TAIL:
        r = tl.arange(0, ROPE)
        q_tail = tl.load(q_row + D_V + r[None, :], mask=hmask[:, None], other=0.0).to(KDT)

    length, x_length, main_blocks, start, stop = _key_range(
        cache, x_cache, t, split, LENS_DIV, blocks_per_split, NPARTS, HAS_LENS, HAS_X_LENS, BLOCK_N
    )
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.full([BLOCK_H], 0.0, tl.float32)
    acc = tl.full([BLOCK_H, D_V], 0.0, tl.float32)
    idx_next = _block_idx(start, stop, t, main_blocks, cache, length, x_cache, x_length, NPARTS,
                          BLOCK_N)  # fmt: skip
    for i in range(start, stop):
        idx = idx_next
        if IDX_AHEAD:  # the next block's indices in flight while this block's rows load
            idx_next = _block_idx(i + 1, stop, t, main_blocks, cache, length, x_cache, x_length,
                                  NPARTS, BLOCK_N)  # fmt: skip
        else:
            idx = _block_idx(i, stop, t, main_blocks, cache, length, x_cache, x_length, NPARTS,
                             BLOCK_N)  # fmt: skip
        valid, raw, raw_scale, raw_tail = _gather_block(
            i, idx, main_blocks, cache, x_cache, LAYOUT, P, NPARTS, HAS_TAIL, WIDE
        )
        k, tail = _dequant_block(raw, raw_scale, raw_tail, LAYOUT, HAS_TAIL, BLOCK_N, KDT)
        m_i, l_i, acc = _block_step(q_main, q_tail, k, tail, valid, m_i, l_i, acc, scale2,
                                    HAS_TAIL, KDT)  # fmt: skip

    has_key = l_i > 0.0
    o = acc / tl.where(has_key, l_i, 1.0)[:, None]
    lse2 = tl.where(has_key, m_i + tl.log2(tl.where(has_key, l_i, 1.0)), float("-inf"))
    if SPLIT:
        at = (t * tl.num_programs(1) + split) * H + heads
        tl.store(parts.o + at[:, None] * D_V + c[None, :], o, mask=hmask[:, None])
        tl.store(parts.lse + at, lse2, mask=hmask)
        if HAS_MAXL:
            tl.store(parts.maxl + at, m_i, mask=hmask)
    else:
        _store_final(outs, sink_ptr, o, lse2, m_i, has_key, t, heads, hmask, H, S_Q, HAS_SINK,
                     HAS_MAXL, EXACT)  # fmt: skip


@device_fn
def _key_range(cache, x_cache, t, split, LENS_DIV, blocks_per_split, NPARTS: tl.constexpr,
               HAS_LENS: tl.constexpr, HAS_X_LENS: tl.constexpr,
               BLOCK_N: tl.constexpr):  # fmt: skip
    """(length, x_length, main blocks, start, stop): the key blocks of both caches form one
    list (main first); blocks past a topk_length are left out, and split `split` takes list
    entries [start, stop). One loop over both caches (two loops double the live state and
    spill)."""
    length = _length(cache, t, LENS_DIV, HAS_LENS)
    main_blocks = (length + BLOCK_N - 1) // BLOCK_N
    total = main_blocks
    x_length = 0
    if NPARTS == 2:
        x_length = _length(x_cache, t, LENS_DIV, HAS_X_LENS)
        total += (x_length + BLOCK_N - 1) // BLOCK_N
    start = split * blocks_per_split
    stop = tl.minimum(start + blocks_per_split, total)
    return length, x_length, main_blocks, start, stop


@device_fn
def _length(cache, t, LENS_DIV, HAS_LENS: tl.constexpr):
    """Keys token t reads from this cache: its topk_length (capped at the index width)."""
    n = cache.width
    if HAS_LENS:
        n = tl.minimum(tl.load(cache.lens + t // LENS_DIV), cache.width)
    return n


@device_fn
def _block_step(q_main, q_tail, k, tail, valid, m_i, l_i, acc, scale2, HAS_TAIL: tl.constexpr,
                KDT: tl.constexpr):  # fmt: skip
    """One key block of the online softmax (base 2): (m_i, l_i, acc) updated."""
    s = tl.dot(q_main, tl.trans(k))
    if HAS_TAIL:
        s = tl.dot(q_tail, tl.trans(tail), s)
    s = tl.where(valid[None, :], s * scale2, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(KDT), k)
    return m_new, l_i, acc


@device_fn
def _store_final(outs, sink_ptr, o, lse2, m_i, has_key, t, heads, hmask, H, S_Q,
                 HAS_SINK: tl.constexpr, HAS_MAXL: tl.constexpr, EXACT: tl.constexpr):  # fmt: skip
    """The sink applied, bf16 out, natural-log lse and max logits written (one split)."""
    if HAS_SINK:
        sink2 = tl.load(sink_ptr + heads, mask=hmask, other=float("-inf")) * LOG2E
        o = o / tl.where(has_key, 1.0 + tl.exp2(sink2 - lse2), 1.0)[:, None]
    c = tl.arange(0, D_V)
    o_ptrs = outs.out + t * outs.st + heads[:, None] * outs.sh + c[None, :]
    tl.store(o_ptrs, _to_bf16(o, EXACT), mask=hmask[:, None])
    lse = tl.where(has_key, lse2 * LN2, float("inf"))
    lse_at = (t // S_Q) * outs.lse_sb + (t % S_Q) * outs.lse_ss + heads * outs.lse_sh
    tl.store(outs.lse + lse_at, lse, mask=hmask)
    if HAS_MAXL:
        tl.store(outs.maxl + t * H + heads, m_i * LN2, mask=hmask)  # (T, H) contiguous


@device_fn
def _to_bf16(x, EXACT: tl.constexpr):
    """fp32 -> bf16, round to nearest even; in integers where the interpreter would truncate."""
    if EXACT:
        v = x.to(tl.uint32, bitcast=True)
        rb16 = (v + 0x7FFF + ((v >> 16) & 1)) >> 16
        y = rb16.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        y = x.to(tl.bfloat16)
    return y


@device_fn
def _block_idx(i, stop, t, main_blocks, cache, length, x_cache, x_length, NPARTS: tl.constexpr,
               BLOCK_N: tl.constexpr):  # fmt: skip
    """The slot indices of entry i of the joined key-block list (-1: masked, or i >= stop)."""
    blk = i
    idx_row = cache.idx + t * cache.width
    if NPARTS == 2:
        is_x = i >= main_blocks
        blk = tl.where(is_x, i - main_blocks, i)
        idx_row = tl.where(is_x, x_cache.idx + t * x_cache.width, idx_row)
        length = tl.where(is_x, x_length, length)
    kk = blk * BLOCK_N + tl.arange(0, BLOCK_N)
    return tl.load(idx_row + kk, mask=(kk < length) & (i < stop), other=-1)


@device_fn
def _gather_block(i, idx, main_blocks, cache, x_cache, LAYOUT: tl.constexpr, P: tl.constexpr,
                  NPARTS: tl.constexpr, HAS_TAIL: tl.constexpr, WIDE: tl.constexpr):  # fmt: skip
    """Entry i of the joined key-block list, as loaded bytes of the slots idx: (valid
    [BLOCK_N], main tile, its scales, rope tail). Masked rows (invalid) read nothing."""
    u8, u16, f32, s0, s1, slots = cache.u8, cache.u16, cache.f32, cache.s0, cache.s1, cache.slots
    if NPARTS == 2:
        is_x = i >= main_blocks
        u8 = tl.where(is_x, x_cache.u8, u8)
        u16 = tl.where(is_x, x_cache.u16, u16)
        f32 = tl.where(is_x, x_cache.f32, f32)
        slots = tl.where(is_x, x_cache.slots, slots)
        s0 = tl.where(is_x, x_cache.s0, s0)
        s1 = tl.where(is_x, x_cache.s1, s1)
    if WIDE:  # caches of 2 GiB or more: 64-bit byte offsets
        idx = idx.to(tl.int64)
    valid = (idx >= 0) & (idx < slots)
    slot = tl.where(valid, idx, 0)
    r = tl.arange(0, ROPE)
    if LAYOUT == BF16:  # bf16 rows: plain 2-D loads (the dot's operand as it is stored)
        row = slot * s0
        raw = tl.load(u8 + row[:, None] + tl.arange(0, D_V)[None, :], mask=valid[:, None],
                      other=0.0)  # fmt: skip
        raw_scale = valid
        raw_tail = valid
        if HAS_TAIL:
            raw_tail = tl.load(u8 + row[:, None] + D_V + r[None, :], mask=valid[:, None])
    elif LAYOUT == V32:  # V3.2 records: V32_TILES x V32_TILE e4m3, fp32 scales, bf16 rope
        g = tl.arange(0, V32_TILES)
        col3 = g[None, :, None] * V32_TILE + tl.arange(0, V32_TILE)[None, None, :]
        rec = (slot // P) * s0 + (slot % P) * s1
        raw = tl.load(u8 + rec[:, None, None] + col3, mask=valid[:, None, None], other=0)
        scale_at = (rec[:, None] + V32_SCALES_AT) // 4 + g[None, :]
        raw_scale = tl.load(f32 + scale_at, mask=valid[:, None])
        raw_tail = tl.load(u16 + (rec[:, None] + V32_ROPE_AT) // 2 + r[None, :],
                           mask=valid[:, None])  # fmt: skip
    else:  # V4 pages: all D_V data bytes (nope e4m3 + the rope's first bytes) and all scale
        # bytes (V4_TILES + pad); the rope is read again as bf16 and replaces the last tile
        g = tl.arange(0, 8)
        col3 = g[None, :, None] * V4_TILE + tl.arange(0, V4_TILE)[None, None, :]
        data = (slot // P) * s0 + (slot % P) * V4_DATA
        scl = (slot // P) * s0 + P * V4_DATA + (slot % P) * V4_SCALE
        raw = tl.load(u8 + data[:, None, None] + col3, mask=valid[:, None, None], other=0)
        raw_scale = tl.load(u8 + scl[:, None] + g[None, :], mask=valid[:, None], other=127)
        rope_at = (data[:, None, None] + V4_ROPE_AT) // 2 + r[None, None, :]
        raw_tail = tl.load(u16 + rope_at, mask=valid[:, None, None], other=0)  # [N, 1, ROPE]
    return valid, raw, raw_scale, raw_tail


@device_fn
def _dequant_block(raw, raw_scale, raw_tail, LAYOUT: tl.constexpr, HAS_TAIL: tl.constexpr,
                   BLOCK_N: tl.constexpr, KDT: tl.constexpr):  # fmt: skip
    """(k [BLOCK_N, D_V], rope tail [BLOCK_N, ROPE] or k) in KDT from _gather_block's bytes."""
    if LAYOUT == BF16:
        k = raw.to(KDT)
        tail = k
        if HAS_TAIL:
            tail = raw_tail.to(KDT)
    elif LAYOUT == V32:
        x = raw.to(tl.float8e4nv, bitcast=True).to(tl.float32) * raw_scale[:, :, None]
        k = tl.reshape(x, [BLOCK_N, D_V]).to(KDT)
        tail = raw_tail.to(tl.uint16).to(tl.bfloat16, bitcast=True).to(KDT)
    else:
        sb = raw_scale.to(tl.uint32)
        # 2^(b - 127): b = 0 is the subnormal 2^-127
        sc = tl.where(sb == 0, 0x400000, sb << 23).to(tl.float32, bitcast=True)
        deq = raw.to(tl.float8e4nv, bitcast=True).to(tl.float32) * sc[:, :, None]
        rope = raw_tail.to(tl.uint16).to(tl.bfloat16, bitcast=True).to(tl.float32)
        g3 = tl.arange(0, 8)[None, :, None]
        k = tl.reshape(tl.where(g3 < V4_TILES, deq, rope), [BLOCK_N, D_V]).to(KDT)
        tail = k
    return k, tail


def combine_kernel(
    parts,  # PartDesc: fp32 (T, splits, H, 512) outputs, (T, splits, H) base-2 lse (-inf: none)
    sink_ptr,
    outs,  # OutDesc
    H,
    S_Q,
    splits,
    HAS_SINK: tl.constexpr,
    SPLITS_P2: tl.constexpr,
    EXACT: tl.constexpr,
    PDL: tl.constexpr = False,
    HAS_MAXL: tl.constexpr = False,
    SPLIT_ROWS: tl.constexpr = 8,
):
    if PDL:  # launched while the attention grid runs: its partials are complete after this
        gdc_wait()
    h = tl.program_id(0)
    t = tl.program_id(1).to(tl.int64)
    s = tl.arange(0, SPLITS_P2)
    smask = s < splits
    c = tl.arange(0, D_V)
    at = (t * splits + s) * H + h
    lse_s = tl.load(parts.lse + at, mask=smask, other=float("-inf"))
    m = tl.max(lse_s, 0)
    has_key = m > float("-inf")
    m_use = tl.where(has_key, m, 0.0)
    total = tl.sum(tl.exp2(lse_s - m_use), 0)
    # the partial outputs SPLIT_ROWS (<= 8) splits at a time: all of them at once held
    # SPLITS_P2 x 512 fp32 in 128 threads' registers, which spilled from 32 splits (a 2-token
    # C128 decode split 33 ways took 0.19 ms, FlashMLA 0.036)
    r = tl.arange(0, SPLIT_ROWS)
    acc = tl.full([D_V], 0.0, tl.float32)
    for s0 in range(0, splits, SPLIT_ROWS):
        at_r = (t * splits + s0 + r) * H + h
        rmask = s0 + r < splits
        w = tl.exp2(tl.load(parts.lse + at_r, mask=rmask, other=float("-inf")) - m_use)
        po = tl.load(parts.o + at_r[:, None] * D_V + c[None, :], mask=rmask[:, None], other=0.0)
        acc += tl.sum(po * w[:, None], 0)
    o = acc / tl.where(has_key, total, 1.0)
    lse2 = tl.where(has_key, m + tl.log2(tl.where(has_key, total, 1.0)), float("-inf"))
    if HAS_SINK:
        sink2 = tl.load(sink_ptr + h) * LOG2E
        o = o / tl.where(has_key, 1.0 + tl.exp2(sink2 - lse2), 1.0)
    tl.store(outs.out + t * outs.st + h * outs.sh + c, _to_bf16(o, EXACT))
    lse = tl.where(has_key, lse2 * LN2, float("inf"))
    tl.store(outs.lse + (t // S_Q) * outs.lse_sb + (t % S_Q) * outs.lse_ss + h * outs.lse_sh, lse)
    if HAS_MAXL:  # the splits' largest logit (natural log); -inf without a key
        m_s = tl.load(parts.maxl + at, mask=smask, other=float("-inf"))
        tl.store(outs.maxl + t * H + h, tl.max(m_s, 0) * LN2)


KERNELS = {"attn": attn_kernel, "combine": combine_kernel}
