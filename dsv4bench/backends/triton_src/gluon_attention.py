"""The attention kernel in FlashMLA's schedule, written in Gluon (Triton 3.6, sm90 only): FP8
decode from both caches and sparse prefill over bf16 rows.

A program takes the heads of one query token and a range of its 64-key blocks, like the
Triton kernel (attention.py: same descriptors, key list, masking, split-KV partials and final
store), but its warps split the work: a producer warpgroup gathers the next block's bytes
(FP8: dequantized to bf16 in registers; bf16 rows: cp.async) into one of two shared-memory key
buffers while two consumer warpgroups run the dots and the online softmax on the other with
asynchronous wgmma. mbarriers hand the buffers over (full: keys written; empty: both
consumers done reading). Wide (64 heads): QK with each warpgroup 32 of the 64 keys, PV with
each 256 of the 512 output columns. Narrow (16 or 32 heads, NARROW): the heads are the
wgmma's N and the keys its M, so no head is padded to 64. The plain Triton kernel cannot
express this overlap: its dequantization, both dots and the softmax are one serial chain per
warp (results/sm90/triton-speed-h100/NOTES.md; this kernel's: triton-gluon-h100/NOTES.md).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    async_copy,
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from dsv4bench.backends.triton_src import layout as L

BF16 = gl.constexpr(L.LAYOUT_IDS["bf16"])
V32 = gl.constexpr(L.LAYOUT_IDS["v32"])
D_V = gl.constexpr(L.D_V)
ROPE = gl.constexpr(L.ROPE)
V32_TILES = gl.constexpr(L.V32_TILES)
V32_TILE = gl.constexpr(L.V32_TILE)
V32_SCALES_AT = gl.constexpr(L.V32_SCALES_AT)
V32_ROPE_AT = gl.constexpr(L.V32_ROPE_AT)
V4_TILES = gl.constexpr(L.V4_TILES)
V4_TILE = gl.constexpr(L.V4_TILE)
V4_DATA = gl.constexpr(L.V4_DATA_BYTES)
V4_SCALE = gl.constexpr(L.V4_SCALE_BYTES)
V4_ROPE_AT = gl.constexpr(L.V4_ROPE_AT)
BLOCK_H = gl.constexpr(64)
BLOCK_N = gl.constexpr(64)
LN2 = gl.constexpr(0.6931471805599453)
LOG2E = gl.constexpr(1.4426950408889634)

# consumers (8 warps): S = Q K^T split by keys, O split by output columns, one warpgroup each
S_LAYOUT = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                  instr_shape=[16, 32, 16]))  # fmt: skip
O_LAYOUT = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                  instr_shape=[16, 256, 16]))  # fmt: skip
P_LAYOUT = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT, k_width=2))
Q_ROWS = gl.constexpr(gl.BlockedLayout([1, 8], [1, 32], [8, 1], [1, 0]))


@gluon.jit
def attn_kernel(q, cache, x_cache, sink_ptr, outs, parts, H, S_Q, LENS_DIV, scale2,
                blocks_per_split, LAYOUT: gl.constexpr, P: gl.constexpr,
                HAS_TAIL: gl.constexpr, NPARTS: gl.constexpr, HAS_LENS: gl.constexpr,
                HAS_X_LENS: gl.constexpr, HAS_SINK: gl.constexpr, HAS_MAXL: gl.constexpr,
                SPLIT: gl.constexpr, WIDE: gl.constexpr, CHUNK: gl.constexpr,
                PRODUCER_WARPS: gl.constexpr, PRODUCER_REGS: gl.constexpr,
                NARROW: gl.constexpr, NH: gl.constexpr, IDX_AHEAD: gl.constexpr):  # fmt: skip
    """Arguments as triton_src/attention.py's attn_kernel (BLOCK_N = 64). A program takes
    BLOCK_H = 64 heads, or with NARROW the NH (16 or 32) heads are the wgmma's N and the keys
    its M: no head is padded to 64 (consumers: _consume_narrow)."""
    hb = gl.program_id(0)
    split = gl.program_id(1)
    t = gl.program_id(2).to(gl.int64)
    ROWS: gl.constexpr = NH if NARROW else BLOCK_H
    main_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_V], gl.bfloat16)
    tail_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, ROPE], gl.bfloat16)
    qm_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, D_V], gl.bfloat16)
    qt_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, ROPE], gl.bfloat16)
    p_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, NH], gl.bfloat16)
    q_main, q_tail = _load_q(q, t, hb, H, HAS_TAIL, ROWS)
    q_main_s = gl.allocate_shared_memory(gl.bfloat16, [ROWS, D_V], qm_sl, q_main)
    q_tail_s = gl.allocate_shared_memory(gl.bfloat16, [ROWS, ROPE], qt_sl, q_tail)
    k_main_s = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, D_V], main_sl)
    k_tail_s = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, ROPE], tail_sl)
    p_s = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, NH], p_sl)
    idx_sl: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    idx_s = gl.allocate_shared_memory(gl.int32, [2, BLOCK_N], idx_sl)  # the producer's indices
    full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for b in gl.static_range(2):
        mbarrier.init(full.index(b), count=1)
        mbarrier.init(empty.index(b), count=1)
    fence_async_shared()  # q's generic stores before the consumers' wgmma reads
    gl.thread_barrier()
    keys = _key_list(cache, x_cache, t, split, LENS_DIV, blocks_per_split, NPARTS, HAS_LENS,
                     HAS_X_LENS)  # fmt: skip
    bufs = (q_main_s, q_tail_s, k_main_s, k_tail_s, p_s, full, empty)
    # fmt: off
    # (the argument tuples are written out in each call: a tuple variable would carry the
    # constexprs into the partitions as plain values)
    if NARROW:
        acc, m_i, l_i = gl.warp_specialize(
            [(_consume_narrow, (bufs, cache, x_cache, keys, scale2, HAS_TAIL, NPARTS)),
             (_produce, (k_main_s, k_tail_s, idx_s, full, empty, cache, x_cache, keys, LAYOUT,
                         P, HAS_TAIL, NPARTS, WIDE, CHUNK, PRODUCER_WARPS, IDX_AHEAD))],
            [PRODUCER_WARPS], [PRODUCER_REGS])
        rows = gl.convert_layout(gl.permute(acc, (1, 0)), Q_ROWS)  # (heads, 512)
        _store(rows, m_i, l_i, outs, parts, sink_ptr, t, hb, split, H, S_Q, HAS_SINK, HAS_MAXL,
               SPLIT, Q_ROWS, NH)
    else:
        acc, m_i, l_i = gl.warp_specialize(
            [(_consume, (bufs, cache, x_cache, keys, scale2, HAS_TAIL, NPARTS)),
             (_produce, (k_main_s, k_tail_s, idx_s, full, empty, cache, x_cache, keys, LAYOUT,
                         P, HAS_TAIL, NPARTS, WIDE, CHUNK, PRODUCER_WARPS, IDX_AHEAD))],
            [PRODUCER_WARPS], [PRODUCER_REGS])
        _store(acc, m_i, l_i, outs, parts, sink_ptr, t, hb, split, H, S_Q, HAS_SINK, HAS_MAXL,
               SPLIT, O_LAYOUT, BLOCK_H)
    # fmt: on


@gluon.jit
def _key_list(cache, x_cache, t, split, LENS_DIV, blocks_per_split, NPARTS: gl.constexpr,
              HAS_LENS: gl.constexpr, HAS_X_LENS: gl.constexpr):  # fmt: skip
    """(t, main blocks, length, x_length, start, stop): the joined key-block list of both
    caches (main first, blocks past a topk_length left out) and split `split`'s range of it."""
    length = _length(cache, t, LENS_DIV, HAS_LENS)
    main_blocks = (length + BLOCK_N - 1) // BLOCK_N
    total = main_blocks
    x_length = length * 0
    if NPARTS == 2:
        x_length = _length(x_cache, t, LENS_DIV, HAS_X_LENS)
        total += (x_length + BLOCK_N - 1) // BLOCK_N
    start = split * blocks_per_split
    stop = gl.minimum(start + blocks_per_split, total)
    return t, main_blocks, length, x_length, start, stop


