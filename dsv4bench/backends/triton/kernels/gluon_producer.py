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

from dsv4bench.backends.triton.kernels import layout as L

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
             AHEAD: gl.constexpr, ASYNC_FILL: gl.constexpr, PIPE: gl.constexpr,
             SKIP: gl.constexpr, PREFETCH: gl.constexpr = 0, bias_s=None,
             KEY_BIAS: gl.constexpr = False):  # fmt: skip
    """The producer warps (PW): each key block gathered, dequantized to bf16 and written into
    the free buffer, CHUNK keys at a time. With PIPE (V3.2 records) the gather is a pipeline
    over chunks (_produce_v32_pipelined), else a block at a time (_produce_blocks), which
    with PREFETCH asks L2 for the rows of the block PREFETCH blocks ahead."""
    if PIPE:
        _produce_v32_pipelined(k_main_s, k_tail_s, full, empty, cache, x_cache, keys, P,
                               HAS_TAIL, NPARTS, WIDE, CHUNK, PW, SKIP, PIPE)  # fmt: skip
    else:
        _produce_blocks(k_main_s, k_tail_s, idx_s, full, empty, cache, x_cache, keys, LAYOUT,
                        P, HAS_TAIL, NPARTS, WIDE, CHUNK, PW, AHEAD, ASYNC_FILL,
                        SKIP, PREFETCH, bias_s, KEY_BIAS)  # fmt: skip


@gluon.jit
def _produce_blocks(k_main_s, k_tail_s, idx_s, full, empty, cache, x_cache, keys,
                    LAYOUT: gl.constexpr, P: gl.constexpr, HAS_TAIL: gl.constexpr,
                    NPARTS: gl.constexpr, WIDE: gl.constexpr, CHUNK: gl.constexpr,
                    PW: gl.constexpr, AHEAD: gl.constexpr, ASYNC_FILL: gl.constexpr,
                    SKIP: gl.constexpr, PREFETCH: gl.constexpr, bias_s,
                    KEY_BIAS: gl.constexpr):  # fmt: skip
    """A block at a time: its rows loaded, a key's 16-byte pieces across a warp, then stored.
    With AHEAD the next block's indices load while this block's rows do and wait in idx_s
    (two buffers): a block then costs one memory round trip, not two (index, then rows).
    With ASYNC_FILL (bf16 rows) the buffer's full barrier completes when the copies land, so
    the producer goes on to the next buffer without waiting for them (the consumers fence).
    With PREFETCH (d) block i + d's indices load with block i's rows and, once block i is
    handed over, its rows are prefetched into L2: they travel while the producer waits for
    a free buffer, when no load of its own is in flight (FlashMLA's producer prefetches the
    same way). With KEY_BIAS each block's key mask goes into bias_s (0 or -inf a key) with its
    rows: the lead consumer adds it to its scores instead of loading the indices itself."""
    start = keys[4]
    stop = keys[5]
    main_blocks = keys[1]
    k = gl.arange(0, BLOCK_N, gl.BlockedLayout([1], [32], [PW], [0]))
    kp = gl.arange(0, BLOCK_N, gl.SliceLayout(1, _lines(PW)))
    if AHEAD:
        first, _ = block_keys(start, keys, cache, x_cache, k, NPARTS)
        idx_s.index(0).store(first)
        gl.thread_barrier()
    if PREFETCH:
        for d in gl.static_range(1, PREFETCH):
            early, _ = block_keys(start + d, keys, cache, x_cache, kp, NPARTS)
            _prefetch(early, start + d, main_blocks, cache, x_cache, LAYOUT, P, HAS_TAIL,
                      NPARTS, WIDE, PW)  # fmt: skip
    for i in range(start, stop):
        n = i - start
        buf = n % 2
        if AHEAD:
            nxt, _ = block_keys(i + 1, keys, cache, x_cache, k, NPARTS)  # -1 past the list
        if PREFETCH:
            ahead, _ = block_keys(i + PREFETCH, keys, cache, x_cache, kp, NPARTS)
        u8, u16, f32, s0, s1, slots = block_src(i, main_blocks, cache, x_cache, NPARTS)
        if KEY_BIAS:  # with AHEAD the block's indices are in idx_s already
            if AHEAD:
                kidx = idx_s.index(buf).load(k.type.layout)
            else:
                kidx, _ = block_keys(i, keys, cache, x_cache, k, NPARTS)
            kbias = gl.where((kidx >= 0) & (kidx < slots), 0.0, float("-inf"))
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
        if KEY_BIAS:
            bias_s.index(buf).store(kbias)
            gl.thread_barrier()
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
        if PREFETCH:
            _prefetch(ahead, i + PREFETCH, main_blocks, cache, x_cache, LAYOUT, P, HAS_TAIL,
                      NPARTS, WIDE, PW)  # fmt: skip


