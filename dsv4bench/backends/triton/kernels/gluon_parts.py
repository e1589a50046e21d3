"""Pieces the Gluon attention kernel's programs share (gluon_attention.py, a program an item,
and gluon_resident.py, resident programs): the key list of a token, q's copy into shared
memory, the wait for a key block, the narrow consumers' block (the heads the wgmma's N) with
its softmax, and the lse store."""

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

from dsv4bench.backends.triton.kernels import layout as L
from dsv4bench.backends.triton.kernels.gluon_producer import BLOCK_N, block_keys

D_V = gl.constexpr(L.D_V)
ROPE = gl.constexpr(L.ROPE)
LN2 = gl.constexpr(0.6931471805599453)
LOG2E = gl.constexpr(1.4426950408889634)
MERGE_SL = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
WORDS_SL = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, [0]))
Q_ROWS4 = gl.constexpr(gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0]))  # 4 warps' q rows


@gluon.jit
def key_list(cache, x_cache, t, split, LENS_DIV, blocks_per_split, NPARTS: gl.constexpr,
             HAS_LENS: gl.constexpr, HAS_X_LENS: gl.constexpr):  # fmt: skip
    """(t, main blocks, length, x_length, start, stop): the joined key-block list of both
    caches (main first, blocks past a topk_length left out) and split `split`'s range of it."""
    length = key_length(cache, t, LENS_DIV, HAS_LENS)
    main_blocks = (length + BLOCK_N - 1) // BLOCK_N
    total = main_blocks
    x_length = length * 0
    if NPARTS == 2:
        x_length = key_length(x_cache, t, LENS_DIV, HAS_X_LENS)
        total += (x_length + BLOCK_N - 1) // BLOCK_N
    start = split * blocks_per_split
    stop = gl.minimum(start + blocks_per_split, total)
    return t, main_blocks, length, x_length, start, stop


@gluon.jit
def copy_q(q, t, hb, H, HAS_TAIL: gl.constexpr, ROWS: gl.constexpr, LAY: gl.constexpr,
           q_main_s, q_tail_s, q_bar):  # fmt: skip
    """The program's ROWS heads of token t copied (cp.async; heads past H zero-filled) into
    q_main_s = q[:, :512] and, with HAS_TAIL, q_tail_s = q[:, 512:576]; q_bar completes when
    every thread's copies have landed (the consumers wait on it, await_q)."""
    heads = hb * ROWS + gl.arange(0, ROWS, gl.SliceLayout(1, LAY))
    hmask = heads < H
    row = q.ptr + t * q.st + heads[:, None] * q.sh
    c = gl.arange(0, D_V, gl.SliceLayout(0, LAY))
    async_copy.async_copy_global_to_shared(q_main_s, row + c[None, :], mask=hmask[:, None])
    if HAS_TAIL:
        r = gl.arange(0, ROPE, gl.SliceLayout(0, LAY))
        async_copy.async_copy_global_to_shared(q_tail_s, row + D_V + r[None, :],
                                               mask=hmask[:, None])  # fmt: skip
    async_copy.mbarrier_arrive(q_bar)
    gl.thread_barrier()  # every thread's pending arrival counted before the last one
    mbarrier.arrive(q_bar, count=1)


@gluon.jit
def await_q(q_bar):
    """A consumer's wait for q in shared memory (copy_q), before its first wgmma reads it."""
    mbarrier.wait(q_bar, 0)
    fence_async_shared()