@gluon.jit
def _load_q(q, t, hb, H, HAS_TAIL: gl.constexpr, ROWS: gl.constexpr):
    """The program's ROWS heads of token t: (q[:, :512], q[:, 512:576] or zeros) in registers."""
    heads = hb * ROWS + gl.arange(0, ROWS, gl.SliceLayout(1, Q_ROWS))
    hmask = heads < H
    c = gl.arange(0, D_V, gl.SliceLayout(0, Q_ROWS))
    row = q.ptr + t * q.st + heads[:, None] * q.sh
    q_main = gl.load(row + c[None, :], mask=hmask[:, None], other=0.0)
    r = gl.arange(0, ROPE, gl.SliceLayout(0, Q_ROWS))
    tail_mask = hmask[:, None] & (r[None, :] < ROPE * HAS_TAIL)
    q_tail = gl.load(row + D_V + r[None, :], mask=tail_mask, other=0.0)
    return q_main, q_tail


@gluon.jit
def _length(cache, t, LENS_DIV, HAS_LENS: gl.constexpr):
    n = cache.width + t.to(gl.int32) * 0
    if HAS_LENS:
        n = gl.minimum(gl.load(cache.lens + t // LENS_DIV), cache.width)
    return n


@gluon.jit
def _block_keys(i, keys, cache, x_cache, k, NPARTS: gl.constexpr):
    """Entry i of the joined key-block list at key offsets k (a tensor): (indices, -1 where
    masked; the number of slots of the cache they index)."""
    t, main_blocks, length, x_length, start, stop = keys
    blk = i
    idx_row = cache.idx + t * cache.width
    slots = cache.slots
    if NPARTS == 2:
        is_x = i >= main_blocks
        blk = gl.where(is_x, i - main_blocks, i)
        idx_row = gl.where(is_x, x_cache.idx + t * x_cache.width, idx_row)
        length = gl.where(is_x, x_length, length)
        slots = gl.where(is_x, x_cache.slots, slots)
    kk = blk * BLOCK_N + k
    idx = gl.load(idx_row + kk, mask=kk < length, other=-1)
    return idx, slots


@gluon.jit
def _consume(bufs, cache, x_cache, keys, scale2, HAS_TAIL: gl.constexpr, NPARTS: gl.constexpr):
    """The consumer warpgroups: online softmax (base 2) over the key blocks the producer
    fills; (acc [64, 512] unnormalized, m_i, l_i)."""
    q_main_s, q_tail_s, k_main_s, k_tail_s, p_s, full, empty = bufs
    start = keys[4]
    stop = keys[5]
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, gl.SliceLayout(1, S_LAYOUT))
    l_i = gl.full([BLOCK_H], 0.0, gl.float32, gl.SliceLayout(1, S_LAYOUT))
    acc = gl.zeros([BLOCK_H, D_V], gl.float32, O_LAYOUT)
    s0 = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, S_LAYOUT)
    k_cols = gl.arange(0, BLOCK_N, gl.SliceLayout(0, S_LAYOUT))
    for i in range(start, stop):
        n = i - start
        buf = n % 2
        idx, slots = _block_keys(i, keys, cache, x_cache, k_cols, NPARTS)
        valid = (idx >= 0) & (idx < slots)
        mbarrier.wait(full.index(buf), (n // 2) & 1)
        kb = k_main_s.index(buf)
        s = warpgroup_mma(q_main_s, kb.permute((1, 0)), s0, use_acc=False, is_async=True)
        if HAS_TAIL:
            s = warpgroup_mma(q_tail_s, k_tail_s.index(buf).permute((1, 0)), s, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        p, alpha, m_i, l_i = _softmax_step(s, valid, m_i, l_i, scale2, 1)
        p_op = gl.convert_layout(p.to(gl.bfloat16), P_LAYOUT)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_LAYOUT))[:, None]
        acc = warpgroup_mma(p_op, kb, acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(empty.index(buf), count=1)
    return acc, m_i, l_i


@gluon.jit
def _softmax_step(s, valid, m_i, l_i, scale2, KEYS: gl.constexpr):
    """One key block of the online softmax (base 2) over scores s whose keys run along axis
    KEYS: (p, the old state's rescale alpha, m_i, l_i) updated; invalid keys get p 0."""
    s = gl.where(gl.expand_dims(valid, 1 - KEYS), s * scale2, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, KEYS))
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_i - m_use)
    p = gl.exp2(s - gl.expand_dims(m_use, KEYS))
    return p, alpha, m_new, l_i * alpha + gl.sum(p, KEYS)


