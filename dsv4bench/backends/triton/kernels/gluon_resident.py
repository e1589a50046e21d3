"""The Gluon attention kernel's resident programs (PERSIST; sparse prefill's bf16 rows, the
alternate consumers): a program an SM, each consumer warpgroup whole (token, head block)
items of its own, so no state is merged and the producer runs on into the next items."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    async_copy,
    fence_async_shared,
    mbarrier,
)

from dsv4bench.backends.triton.kernels.gluon_parts import (
    D_V,
    Q_ROWS4,
    ROPE,
    WORDS_SL,
    await_block,
    copy_q,
    heads_n_block,
    key_list,
    store_lse,
)
from dsv4bench.backends.triton.kernels.gluon_producer import (
    BLOCK_N,
    bf16_copy,
    bf16_slots,
    block_keys,
    block_src,
)


@gluon.jit
def persistent(q, cache, x_cache, sink_ptr, outs, parts, H, S_Q, LENS_DIV, scale2,
               blocks_per_split, items, HAS_TAIL: gl.constexpr, NPARTS: gl.constexpr,
               HAS_LENS: gl.constexpr, HAS_X_LENS: gl.constexpr, HAS_SINK: gl.constexpr,
               HAS_MAXL: gl.constexpr, PRODUCER_WARPS: gl.constexpr, NH: gl.constexpr,
               CONSUMER_REGS: gl.constexpr, SKIP: gl.constexpr):  # fmt: skip
    """A resident program (bf16 rows, alternate consumers): consumer warpgroup W takes the
    program's items p + (2 j + W) G whole, with its own q buffer, and stores each itself, so
    no state is merged and the producer gathers the next item's blocks (and copies its q)
    while an item's last blocks are summed and stored. A program an item, set-up, the
    partitions' join and the merge cost V4-Flash prefill at 32 heads (10 key blocks a token)
    17% of its warp samples (results/sm90/triton-gluon3-h100/ncu-stalls.txt); resident, it
    runs 9% faster, and 6% at V3.2's 32 heads (results/sm90/triton-gluon4-h100/NOTES.md)."""
    main_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_V], gl.bfloat16)
    tail_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, ROPE], gl.bfloat16)
    qm_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([NH, D_V], gl.bfloat16)
    qt_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([NH, ROPE], gl.bfloat16)
    p_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, NH], gl.bfloat16)
    q_main_s = gl.allocate_shared_memory(gl.bfloat16, [2, NH, D_V], qm_sl)
    q_tail_s = gl.allocate_shared_memory(gl.bfloat16, [2, NH, ROPE], qt_sl)
    k_main_s = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, D_V], main_sl)
    k_tail_s = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, ROPE], tail_sl)
    p_s = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, NH], p_sl)
    red = gl.allocate_shared_memory(gl.float32, [2 * 4 * NH], WORDS_SL)
    idx_s = gl.allocate_shared_memory(gl.int32, [2, BLOCK_N], WORDS_SL)  # a stream's block's
    # buffer, or q, W: the producer's and consumer W's (count 1: one arrival completes each)
    full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for b in gl.static_range(2):
        mbarrier.init(full.index(b), count=1)
        mbarrier.init(empty.index(b), count=1)
        mbarrier.init(q_full.index(b), count=1)
        mbarrier.init(q_empty.index(b), count=1)
    fence_async_shared()
    gl.thread_barrier()
    bars = (full, empty, q_full, q_empty)
    smem = (q_main_s, q_tail_s, k_main_s, k_tail_s, p_s, red, idx_s)
    # fmt: off
    gl.warp_specialize(
        [(_produce_items, (q, smem, bars, cache, x_cache, H, LENS_DIV, blocks_per_split, items,
                           HAS_TAIL, NPARTS, HAS_LENS, HAS_X_LENS, PRODUCER_WARPS, NH, SKIP)),
         (_consume_items, (smem, bars, cache, x_cache, outs, parts, sink_ptr, H, S_Q, LENS_DIV,
                           scale2, blocks_per_split, items, HAS_TAIL, NPARTS, HAS_LENS,
                           HAS_X_LENS, HAS_SINK, HAS_MAXL, NH, SKIP, 0)),
         (_consume_items, (smem, bars, cache, x_cache, outs, parts, sink_ptr, H, S_Q, LENS_DIV,
                           scale2, blocks_per_split, items, HAS_TAIL, NPARTS, HAS_LENS,
                           HAS_X_LENS, HAS_SINK, HAS_MAXL, NH, SKIP, 1))],
        [4, 4], [CONSUMER_REGS, CONSUMER_REGS])
    # fmt: on


