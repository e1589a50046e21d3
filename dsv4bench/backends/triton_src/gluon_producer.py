"""The Gluon attention kernel's producer (gluon_attention.py): the key list of a program and
the warps that gather each key block into a shared-memory buffer, dequantizing the FP8 caches
(V3.2 records, V4 pages) to bf16 in registers or copying sparse prefill's bf16 rows with
cp.async."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    async_copy,
    fence_async_shared,
    mbarrier,
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
BLOCK_N = gl.constexpr(64)


@gluon.jit
def block_keys(i, keys, cache, x_cache, k, NPARTS: gl.constexpr):
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
def produce(k_main_s, k_tail_s, idx_s, full, empty, cache, x_cache, keys, LAYOUT: gl.constexpr,
             P: gl.constexpr, HAS_TAIL: gl.constexpr, NPARTS: gl.constexpr,
             WIDE: gl.constexpr, CHUNK: gl.constexpr, PW: gl.constexpr,
             AHEAD: gl.constexpr, ASYNC_FILL: gl.constexpr, SKIP: gl.constexpr):  # fmt: skip
    """The producer warps (PW): each key block gathered, dequantized to bf16 and written into
    the free buffer, CHUNK keys at a time, a key's 16-byte pieces across a warp. With AHEAD
    the next block's indices load while this block's rows do and wait in idx_s (two
    buffers): a block then costs one memory round trip, not two (index, then rows). With
    ASYNC_FILL (bf16 rows) the buffer's full barrier completes when the copies land, so the
    producer goes on to the next buffer without waiting for them (the consumers fence)."""
    start = keys[4]
    stop = keys[5]
    main_blocks = keys[1]
    k = gl.arange(0, BLOCK_N, gl.BlockedLayout([1], [32], [PW], [0]))
    if AHEAD:
        first, _ = block_keys(start, keys, cache, x_cache, k, NPARTS)
        idx_s.index(0).store(first)
        gl.thread_barrier()
    for i in range(start, stop):
        n = i - start
        buf = n % 2
        if AHEAD:
            nxt, _ = block_keys(i + 1, keys, cache, x_cache, k, NPARTS)  # -1 past the list
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
        if SKIP != 1:  # measurement: 1 leaves out the gather
            for c in gl.static_range(BLOCK_N // CHUNK):
                if LAYOUT == BF16:
                    _bf16_chunk(ks, c, u8, s0, kb, tb, HAS_TAIL, NPARTS, AHEAD, CHUNK, PW)
                elif LAYOUT == V32:
                    _v32_chunk(ks, c, u8, u16, f32, s0, s1, kb, tb, P, HAS_TAIL, NPARTS, AHEAD,
                               WIDE, CHUNK, PW)  # fmt: skip
                else:
                    _v4_chunk(ks, c, u8, u16, s0, kb, P, NPARTS, AHEAD, WIDE, CHUNK, PW)
        if ASYNC_FILL:
            async_copy.mbarrier_arrive(full.index(buf))  # when this thread's copies have landed
            gl.thread_barrier()  # every thread's pending arrival counted before the last one
        else:
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
        idx, _ = block_keys(i, keys, cache, x_cache, c * CHUNK + gl.arange(0, CHUNK, lay), NPARTS)
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