@gluon.constexpr_function
def _lines(PW):
    """The prefetch's layout: (64 keys, 8 of a key's 128-byte lines) over PW warps."""
    return gl.BlockedLayout([1, 2], [16, 2], [PW, 1], [1, 0])


@gluon.jit
def _prefetch(idx, i, main_blocks, cache, x_cache, LAYOUT: gl.constexpr, P: gl.constexpr,
              HAS_TAIL: gl.constexpr, NPARTS: gl.constexpr, WIDE: gl.constexpr,
              PW: gl.constexpr):  # fmt: skip
    """prefetch.global.L2 of every 128-byte line that key block i's rows (indices idx, in
    _lines' key layout; -1 or out of range: none) are read from. A key takes up to 8 lines
    here: V4 5 of data (576 bytes from a 64-byte boundary) and its scales' line, V3.2 6 (656
    bytes), bf16 rows 8 (d_qk 512) or 9 (576: the ninth, the rope's last 64 bytes, is left
    out). A masked key asks for slot 0's lines."""
    LINES: gl.constexpr = _lines(PW)
    u8, u16, f32, s0, s1, slots = block_src(i, main_blocks, cache, x_cache, NPARTS)
    if WIDE:
        idx = idx.to(gl.int64)
    valid = (idx >= 0) & (idx < slots)
    slot = gl.where(valid, idx, 0)
    j = gl.arange(0, 8, gl.SliceLayout(0, LINES))[None, :]
    if LAYOUT == BF16:  # rows of bf16: s0 elements apart
        at = u16 + slot[:, None] * s0 + j * 64
    elif LAYOUT == V32:
        rec = (slot // P) * s0 + (slot % P) * s1
        at = u8 + rec[:, None] + gl.minimum(j, 5) * 128
    else:
        page = (slot // P) * s0
        data = page + (slot % P) * V4_DATA
        scl = page + P * V4_DATA + (slot % P) * V4_SCALE
        at = u8 + gl.where(j < 5, data[:, None] + j * 128, scl[:, None])
    gl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [at],
                              dtype=gl.int32, is_pure=False, pack=1)  # fmt: skip


@gluon.jit
def block_src(i, main_blocks, cache, x_cache, NPARTS: gl.constexpr):
    """(u8, u16, f32, s0, s1, slots): the cache that key block i reads."""
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
    return u8, u16, f32, s0, s1, slots


@gluon.jit
def _produce_v32_pipelined(k_main_s, k_tail_s, full, empty, cache, x_cache, keys,
                           P: gl.constexpr, HAS_TAIL: gl.constexpr, NPARTS: gl.constexpr,
                           WIDE: gl.constexpr, CHUNK: gl.constexpr, PW: gl.constexpr,
                           SKIP: gl.constexpr, DEPTH: gl.constexpr):  # fmt: skip
    """The V3.2 gather as a pipeline over CHUNK-key chunks that runs across block
    boundaries: while chunk j is dequantized and stored, chunks j + 1 .. j + DEPTH (1 or 2)
    are in flight and chunk j + DEPTH + 1's indices load. A block at a time, nothing is in
    flight while a block is stored or while the producer waits for a free buffer (V3.2
    decode at 8-16 heads: 6% faster pipelined, results/sm90/triton-gluon4-h100/NOTES.md)."""
    start = keys[4]
    stop = keys[5]
    NC: gl.constexpr = BLOCK_N // CHUNK
    ids = _v32_ids(start, 0, keys, cache, x_cache, CHUNK, NPARTS, PW)
    rows = _v32_rows(start, ids, stop, keys, cache, x_cache, P, HAS_TAIL, NPARTS, WIDE, PW)
    rows2 = rows
    if DEPTH == 2:
        ids = _v32_ids(start + 1 // NC, 1 % NC, keys, cache, x_cache, CHUNK, NPARTS, PW)
        rows2 = _v32_rows(start + 1 // NC, ids, stop, keys, cache, x_cache, P, HAS_TAIL, NPARTS,
                          WIDE, PW)  # fmt: skip
    ids = _v32_ids(start + DEPTH // NC, DEPTH % NC, keys, cache, x_cache, CHUNK, NPARTS, PW)
    for i in range(start, stop):
        n = i - start
        buf = n % 2
        kb = k_main_s.index(buf)
        tb = k_tail_s.index(buf)
        for c in gl.static_range(NC):
            nxt = _v32_rows(i + (c + DEPTH) // NC, ids, stop, keys, cache, x_cache, P, HAS_TAIL,
                            NPARTS, WIDE, PW)  # fmt: skip
            ids = _v32_ids(i + (c + DEPTH + 1) // NC, (c + DEPTH + 1) % NC, keys, cache, x_cache,
                           CHUNK, NPARTS, PW)  # fmt: skip
            if c == 0:
                mbarrier.wait(empty.index(buf), ((n // 2) & 1) ^ 1)
            if SKIP != 1:  # measurement: 1 leaves out the stores
                _v32_put_words(rows, c, kb, tb, HAS_TAIL, CHUNK)
            if DEPTH == 2:
                rows = rows2
                rows2 = nxt
            else:
                rows = nxt
        fence_async_shared()
        mbarrier.arrive(full.index(buf), count=1)


@gluon.jit
def _v32_ids(i, c, keys, cache, x_cache, CHUNK: gl.constexpr, NPARTS: gl.constexpr,
             PW: gl.constexpr):  # fmt: skip
    """Key block i's chunk c: its indices in the gather's and the rope's layouts."""
    k = c * CHUNK + gl.arange(0, CHUNK, gl.SliceLayout(1, gl.SliceLayout(2, _v32_words(PW))))
    kr = c * CHUNK + gl.arange(0, CHUNK, gl.SliceLayout(1, _rope_words(PW)))
    idx, _ = block_keys(i, keys, cache, x_cache, k, NPARTS)
    idx_r, _ = block_keys(i, keys, cache, x_cache, kr, NPARTS)
    return idx, idx_r


@gluon.jit
def _v32_rows(i, ids, stop, keys, cache, x_cache, P: gl.constexpr, HAS_TAIL: gl.constexpr,
              NPARTS: gl.constexpr, WIDE: gl.constexpr, PW: gl.constexpr):  # fmt: skip
    """The records of key block i at indices ids (_v32_ids), loaded (none past stop): the
    e4m3 bytes and the rope as 32-bit words (carried to the next step in a quarter, and a
    half, of the registers that bytes and halves would take), the scales."""
    u8, u16, f32, s0, s1, slots = block_src(i, keys[1], cache, x_cache, NPARTS)
    idx, idx_r = ids
    live = i < stop
    if WIDE:
        idx = idx.to(gl.int64)
        idx_r = idx_r.to(gl.int64)
    valid = (idx >= 0) & (idx < slots) & live
    valid_r = (idx_r >= 0) & (idx_r < slots) & live
    WL: gl.constexpr = _v32_words(PW)
    slot = gl.where(valid, idx, 0)
    rec = (slot // P) * s0 + (slot % P) * s1
    g = gl.arange(0, V32_TILES, gl.SliceLayout(0, gl.SliceLayout(2, WL)))
    w = gl.arange(0, V32_TILE // 4, gl.SliceLayout(0, gl.SliceLayout(1, WL)))
    at = rec[:, None, None] // 4 + (g[None, :, None] * (V32_TILE // 4) + w[None, None, :])
    words = gl.load(f32 + at, mask=valid[:, None, None], other=0.0)
    scale = gl.load(f32 + (rec[:, None] + V32_SCALES_AT) // 4 + g[None, :], mask=valid[:, None],
                    other=0.0)  # fmt: skip
    slot_r = gl.where(valid_r, idx_r, 0)
    rec_r = (slot_r // P) * s0 + (slot_r % P) * s1
    r = gl.arange(0, ROPE // 2, gl.SliceLayout(0, _rope_words(PW)))
    rope = gl.load(f32 + (rec_r[:, None] + V32_ROPE_AT) // 4 + r[None, :],
                   mask=valid_r[:, None] & HAS_TAIL, other=0.0)  # fmt: skip
    return words, scale, rope


@gluon.jit
def _v32_put_words(rows, c, kb, tb, HAS_TAIL: gl.constexpr, CHUNK: gl.constexpr):
    """_v32_put of records loaded as words (_v32_rows): each word's four e4m3 in order (a
    join's new axis is the last, so bytes 0 and 2 are joined, then 1 and 3)."""
    words, scale, rope = rows
    u = words.to(gl.uint32, bitcast=True)
    b = gl.join(gl.join(u.to(gl.uint8), (u >> 16).to(gl.uint8)),
                gl.join((u >> 8).to(gl.uint8), (u >> 24).to(gl.uint8)))  # fmt: skip
    raw = gl.reshape(b, [CHUNK, V32_TILES, V32_TILE])
    scale = gl.convert_layout(scale, gl.SliceLayout(2, raw.type.layout))
    r = rope.to(gl.uint32, bitcast=True)
    halves = gl.join(r.to(gl.uint16), (r >> 16).to(gl.uint16))
    _v32_put((raw, scale, gl.reshape(halves, [CHUNK, ROPE])), c, kb, tb, HAS_TAIL, CHUNK)


@gluon.constexpr_function
def _v32_gather(PW):
    """The V3.2 gather's layout: (keys, tiles, 16 bytes a thread) over PW warps."""
    return gl.BlockedLayout([1, 1, 16], [1, 4, 8], [PW, 1, 1], [2, 1, 0])


@gluon.constexpr_function
def _v32_words(PW):
    """The same as 32-bit words: (keys, tiles, 4 words a thread) over PW warps."""
    return gl.BlockedLayout([1, 1, 4], [1, 4, 8], [PW, 1, 1], [2, 1, 0])


@gluon.constexpr_function
def _rope_words(PW):
    """The rope as 32-bit words: (keys, 32 words, 4 a thread) over PW warps."""
    return gl.BlockedLayout([1, 4], [4, 8], [PW, 1], [1, 0])


@gluon.constexpr_function
def _rope_rows(PW):
    """The rope's layout: (keys, 64 bf16, 8 a thread) over PW warps."""
    return gl.BlockedLayout([1, 8], [4, 8], [PW, 1], [1, 0])


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
    sl = bf16_slots(ks, c, NPARTS, AHEAD, CHUNK, PW)
    bf16_copy(sl, c, rows_ptr, s0, kb, tb, HAS_TAIL, CHUNK, PW)


@gluon.jit
def bf16_slots(ks, c, NPARTS: gl.constexpr, AHEAD: gl.constexpr, CHUNK: gl.constexpr,
               PW: gl.constexpr):  # fmt: skip
    """(valid, slot) of chunk c's rows in bf16_copy's two layouts (main columns, rope)."""
    ROWS: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [PW, 1], [1, 0])
    TAIL: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [PW, 1], [1, 0])
    valid, slot = _slots(ks, c, gl.SliceLayout(1, ROWS), NPARTS, AHEAD, False, CHUNK)
    valid_t, slot_t = _slots(ks, c, gl.SliceLayout(1, TAIL), NPARTS, AHEAD, False, CHUNK)
    return valid, slot, valid_t, slot_t


@gluon.jit
def bf16_copy(sl, c, rows_ptr, s0, kb, tb, HAS_TAIL: gl.constexpr, CHUNK: gl.constexpr,
              PW: gl.constexpr):  # fmt: skip
    """The cp.async of chunk c's rows (bf16_slots) into kb and, with HAS_TAIL, tb."""
    valid, slot, valid_t, slot_t = sl
    ROWS: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [PW, 1], [1, 0])
    col = gl.arange(0, D_V, gl.SliceLayout(0, ROWS))
    rows = rows_ptr + slot[:, None] * s0
    async_copy.async_copy_global_to_shared(kb.slice(c * CHUNK, CHUNK), rows + col[None, :],
                                           mask=valid[:, None])  # fmt: skip
    if HAS_TAIL:
        TAIL: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [PW, 1], [1, 0])
        r = gl.arange(0, ROPE, gl.SliceLayout(0, TAIL))
        tail = rows_ptr + slot_t[:, None] * s0 + D_V + r[None, :]
        async_copy.async_copy_global_to_shared(tb.slice(c * CHUNK, CHUNK), tail,
                                               mask=valid_t[:, None])  # fmt: skip


@gluon.jit
def _v32_chunk(ks, c, u8, u16, f32, s0, s1, kb, tb, P: gl.constexpr, HAS_TAIL: gl.constexpr,
               NPARTS: gl.constexpr, AHEAD: gl.constexpr, WIDE: gl.constexpr,
               CHUNK: gl.constexpr, PW: gl.constexpr):  # fmt: skip
    """V3.2 records: 4 tiles of 128 e4m3 x fp32 scale -> kb rows; the bf16 rope -> tb rows."""
    valid, slot = _slots(ks, c, gl.SliceLayout(1, gl.SliceLayout(2, _v32_gather(PW))), NPARTS,
                         AHEAD, WIDE, CHUNK)  # fmt: skip
    valid_r, slot_r = _slots(ks, c, gl.SliceLayout(1, _rope_rows(PW)), NPARTS, AHEAD, WIDE, CHUNK)
    rows = _v32_load(valid, slot, valid_r, slot_r, u8, u16, f32, s0, s1, P, HAS_TAIL, PW)
    _v32_put(rows, c, kb, tb, HAS_TAIL, CHUNK)


@gluon.jit
def _v32_load(valid, slot, valid_r, slot_r, u8, u16, f32, s0, s1, P: gl.constexpr,
              HAS_TAIL: gl.constexpr, PW: gl.constexpr):  # fmt: skip
    """(e4m3 bytes, scales, rope) of the records at slot (valid; in the gather's layout) and
    slot_r (valid_r; the rope's); the rope is zeros without HAS_TAIL."""
    V32_GATHER: gl.constexpr = _v32_gather(PW)
    ROPE_ROWS: gl.constexpr = _rope_rows(PW)
    rec = (slot // P) * s0 + (slot % P) * s1
    g = gl.arange(0, V32_TILES, gl.SliceLayout(0, gl.SliceLayout(2, V32_GATHER)))
    col = gl.arange(0, V32_TILE, gl.SliceLayout(0, gl.SliceLayout(1, V32_GATHER)))
    at = rec[:, None, None] + (g[None, :, None] * V32_TILE + col[None, None, :])
    raw = gl.load(u8 + at, mask=valid[:, None, None], other=0)
    scale = gl.load(f32 + (rec[:, None] + V32_SCALES_AT) // 4 + g[None, :], mask=valid[:, None],
                    other=0.0)  # fmt: skip
    rec_r = (slot_r // P) * s0 + (slot_r % P) * s1
    r = gl.arange(0, ROPE, gl.SliceLayout(0, ROPE_ROWS))
    rope = gl.load(u16 + (rec_r[:, None] + V32_ROPE_AT) // 2 + r[None, :],
                   mask=valid_r[:, None] & HAS_TAIL, other=0)  # fmt: skip
    return raw, scale, rope


@gluon.jit
def _v32_put(rows, c, kb, tb, HAS_TAIL: gl.constexpr, CHUNK: gl.constexpr):
    """Chunk c's loaded records (_v32_load) dequantized into kb's rows and the rope into tb's."""
    raw, scale, rope = rows
    x = raw.to(gl.float8e4nv, bitcast=True).to(gl.float32) * scale[:, :, None]
    kb.slice(c * CHUNK, CHUNK).store(gl.reshape(x.to(gl.bfloat16), [CHUNK, D_V]))
    if HAS_TAIL:
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