@gluon.jit
def _consume_narrow(bufs, cache, x_cache, keys, scale2, HAS_TAIL: gl.constexpr,
                    NPARTS: gl.constexpr):  # fmt: skip
    """The consumers with NH heads as the wgmma's N: S^T = K Q^T (64 keys x NH, each warpgroup
    NH / 2 heads), the softmax down the keys, P^T through shared memory (double-buffered: one
    partition barrier a block orders both warpgroups' writes and reads), O^T += V^T P^T (each
    warpgroup 256 of the 512 rows, V^T a transposed view of the key buffer); (acc [512, NH]
    unnormalized, m_i, l_i)."""
    q_main_s, q_tail_s, k_main_s, k_tail_s, p_s, full, empty = bufs
    NH: gl.constexpr = p_s.type.shape[2]
    st_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                   instr_shape=[16, NH // 2, 16])  # fmt: skip
    ot_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                   instr_shape=[16, NH, 16])  # fmt: skip
    start = keys[4]
    stop = keys[5]
    m_i = gl.full([NH], float("-inf"), gl.float32, gl.SliceLayout(0, st_l))
    l_i = gl.full([NH], 0.0, gl.float32, gl.SliceLayout(0, st_l))
    acc = gl.zeros([D_V, NH], gl.float32, ot_l)
    s0 = gl.zeros([BLOCK_N, NH], gl.float32, st_l)
    k_rows = gl.arange(0, BLOCK_N, gl.SliceLayout(1, st_l))
    for i in range(start, stop):
        n = i - start
        buf = n % 2
        idx, slots = _block_keys(i, keys, cache, x_cache, k_rows, NPARTS)
        valid = (idx >= 0) & (idx < slots)
        mbarrier.wait(full.index(buf), (n // 2) & 1)
        kb = k_main_s.index(buf)
        s = warpgroup_mma(kb, q_main_s.permute((1, 0)), s0, use_acc=False, is_async=True)
        if HAS_TAIL:
            s = warpgroup_mma(k_tail_s.index(buf), q_tail_s.permute((1, 0)), s, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        p, alpha, m_i, l_i = _softmax_step(s, valid, m_i, l_i, scale2, 0)
        pb = p_s.index(buf)
        pb.store(p.to(gl.bfloat16))
        fence_async_shared()
        gl.thread_barrier()
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(0, ot_l))[None, :]
        acc = warpgroup_mma(kb.permute((1, 0)), pb, acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(empty.index(buf), count=1)
    return acc, m_i, l_i


@gluon.jit
def _produce(k_main_s, k_tail_s, idx_s, full, empty, cache, x_cache, keys, LAYOUT: gl.constexpr,
             P: gl.constexpr, HAS_TAIL: gl.constexpr, NPARTS: gl.constexpr,
             WIDE: gl.constexpr, CHUNK: gl.constexpr, PW: gl.constexpr,
             AHEAD: gl.constexpr):  # fmt: skip
    """The producer warps (PW): each key block gathered, dequantized to bf16 and written into
    the free buffer, CHUNK keys at a time, a key's 16-byte pieces across a warp. With AHEAD
    the next block's indices load while this block's rows do and wait in idx_s (two
    buffers): a block then costs one memory round trip, not two (index, then rows)."""
    start = keys[4]
    stop = keys[5]
    main_blocks = keys[1]
    k = gl.arange(0, BLOCK_N, gl.BlockedLayout([1], [32], [PW], [0]))
    if AHEAD:
        first, _ = _block_keys(start, keys, cache, x_cache, k, NPARTS)
        idx_s.index(0).store(first)
        gl.thread_barrier()
    for i in range(start, stop):
        n = i - start
        buf = n % 2
        if AHEAD:
            nxt, _ = _block_keys(i + 1, keys, cache, x_cache, k, NPARTS)  # -1 past the list
        u8, u16, f32, s0, s1 = cache.u8, cache.u16, cache.f32, cache.s0, cache.s1
        slots = cache.slots
        if NPARTS == 2:
            is_x = i >= main_blocks
            u8 = gl.where(is_x, x_cache.u8, u8)
            u16 = gl.where(is_x, x_cache.u16, u16)
            f32 = gl.where(is_x, x_cache.f32, f32)
            s0 = gl.where(is_x, x_cache.s0, s0)
            s1 = gl.where(is_x, x_cache.s1, s1)
            slots = gl.where(is_x, x_cache.slots, slots)
        mbarrier.wait(empty.index(buf), ((n // 2) & 1) ^ 1)
        kb = k_main_s.index(buf)
        tb = k_tail_s.index(buf)
        ks = (idx_s.index(buf), i, keys, cache, x_cache, slots)
        for c in gl.static_range(BLOCK_N // CHUNK):
            if LAYOUT == BF16:
                _bf16_chunk(ks, c, u8, s0, kb, tb, HAS_TAIL, NPARTS, AHEAD, CHUNK, PW)
            elif LAYOUT == V32:
                _v32_chunk(ks, c, u8, u16, f32, s0, s1, kb, tb, P, HAS_TAIL, NPARTS, AHEAD, WIDE,
                           CHUNK, PW)  # fmt: skip
            else:
                _v4_chunk(ks, c, u8, u16, s0, kb, P, NPARTS, AHEAD, WIDE, CHUNK, PW)
        if LAYOUT == BF16:
            async_copy.commit_group()
            async_copy.wait_group(0)
        fence_async_shared()
        mbarrier.arrive(full.index(buf), count=1)
        if AHEAD:
            idx_s.index(1 - buf).store(nxt)
            gl.thread_barrier()


@gluon.jit
def _slots(ks, c, lay: gl.constexpr, NPARTS: gl.constexpr, AHEAD: gl.constexpr,
           WIDE: gl.constexpr, CHUNK: gl.constexpr):  # fmt: skip
    """(valid, slot) of the chunk's keys, in layout lay; masked keys read slot 0. ks: (the
    block's prefetched indices in shared memory (AHEAD), block i, keys, caches, slots)."""
    ib, i, keys, cache, x_cache, slots = ks
    if AHEAD:
        idx = ib.slice(c * CHUNK, CHUNK).load(lay)
    else:
        idx, _ = _block_keys(i, keys, cache, x_cache, c * CHUNK + gl.arange(0, CHUNK, lay), NPARTS)
    if WIDE:
        idx = idx.to(gl.int64)
    valid = (idx >= 0) & (idx < slots)
    return valid, gl.where(valid, idx, 0)


@gluon.jit
def _bf16_chunk(ks, c, rows_ptr, s0, kb, tb, HAS_TAIL: gl.constexpr, NPARTS: gl.constexpr,
                AHEAD: gl.constexpr, CHUNK: gl.constexpr, PW: gl.constexpr):  # fmt: skip
    """Sparse prefill's bf16 rows: copied as they are (cp.async, 16 bytes a thread; masked
    rows are zero-filled) into kb rows and, for d_qk 576, the last 64 columns into tb rows."""
    ROWS: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [PW, 1], [1, 0])
    valid, slot = _slots(ks, c, gl.SliceLayout(1, ROWS), NPARTS, AHEAD, False, CHUNK)
    col = gl.arange(0, D_V, gl.SliceLayout(0, ROWS))
    rows = rows_ptr + slot[:, None] * s0
    async_copy.async_copy_global_to_shared(kb.slice(c * CHUNK, CHUNK), rows + col[None, :],
                                           mask=valid[:, None])  # fmt: skip
    if HAS_TAIL:
        TAIL: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [PW, 1], [1, 0])
        valid_t, slot_t = _slots(ks, c, gl.SliceLayout(1, TAIL), NPARTS, AHEAD, False, CHUNK)
        r = gl.arange(0, ROPE, gl.SliceLayout(0, TAIL))
        tail = rows_ptr + slot_t[:, None] * s0 + D_V + r[None, :]
        async_copy.async_copy_global_to_shared(tb.slice(c * CHUNK, CHUNK), tail,
                                               mask=valid_t[:, None])  # fmt: skip


@gluon.jit
def _v32_chunk(ks, c, u8, u16, f32, s0, s1, kb, tb, P: gl.constexpr, HAS_TAIL: gl.constexpr,
               NPARTS: gl.constexpr, AHEAD: gl.constexpr, WIDE: gl.constexpr,
               CHUNK: gl.constexpr, PW: gl.constexpr):  # fmt: skip
    """V3.2 records: 4 tiles of 128 e4m3 x fp32 scale -> kb rows; the bf16 rope -> tb rows."""
    V32_GATHER: gl.constexpr = gl.BlockedLayout([1, 1, 16], [1, 4, 8], [PW, 1, 1], [2, 1, 0])
    ROPE_ROWS: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [PW, 1], [1, 0])
    key_l: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, V32_GATHER))
    valid, slot = _slots(ks, c, key_l, NPARTS, AHEAD, WIDE, CHUNK)
    rec = (slot // P) * s0 + (slot % P) * s1
    g = gl.arange(0, V32_TILES, gl.SliceLayout(0, gl.SliceLayout(2, V32_GATHER)))
    col = gl.arange(0, V32_TILE, gl.SliceLayout(0, gl.SliceLayout(1, V32_GATHER)))
    at = rec[:, None, None] + (g[None, :, None] * V32_TILE + col[None, None, :])
    raw = gl.load(u8 + at, mask=valid[:, None, None], other=0)
    scale = gl.load(f32 + (rec[:, None] + V32_SCALES_AT) // 4 + g[None, :], mask=valid[:, None],
                    other=0.0)  # fmt: skip
    x = raw.to(gl.float8e4nv, bitcast=True).to(gl.float32) * scale[:, :, None]
    k = gl.reshape(x.to(gl.bfloat16), [CHUNK, D_V])
    kb.slice(c * CHUNK, CHUNK).store(k)
    if HAS_TAIL:
        valid_r, slot_r = _slots(ks, c, gl.SliceLayout(1, ROPE_ROWS), NPARTS, AHEAD, WIDE, CHUNK)
        rec_r = (slot_r // P) * s0 + (slot_r % P) * s1
        r = gl.arange(0, ROPE, gl.SliceLayout(0, ROPE_ROWS))
        rope = gl.load(u16 + (rec_r[:, None] + V32_ROPE_AT) // 2 + r[None, :],
                       mask=valid_r[:, None], other=0)  # fmt: skip
        tb.slice(c * CHUNK, CHUNK).store(rope.to(gl.bfloat16, bitcast=True))


@gluon.jit
def _v4_chunk(ks, c, u8, u16, s0, kb, P: gl.constexpr, NPARTS: gl.constexpr,
              AHEAD: gl.constexpr, WIDE: gl.constexpr, CHUNK: gl.constexpr,
              PW: gl.constexpr):  # fmt: skip
    """V4 pages: 7 tiles of 64 e4m3 x 2^(ue8m0 - 127) -> kb rows, columns 0..447; the 64 bf16
    rope -> columns 448..511, written after them (the first store leaves zeros there)."""
    V4_GATHER: gl.constexpr = gl.BlockedLayout([1, 1, 16], [1, 8, 4], [PW, 1, 1], [2, 1, 0])
    ROPE_ROWS: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [PW, 1], [1, 0])
    key_l: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, V4_GATHER))
    valid, slot = _slots(ks, c, key_l, NPARTS, AHEAD, WIDE, CHUNK)
    page = (slot // P) * s0
    data = page + (slot % P) * V4_DATA
    scl = page + P * V4_DATA + (slot % P) * V4_SCALE
    g = gl.arange(0, 8, gl.SliceLayout(0, gl.SliceLayout(2, V4_GATHER)))
    col = gl.arange(0, V4_TILE, gl.SliceLayout(0, gl.SliceLayout(1, V4_GATHER)))
    is_nope = g[None, :, None] < V4_TILES
    raw = gl.load(u8 + data[:, None, None] + (g[None, :, None] * V4_TILE + col[None, None, :]),
                  mask=valid[:, None, None] & is_nope, other=0)  # fmt: skip
    sb = gl.load(u8 + scl[:, None] + g[None, :], mask=valid[:, None], other=127).to(gl.uint32)
    sc = gl.where(sb == 0, 0x400000, sb << 23).to(gl.float32, bitcast=True)
    deq = raw.to(gl.float8e4nv, bitcast=True).to(gl.float32) * sc[:, :, None]
    valid_r, slot_r = _slots(ks, c, gl.SliceLayout(1, ROPE_ROWS), NPARTS, AHEAD, WIDE, CHUNK)
    data_r = (slot_r // P) * s0 + (slot_r % P) * V4_DATA
    r = gl.arange(0, ROPE, gl.SliceLayout(0, ROPE_ROWS))
    rope = gl.load(u16 + (data_r[:, None] + V4_ROPE_AT) // 2 + r[None, :], mask=valid_r[:, None],
                   other=0)  # fmt: skip
    rows = kb.slice(c * CHUNK, CHUNK)
    rows.store(gl.reshape(deq.to(gl.bfloat16), [CHUNK, D_V]))
    gl.thread_barrier()  # the rope overwrites the zeros of tile 7 stored by other threads
    rows.slice(V4_ROPE_AT, ROPE, dim=1).store(rope.to(gl.bfloat16, bitcast=True))


@gluon.jit
def _store(acc, m_i, l_i, outs, parts, sink_ptr, t, hb, split, H, S_Q, HAS_SINK: gl.constexpr,
           HAS_MAXL: gl.constexpr, SPLIT: gl.constexpr, LAY: gl.constexpr,
           ROWS: gl.constexpr):  # fmt: skip
    """Normalize acc (ROWS heads x 512, layout LAY); write the split's fp32 partial and base-2
    lse, or the final bf16 output with the sink applied and the natural-log lse."""
    row_l: gl.constexpr = gl.SliceLayout(1, LAY)
    m_i = gl.convert_layout(m_i, row_l)
    l_i = gl.convert_layout(l_i, row_l)
    heads = hb * ROWS + gl.arange(0, ROWS, row_l)
    hmask = heads < H
    c = gl.arange(0, D_V, gl.SliceLayout(0, LAY))
    has_key = l_i > 0.0
    o = acc / gl.where(has_key, l_i, 1.0)[:, None]
    lse2 = gl.where(has_key, m_i + gl.log2(gl.where(has_key, l_i, 1.0)), float("-inf"))
    if SPLIT:
        at = (t * gl.num_programs(1) + split) * H + heads
        gl.store(parts.o + at[:, None] * D_V + c[None, :], o, mask=hmask[:, None])
        gl.store(parts.lse + at, lse2, mask=hmask)
    else:
        if HAS_SINK:
            sink2 = gl.load(sink_ptr + heads, mask=hmask, other=float("-inf")) * LOG2E
            o = o / gl.where(has_key, 1.0 + gl.exp2(sink2 - lse2), 1.0)[:, None]
        o_ptrs = outs.out + t * outs.st + heads[:, None] * outs.sh + c[None, :]
        gl.store(o_ptrs, o.to(gl.bfloat16), mask=hmask[:, None])
        lse = gl.where(has_key, lse2 * LN2, float("inf"))
        lse_at = (t // S_Q) * outs.lse_sb + (t % S_Q) * outs.lse_ss + heads * outs.lse_sh
        gl.store(outs.lse + lse_at, lse, mask=hmask)
        if HAS_MAXL:
            gl.store(outs.maxl + t * H + heads, m_i * LN2, mask=hmask)  # (T, H) contiguous


KERNELS = {"attn": attn_kernel}