@gluon.jit
def _item_keys(k, H, cache, x_cache, LENS_DIV, blocks_per_split, NH: gl.constexpr,
               NPARTS: gl.constexpr, HAS_LENS: gl.constexpr,
               HAS_X_LENS: gl.constexpr):  # fmt: skip
    """(the key list of item k (key_list, one split), its head block)."""
    head_blocks = (H + NH - 1) // NH
    t = (k // head_blocks).to(gl.int64)
    keys = key_list(cache, x_cache, t, 0, LENS_DIV, blocks_per_split, NPARTS, HAS_LENS,
                    HAS_X_LENS)  # fmt: skip
    return keys, k % head_blocks


@gluon.jit
def _produce_items(q, smem, bars, cache, x_cache, H, LENS_DIV, blocks_per_split, items,
                   HAS_TAIL: gl.constexpr, NPARTS: gl.constexpr, HAS_LENS: gl.constexpr,
                   HAS_X_LENS: gl.constexpr, PW: gl.constexpr, NH: gl.constexpr,
                   SKIP: gl.constexpr):  # fmt: skip
    """The resident program's producer: for each pair of items (consumer 0's, consumer 1's)
    both q copies, then their key blocks in turn, into buffer 0 and buffer 1. A block's
    indices load while the other stream's block is copied and wait in idx_s."""
    q_main_s, q_tail_s, k_main_s, k_tail_s, p_s, red, idx_s = smem
    full, empty, q_full, q_empty = bars
    g = gl.num_programs(0)
    f0 = 0
    f1 = 0
    for r in range(gl.program_id(0), items, 2 * g):
        m = (r - gl.program_id(0)) // (2 * g)  # the pair's number: q buffers' phases
        keys0, hb0 = _item_keys(r, H, cache, x_cache, LENS_DIV, blocks_per_split, NH, NPARTS,
                                HAS_LENS, HAS_X_LENS)  # fmt: skip
        has1 = r + g < items
        keys1, hb1 = _item_keys(gl.minimum(r + g, items - 1), H, cache, x_cache, LENS_DIV,
                                blocks_per_split, NH, NPARTS, HAS_LENS, HAS_X_LENS)  # fmt: skip
        mbarrier.wait(q_empty.index(0), (m & 1) ^ 1)
        copy_q(q, keys0[0], hb0, H, HAS_TAIL, NH, Q_ROWS4, q_main_s.index(0), q_tail_s.index(0),
               q_full.index(0))  # fmt: skip
        n0 = keys0[5]
        n1 = n0 * 0
        if has1:
            mbarrier.wait(q_empty.index(1), (m & 1) ^ 1)
            copy_q(q, keys1[0], hb1, H, HAS_TAIL, NH, Q_ROWS4, q_main_s.index(1),
                   q_tail_s.index(1), q_full.index(1))  # fmt: skip
            n1 = keys1[5]
        k = gl.arange(0, BLOCK_N, gl.BlockedLayout([1], [32], [PW], [0]))
        idx0, _ = block_keys(0, keys0, cache, x_cache, k, NPARTS)
        idx1, _ = block_keys(0, keys1, cache, x_cache, k, NPARTS)
        for j in range(0, gl.maximum(n0, n1)):
            if j < n0:
                idx0 = _fill(j, keys0, 0, f0, idx0, idx_s, k, k_main_s, k_tail_s, full, empty,
                             cache, x_cache, HAS_TAIL, NPARTS, PW, SKIP)  # fmt: skip
                f0 += 1
            if j < n1:
                idx1 = _fill(j, keys1, 1, f1, idx1, idx_s, k, k_main_s, k_tail_s, full, empty,
                             cache, x_cache, HAS_TAIL, NPARTS, PW, SKIP)  # fmt: skip
                f1 += 1


@gluon.jit
def _fill(i, keys, W: gl.constexpr, f, idx, idx_s, k, k_main_s, k_tail_s, full, empty, cache,
          x_cache, HAS_TAIL: gl.constexpr, NPARTS: gl.constexpr, PW: gl.constexpr,
          SKIP: gl.constexpr):  # fmt: skip
    """Key block i of an item's list (its indices idx, loaded) copied into buffer W once it
    is free (its f-th fill); its full barrier completes when the copies land. Returns block
    i + 1's indices, in flight."""
    u8, u16, f32, s0, s1, slots = block_src(i, keys[1], cache, x_cache, NPARTS)
    ib = idx_s.index(W)
    ib.store(idx)
    gl.thread_barrier()
    nxt, _ = block_keys(i + 1, keys, cache, x_cache, k, NPARTS)  # -1 past the list
    sl = bf16_slots((ib, i, keys, cache, x_cache, slots), 0, NPARTS, True, BLOCK_N, PW)
    mbarrier.wait(empty.index(W), (f & 1) ^ 1)
    if SKIP != 1:  # measurement: 1 leaves out the gather
        bf16_copy(sl, 0, u8, s0, k_main_s.index(W), k_tail_s.index(W), HAS_TAIL, BLOCK_N, PW)
    async_copy.mbarrier_arrive(full.index(W))
    gl.thread_barrier()  # every thread's pending arrival counted (and ib read) before the last
    mbarrier.arrive(full.index(W), count=1)
    return nxt


@gluon.jit
def _consume_items(smem, bars, cache, x_cache, outs, parts, sink_ptr, H, S_Q, LENS_DIV, scale2,
                   blocks_per_split, items, HAS_TAIL: gl.constexpr, NPARTS: gl.constexpr,
                   HAS_LENS: gl.constexpr, HAS_X_LENS: gl.constexpr, HAS_SINK: gl.constexpr,
                   HAS_MAXL: gl.constexpr, NH: gl.constexpr, SKIP: gl.constexpr,
                   W: gl.constexpr):  # fmt: skip
    """Consumer warpgroup W of a resident program: its items whole (heads_n_block over
    buffer W, q buffer W), each stored as soon as its last block is summed."""
    q_main_s, q_tail_s, k_main_s, k_tail_s, p_s, red, idx_s = smem
    full, empty, q_full, q_empty = bars
    lay: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, NH, 16])  # fmt: skip
    g = gl.num_programs(0)
    bufs = (q_main_s.index(W), q_tail_s.index(W), k_main_s, k_tail_s, p_s, full, empty, red,
            q_full.index(W))  # fmt: skip
    pb = p_s.index(W)
    red_w = red.slice(W * 4 * NH, 4 * NH)
    s0 = gl.zeros([BLOCK_N, NH], gl.float32, lay)
    k_rows = gl.arange(0, BLOCK_N, gl.SliceLayout(1, lay))
    cnt = 0
    for k in range(gl.program_id(0) + W * g, items, 2 * g):
        m = (k - gl.program_id(0)) // (2 * g)
        keys, hb = _item_keys(k, H, cache, x_cache, LENS_DIV, blocks_per_split, NH, NPARTS,
                              HAS_LENS, HAS_X_LENS)  # fmt: skip
        mbarrier.wait(q_full.index(W), m & 1)
        fence_async_shared()
        m_i = gl.full([NH], float("-inf"), gl.float32, gl.SliceLayout(0, lay))
        acc = gl.zeros([D_V, NH], gl.float32, lay)
        l_acc = s0
        for i in range(keys[4], keys[5]):
            # = W, but not to the compiler: with a constant buffer the dots' descriptors are
            # hoisted out of the loops and spill
            buf = W + i // (keys[5] + 1)
            valid = await_block(i, buf, cnt & 1, keys, cache, x_cache, k_rows, full, NPARTS,
                                True)  # fmt: skip
            if SKIP != 2:  # measurement: 2 leaves out the dots and the softmax
                acc, m_i, l_acc = heads_n_block(bufs, buf, pb, s0, valid, acc, m_i, l_acc,
                                                scale2, red_w, HAS_TAIL)  # fmt: skip
            mbarrier.arrive(empty.index(buf), count=1)
            cnt += 1
        mbarrier.arrive(q_empty.index(W), count=1)
        _store_heads_n(acc, m_i, gl.sum(l_acc, 0), outs, parts, sink_ptr, keys[0], hb, H, S_Q,
                       HAS_SINK, HAS_MAXL, NH)  # fmt: skip