@gluon.jit
def key_length(cache, t, LENS_DIV, HAS_LENS: gl.constexpr):
    n = cache.width + t.to(gl.int32) * 0
    if HAS_LENS:
        n = gl.minimum(gl.load(cache.lens + t // LENS_DIV), cache.width)
    return n


@gluon.jit
def await_block(i, buf, phase, keys, cache, x_cache, k, full, NPARTS: gl.constexpr,
                FENCE: gl.constexpr, pred=True):  # fmt: skip
    """A consumer's wait for key block i in buffer buf: its valid keys at offsets k (loaded
    before the wait), once the producer's full barrier has reached `phase` (no wait where
    pred is false: a block past the list, whose keys are all masked)."""
    idx, slots = block_keys(i, keys, cache, x_cache, k, NPARTS)
    valid = (idx >= 0) & (idx < slots)
    mbarrier.wait(full.index(buf), phase, pred=pred)
    if FENCE:  # the producer's cp.async writes, seen through the barrier, before wgmma reads
        fence_async_shared()
    return valid


@gluon.jit
def softmax_down(s, valid, m_i, l_acc, scale2, red_s):
    """The same over scores with the keys down axis 0, across the warps (the wgmma's M:
    narrow and alternate consumers). The block's max crosses the warps once, through red_s
    (one barrier; the caller's barrier after its P store orders red_s's reuse), and the sum
    is kept per key (l_acc) and summed by the caller once at the end: (p, alpha, m_i, l_acc)
    updated. Reduced every block as in _softmax_step, the two cost six barriers a block
    (prefill 5-9% slower: results/sm90/triton-gluon3-h100/NOTES.md)."""
    s = gl.where(gl.expand_dims(valid, 1), s * scale2, float("-inf"))
    NH: gl.constexpr = s.shape[1]
    NW: gl.constexpr = red_s.type.shape[0] // NH
    warp_max = gl.max(gl.reshape(s, [NW, s.shape[0] // NW, NH]), 1)  # over each warp's keys
    red_s._reinterpret(gl.float32, [NW, NH], MERGE_SL).store(warp_max)
    gl.thread_barrier()
    blk = red_s.slice(0, NH).load(m_i.type.layout)
    for w in gl.static_range(1, NW):
        blk = gl.maximum(blk, red_s.slice(w * NH, NH).load(m_i.type.layout))
    m_new = gl.maximum(m_i, blk)
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_i - m_use)
    p = gl.exp2(s - gl.expand_dims(m_use, 0))
    return p, alpha, m_new, l_acc * gl.expand_dims(alpha, 0) + p


@gluon.jit
def heads_n_block(bufs, buf, pb, s0, valid, acc, m_i, l_acc, scale2, red_s,
                  HAS_TAIL: gl.constexpr):  # fmt: skip
    """One key block of the narrow and alternate consumers (the heads the wgmma's N): S^T =
    K Q^T from key buffer buf, the softmax down the keys (softmax_down), P^T through pb,
    O^T += V^T P^T; (acc, m_i, l_acc) updated."""
    q_main_s, q_tail_s, k_main_s, k_tail_s, p_s, full, empty, red, q_bar = bufs
    kb = k_main_s.index(buf)
    s = warpgroup_mma(kb, q_main_s.permute((1, 0)), s0, use_acc=False, is_async=True)
    if HAS_TAIL:
        s = warpgroup_mma(k_tail_s.index(buf), q_tail_s.permute((1, 0)), s, is_async=True)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    p, alpha, m_i, l_acc = softmax_down(s, valid, m_i, l_acc, scale2, red_s)
    pb.store(p.to(gl.bfloat16))
    fence_async_shared()
    gl.thread_barrier()
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(0, acc.type.layout))[None, :]
    acc = warpgroup_mma(kb.permute((1, 0)), pb, acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    return acc, m_i, l_acc


@gluon.jit
def store_lse(m_i, l_i, heads, hmask, outs, parts, sink_ptr, t, split, H, S_Q,
              HAS_SINK: gl.constexpr, HAS_MAXL: gl.constexpr, SPLIT: gl.constexpr):  # fmt: skip
    """Write the heads' lse (base 2 into a split's partial; else natural log, and the max
    logits); (the divisor by l, the sink's divisor) a head."""
    has_key = l_i > 0.0
    l_div = gl.where(has_key, l_i, 1.0)
    lse2 = gl.where(has_key, m_i + gl.log2(l_div), float("-inf"))
    sink_div = gl.full_like(l_div, 1.0)
    if SPLIT:
        at = (t * gl.num_programs(1) + split) * H + heads
        gl.store(parts.lse + at, lse2, mask=hmask)
        if HAS_MAXL:
            gl.store(parts.maxl + at, m_i, mask=hmask)
    else:
        if HAS_SINK:
            sink2 = gl.load(sink_ptr + heads, mask=hmask, other=float("-inf")) * LOG2E
            sink_div = gl.where(has_key, 1.0 + gl.exp2(sink2 - lse2), 1.0)
        lse = gl.where(has_key, lse2 * LN2, float("inf"))
        lse_at = (t // S_Q) * outs.lse_sb + (t % S_Q) * outs.lse_ss + heads * outs.lse_sh
        gl.store(outs.lse + lse_at, lse, mask=hmask)
        if HAS_MAXL:
            gl.store(outs.maxl + t * H + heads, m_i * LN2, mask=hmask)  # (T, H) contiguous
    return l_div, sink_div