@gluon.jit
def _store_heads_n(acc, m_i, l_i, outs, parts, sink_ptr, t, hb, H, S_Q, HAS_SINK: gl.constexpr,
                   HAS_MAXL: gl.constexpr, NH: gl.constexpr):  # fmt: skip
    """_store of acc^T (512 x NH, the narrow consumers' layout) as the final output, from the
    consumer's own registers."""
    heads = hb * NH + gl.arange(0, NH, gl.SliceLayout(0, acc.type.layout))
    hmask = heads < H
    l_div, sink_div = store_lse(m_i, l_i, heads, hmask, outs, parts, sink_ptr, t, 0, H, S_Q,
                                HAS_SINK, HAS_MAXL, False)  # fmt: skip
    o = acc / l_div[None, :]
    if HAS_SINK:
        o = o / sink_div[None, :]
    # stored 64 rows at a time (one pointer tensor for all 512 rows spills): the wgmma layout
    # repeats its 64 rows in registers, so the row blocks split off within each thread
    blocks = gl.permute(gl.reshape(o.to(gl.bfloat16), [2, 2, 2, BLOCK_N, NH]), (3, 4, 0, 1, 2))
    b0, b1 = gl.split(blocks)  # row block 4 r2 + 2 r1 + r0: r0 = 0, 1
    b00, b01 = gl.split(b0)
    b10, b11 = gl.split(b1)
    row = outs.out + t * outs.st
    _store_rows(gl.split(b00), 0, row, heads, hmask, outs.sh)
    _store_rows(gl.split(b01), 2, row, heads, hmask, outs.sh)
    _store_rows(gl.split(b10), 1, row, heads, hmask, outs.sh)
    _store_rows(gl.split(b11), 3, row, heads, hmask, outs.sh)


@gluon.jit
def _store_rows(pair, r: gl.constexpr, row, heads, hmask, sh):
    """Row blocks r and r + 4 (64 output columns each, x NH heads) of a token's output."""
    lo, hi = pair
    dims = gl.arange(0, BLOCK_N, gl.SliceLayout(1, lo.type.layout))
    h = gl.convert_layout(heads, gl.SliceLayout(0, lo.type.layout))
    m = gl.convert_layout(hmask, gl.SliceLayout(0, lo.type.layout))
    ptrs = row + h[None, :] * sh + dims[:, None]
    gl.store(ptrs + r * BLOCK_N, lo, mask=m[None, :])
    gl.store(ptrs + (r + 4) * BLOCK_N, hi, mask=m[None, :])
