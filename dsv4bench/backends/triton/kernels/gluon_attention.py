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
wgmma's N and the keys its M, so no head is padded to 64; with ALTERNATE the two consumer
warpgroups are partitions of their own that take alternate key blocks with all the heads and
merge at the end; resident (PERSIST, sparse prefill) each takes whole tokens of its own, so
no state is merged. SPLIT_PV (64 heads, config_for's pick) is FlashMLA's own split: one
warpgroup (the lead) runs QK over all 64 keys and the softmax and hands P to the other
through shared memory, and each runs PV for half of the output columns (LEAD_COLS 128: the
lead a quarter; KEY_BIAS: the lead's key mask comes from the producer). The producer is
gluon_producer.py. The plain Triton kernel cannot express this overlap: its dequantization,
both dots and the softmax are one serial chain per warp (results/sm90/triton-speed-h100/
NOTES.md; this kernel's: triton-gluon-h100/, triton-gluon2-h100/, triton-gluon3-h100/NOTES.md
and studies/triton-shapes/README.md).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from dsv4bench.backends.triton.kernels.gluon_parts import (
    D_V,
    MERGE_SL,
    Q_ROWS4,
    ROPE,
    WORDS_SL,
    await_block,
    await_q,
    copy_q,
    heads_n_block,
    key_list,
    store_lse,
)
from dsv4bench.backends.triton.kernels.gluon_producer import BLOCK_N, produce
from dsv4bench.backends.triton.kernels.gluon_resident import persistent

BLOCK_H = gl.constexpr(64)

# consumers (8 warps): S = Q K^T split by keys, O split by output columns, one warpgroup each
S_LAYOUT = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                  instr_shape=[16, 32, 16]))  # fmt: skip
O_LAYOUT = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                  instr_shape=[16, 256, 16]))  # fmt: skip
P_LAYOUT = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=O_LAYOUT, k_width=2))
Q_ROWS = gl.constexpr(gl.BlockedLayout([1, 8], [1, 32], [8, 1], [1, 0]))
TAIL_WORDS = gl.constexpr(BLOCK_N * ROPE // 2)  # fp32 words of one key buffer's rope tail
OUT_COLS = gl.constexpr(gl.BlockedLayout([1, 4], [2, 16], [4, 1], [1, 0]))  # 64 columns


@gluon.jit
def attn_kernel(q, cache, x_cache, sink_ptr, outs, parts, H, S_Q, LENS_DIV, scale2,
                blocks_per_split, items, LAYOUT: gl.constexpr, P: gl.constexpr,
                HAS_TAIL: gl.constexpr, NPARTS: gl.constexpr, HAS_LENS: gl.constexpr,
                HAS_X_LENS: gl.constexpr, HAS_SINK: gl.constexpr, HAS_MAXL: gl.constexpr,
                SPLIT: gl.constexpr, WIDE: gl.constexpr, CHUNK: gl.constexpr,
                PRODUCER_WARPS: gl.constexpr, PRODUCER_REGS: gl.constexpr,
                NARROW: gl.constexpr, NH: gl.constexpr, IDX_AHEAD: gl.constexpr,
                ALTERNATE: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                ASYNC_FILL: gl.constexpr, PIPE: gl.constexpr = 0,
                PERSIST: gl.constexpr = False, SKIP: gl.constexpr = 0,
                PREFETCH: gl.constexpr = 0, SPLIT_PV: gl.constexpr = False,
                KEY_BIAS: gl.constexpr = False, LEAD_COLS: gl.constexpr = 256,
                LEAD_REGS: gl.constexpr = 0, FOLLOW_REGS: gl.constexpr = 0):  # fmt: skip
    """Arguments as attention.py's attn_kernel (BLOCK_N = 64). A program takes
    BLOCK_H = 64 heads, or with NARROW the NH (16 or 32) heads are the wgmma's N and the keys
    its M: no head is padded to 64 (consumers: _consume_narrow). With ALTERNATE (narrow, 4
    warps a partition) the two consumer warpgroups are separate partitions that take
    alternate key blocks with all NH heads each and merge their states at the end
    (_consume_alternate). With PERSIST (alternate, one split) a program is resident and takes
    the (token, head block) items p, p + G, ... of the `items`, each consumer warpgroup every
    other one whole (persistent)."""
    if PERSIST:
        persistent(q, cache, x_cache, sink_ptr, outs, parts, H, S_Q, LENS_DIV, scale2,
                   blocks_per_split, items, HAS_TAIL, NPARTS, HAS_LENS, HAS_X_LENS,
                   HAS_SINK, HAS_MAXL, PRODUCER_WARPS, NH, CONSUMER_REGS, SKIP)  # fmt: skip
    else:
        _one_item(q, cache, x_cache, sink_ptr, outs, parts, H, S_Q, LENS_DIV, scale2,
                  blocks_per_split, LAYOUT, P, HAS_TAIL, NPARTS, HAS_LENS, HAS_X_LENS, HAS_SINK,
                  HAS_MAXL, SPLIT, WIDE, CHUNK, PRODUCER_WARPS, PRODUCER_REGS, NARROW, NH,
                  IDX_AHEAD, ALTERNATE, CONSUMER_REGS, ASYNC_FILL, PIPE, SKIP,
                  PREFETCH, SPLIT_PV, KEY_BIAS, LEAD_COLS, LEAD_REGS, FOLLOW_REGS)  # fmt: skip


@gluon.jit
def _one_item(q, cache, x_cache, sink_ptr, outs, parts, H, S_Q, LENS_DIV, scale2,
              blocks_per_split, LAYOUT: gl.constexpr, P: gl.constexpr,
              HAS_TAIL: gl.constexpr, NPARTS: gl.constexpr, HAS_LENS: gl.constexpr,
              HAS_X_LENS: gl.constexpr, HAS_SINK: gl.constexpr, HAS_MAXL: gl.constexpr,
              SPLIT: gl.constexpr, WIDE: gl.constexpr, CHUNK: gl.constexpr,
              PRODUCER_WARPS: gl.constexpr, PRODUCER_REGS: gl.constexpr,
              NARROW: gl.constexpr, NH: gl.constexpr, IDX_AHEAD: gl.constexpr,
              ALTERNATE: gl.constexpr, CONSUMER_REGS: gl.constexpr,
              ASYNC_FILL: gl.constexpr, PIPE: gl.constexpr, SKIP: gl.constexpr,
              PREFETCH: gl.constexpr, SPLIT_PV: gl.constexpr,
              KEY_BIAS: gl.constexpr, LEAD_COLS: gl.constexpr, LEAD_REGS: gl.constexpr,
              FOLLOW_REGS: gl.constexpr):  # fmt: skip
    """The program's one item: token program_id(2), head block program_id(0), split
    program_id(1)."""
    hb = gl.program_id(0)
    split = gl.program_id(1)
    t = gl.program_id(2).to(gl.int64)
    if SPLIT:  # the combine kernel may launch now (PDL); it waits for this grid's partials
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [],
                                  dtype=gl.int32, is_pure=False, pack=1)  # fmt: skip
    ROWS: gl.constexpr = NH if NARROW else BLOCK_H
    main_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_V], gl.bfloat16)
    tail_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, ROPE], gl.bfloat16)
    qm_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, D_V], gl.bfloat16)
    qt_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, ROPE], gl.bfloat16)
    p_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, NH], gl.bfloat16)
    q_rows: gl.constexpr = Q_ROWS4 if ALTERNATE or SPLIT_PV else Q_ROWS
    q_main_s = gl.allocate_shared_memory(gl.bfloat16, [ROWS, D_V], qm_sl)
    q_tail_s = gl.allocate_shared_memory(gl.bfloat16, [ROWS, ROPE], qt_sl)
    k_main_s = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, D_V], main_sl)
    k_tail_s = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, ROPE], tail_sl)
    if SPLIT_PV:  # P (heads x keys, the follower's wgmma A) and the lead's row vectors
        pp_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, BLOCK_N],
                                                                   gl.bfloat16)  # fmt: skip
        p_s = gl.allocate_shared_memory(gl.bfloat16, [1, BLOCK_H, BLOCK_N], pp_sl)
    else:
        p_s = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, NH], p_sl)
    idx_sl: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    idx_s = gl.allocate_shared_memory(gl.int32, [2, BLOCK_N], idx_sl)  # the producer's indices
    full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar.index(0), count=1)
    for b in gl.static_range(2):
        mbarrier.init(full.index(b), count=1)
        mbarrier.init(empty.index(b), count=2 if SPLIT_PV else 1)  # SPLIT_PV: both read it
    fence_async_shared()
    gl.thread_barrier()
    # q lands while the producer gathers the first block: the consumers wait on q_bar
    copy_q(q, t, hb, H, HAS_TAIL, ROWS, q_rows, q_main_s, q_tail_s, q_bar.index(0))
    keys = key_list(cache, x_cache, t, split, LENS_DIV, blocks_per_split, NPARTS, HAS_LENS,
                    HAS_X_LENS)  # fmt: skip
    # softmax_down's; SPLIT_PV: the lead's alpha, l and sink divisor for the follower
    RED: gl.constexpr = (4 * BLOCK_H) if SPLIT_PV else (2 * 4 * NH)
    red = gl.allocate_shared_memory(gl.float32, [RED], WORDS_SL)
    bufs = (q_main_s, q_tail_s, k_main_s, k_tail_s, p_s, full, empty, red, q_bar.index(0))
    # fmt: off
    # (the argument tuples are written out in each call: a tuple variable would carry the
    # constexprs into the partitions as plain values)
    if SPLIT_PV:
        hand = gl.allocate_shared_memory(gl.int64, [3, 1], mbarrier.MBarrierLayout())
        for b in gl.static_range(3):  # P written, P read, the lead's l and sink written
            mbarrier.init(hand.index(b), count=1)
        fence_async_shared()
        gl.thread_barrier()
        # KEY_BIAS: the producer's key mask a buffer, for the lead (0 or -inf a key)
        bias_s = gl.allocate_shared_memory(gl.float32, [2, BLOCK_N], WORDS_SL)
        # (LEAD_REGS, FOLLOW_REGS: tuning.split_pv_regs, more to the follower at LEAD_COLS 128)
        gl.warp_specialize(
            [(produce, (k_main_s, k_tail_s, idx_s, full, empty, cache, x_cache, keys, LAYOUT,
                         P, HAS_TAIL, NPARTS, WIDE, CHUNK, PRODUCER_WARPS, IDX_AHEAD,
                         ASYNC_FILL, PIPE, SKIP, PREFETCH, bias_s, KEY_BIAS)),
             (_lead, (bufs, hand, outs, parts, sink_ptr, t, hb, split, H, S_Q, cache, x_cache,
                      keys, scale2, HAS_TAIL, NPARTS, ASYNC_FILL, HAS_SINK, HAS_MAXL, SPLIT,
                      bias_s, KEY_BIAS, LEAD_COLS)),
             (_follow, (bufs, hand, outs, parts, t, hb, split, H, keys, ASYNC_FILL, HAS_SINK,
                        SPLIT, LEAD_COLS))],
            [4, 4], [LEAD_REGS, FOLLOW_REGS])
    elif ALTERNATE:
        acc_s, ml_s = _merge_buffers(k_main_s, k_tail_s, NH)
        gl.warp_specialize(
            [(produce, (k_main_s, k_tail_s, idx_s, full, empty, cache, x_cache, keys, LAYOUT,
                         P, HAS_TAIL, NPARTS, WIDE, CHUNK, PRODUCER_WARPS, IDX_AHEAD,
                         ASYNC_FILL, PIPE, SKIP, PREFETCH)),
             (_consume_alternate, (bufs, acc_s, ml_s, cache, x_cache, keys, scale2, HAS_TAIL,
                                   NPARTS, ASYNC_FILL, SKIP, 0)),
             (_consume_alternate, (bufs, acc_s, ml_s, cache, x_cache, keys, scale2, HAS_TAIL,
                                   NPARTS, ASYNC_FILL, SKIP, 1))],
            [4, 4], [CONSUMER_REGS, CONSUMER_REGS])
        _store_merged(acc_s, ml_s, outs, parts, sink_ptr, t, hb, split, H, S_Q, HAS_SINK,
                      HAS_MAXL, SPLIT, NH)
    elif NARROW:
        acc, m_i, l_i = gl.warp_specialize(
            [(_consume_narrow, (bufs, cache, x_cache, keys, scale2, HAS_TAIL, NPARTS,
                                ASYNC_FILL, SKIP)),
             (produce, (k_main_s, k_tail_s, idx_s, full, empty, cache, x_cache, keys, LAYOUT,
                         P, HAS_TAIL, NPARTS, WIDE, CHUNK, PRODUCER_WARPS, IDX_AHEAD,
                         ASYNC_FILL, PIPE, SKIP, PREFETCH))],
            [PRODUCER_WARPS], [PRODUCER_REGS])
        rows = gl.convert_layout(gl.permute(acc, (1, 0)), Q_ROWS)  # (heads, 512)
        _store(rows, m_i, l_i, outs, parts, sink_ptr, t, hb, split, H, S_Q, HAS_SINK, HAS_MAXL,
               SPLIT, Q_ROWS, NH)
    else:
        acc, m_i, l_i = gl.warp_specialize(
            [(_consume, (bufs, cache, x_cache, keys, scale2, HAS_TAIL, NPARTS, ASYNC_FILL,
                         SKIP)),
             (produce, (k_main_s, k_tail_s, idx_s, full, empty, cache, x_cache, keys, LAYOUT,
                         P, HAS_TAIL, NPARTS, WIDE, CHUNK, PRODUCER_WARPS, IDX_AHEAD,
                         ASYNC_FILL, PIPE, SKIP, PREFETCH))],
            [PRODUCER_WARPS], [PRODUCER_REGS])
        _store(acc, m_i, l_i, outs, parts, sink_ptr, t, hb, split, H, S_Q, HAS_SINK, HAS_MAXL,
               SPLIT, O_LAYOUT, BLOCK_H)
    # fmt: on


# SPLIT_PV (4-warp partitions): the lead's scores over all 64 keys, both halves' PV
LEAD_S = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                instr_shape=[16, 64, 16]))  # fmt: skip
HALF_O = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                instr_shape=[16, 256, 16]))  # fmt: skip
HALF = gl.constexpr(D_V // 2)
QUARTER_O = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                   instr_shape=[16, 128, 16]))  # fmt: skip


@gluon.jit
def _lead(bufs, hand, outs, parts, sink_ptr, t, hb, split, H, S_Q, cache, x_cache, keys, scale2,
          HAS_TAIL: gl.constexpr, NPARTS: gl.constexpr, FENCE: gl.constexpr,
          HAS_SINK: gl.constexpr, HAS_MAXL: gl.constexpr, SPLIT: gl.constexpr, bias_s,
          KEY_BIAS: gl.constexpr, LEAD_COLS: gl.constexpr):  # fmt: skip
    """SPLIT_PV's lead warpgroup (FlashMLA's schedule): S = Q K^T over all 64 keys of a block
    (one m64n64 wgmma chain: the softmax's row reductions stay within each warp, no barrier),
    P and the rescale alpha handed to the follower through shared memory, then PV for output
    columns 0 to LEAD_COLS - 1 (256 or 128) from P in registers; at the end its lse, and l and
    the sink's divisor for the follower. With KEY_BIAS the block's key mask comes from the
    producer (bias_s), not from index loads of its own. In _consume both warpgroups split the
    keys of S, so every block's row max and sum cross them and P goes through shared memory
    before either PV (11-19% slower on sparse prefill at 64-128 heads:
    results/sm90/studies/triton-shapes/README.md)."""
    q_main_s, q_tail_s, k_main_s, k_tail_s, p_s, full, empty, red, q_bar = bufs
    p_full = hand.index(0)
    p_free = hand.index(1)
    await_q(q_bar)
    start = keys[4]
    stop = keys[5]
    row_l: gl.constexpr = gl.SliceLayout(1, LEAD_S)
    o_l: gl.constexpr = HALF_O if LEAD_COLS == HALF else QUARTER_O
    p_op_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_l, k_width=2)
    vec_l: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, row_l)
    l_i = gl.full([BLOCK_H], 0.0, gl.float32, row_l)
    acc = gl.zeros([BLOCK_H, LEAD_COLS], gl.float32, o_l)
    s0 = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, LEAD_S)
    k_cols = gl.arange(0, BLOCK_N, gl.SliceLayout(0, LEAD_S))
    pb = p_s.index(0)
    for i in range(start, stop):
        n = i - start
        buf = n % 2
        kb = k_main_s.index(buf)
        if KEY_BIAS:  # the producer's mask, with the keys (no index load here)
            mbarrier.wait(full.index(buf), (n // 2) & 1)
            if FENCE:
                fence_async_shared()
            bias = bias_s.index(buf).load(gl.SliceLayout(0, LEAD_S))
            s = warpgroup_mma_wait(num_outstanding=0, deps=(_lead_qk(bufs, buf, s0, HAS_TAIL),))
            p, alpha, m_i, l_i = _softmax_bias(s, bias, m_i, l_i, scale2)
        else:
            valid = await_block(i, buf, (n // 2) & 1, keys, cache, x_cache, k_cols, full,
                                NPARTS, FENCE)  # fmt: skip
            s = warpgroup_mma_wait(num_outstanding=0, deps=(_lead_qk(bufs, buf, s0, HAS_TAIL),))
            p, alpha, m_i, l_i = _softmax_step(s, valid, m_i, l_i, scale2)
        p16 = p.to(gl.bfloat16)
        mbarrier.wait(p_free, (n & 1) ^ 1)  # the follower is done with the last block's P
        pb.store(p16)
        red.slice(0, BLOCK_H).store(gl.convert_layout(alpha, vec_l))
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(p_full, count=1)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_l))[:, None]
        p_op = gl.convert_layout(p16, p_op_l)
        acc = warpgroup_mma(p_op, kb.slice(0, LEAD_COLS, dim=1), acc, is_async=True)
        acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))
        mbarrier.arrive(empty.index(buf), count=1)
    o_row: gl.constexpr = gl.SliceLayout(1, o_l)
    m_o = gl.convert_layout(m_i, o_row)
    heads = hb * BLOCK_H + gl.arange(0, BLOCK_H, o_row)
    hmask = heads < H
    l_div, sink_div = store_lse(m_o, gl.convert_layout(l_i, o_row), heads, hmask, outs, parts,
                                sink_ptr, t, split, H, S_Q, HAS_SINK, HAS_MAXL, SPLIT)  # fmt: skip
    red.slice(BLOCK_H, BLOCK_H).store(gl.convert_layout(l_div, vec_l))
    red.slice(2 * BLOCK_H, BLOCK_H).store(gl.convert_layout(sink_div, vec_l))
    gl.thread_barrier()
    mbarrier.arrive(hand.index(2), count=1)
    c = gl.arange(0, LEAD_COLS, gl.SliceLayout(0, o_l))
    _store_cols(acc, l_div, sink_div, c, heads, hmask, outs, parts, t, split, H, HAS_SINK, SPLIT)


@gluon.jit
def _lead_qk(bufs, buf, s0, HAS_TAIL: gl.constexpr):
    """The lead's S = Q K^T over key buffer buf, issued (the caller waits)."""
    q_main_s, q_tail_s, k_main_s, k_tail_s, p_s, full, empty, red, q_bar = bufs
    s = warpgroup_mma(q_main_s, k_main_s.index(buf).permute((1, 0)), s0, use_acc=False,
                      is_async=True)  # fmt: skip
    if HAS_TAIL:
        s = warpgroup_mma(q_tail_s, k_tail_s.index(buf).permute((1, 0)), s, is_async=True)
    return s


@gluon.jit
def _follow(bufs, hand, outs, parts, t, hb, split, H, keys, FENCE: gl.constexpr,
            HAS_SINK: gl.constexpr, SPLIT: gl.constexpr, LEAD_COLS: gl.constexpr):  # fmt: skip
    """SPLIT_PV's follower warpgroup: for each block, once the lead has handed over P and
    alpha, O[:, 256:512] = alpha O + P V[:, 256:512] (P read from shared memory); at the end
    the lead's l and sink divide its columns. With LEAD_COLS 128 it takes columns 128-255
    too (a second accumulator; a slice of the key buffer starts at a multiple of its width):
    the lead, the critical warpgroup, keeps a quarter of the PV and of the rescale."""
    q_main_s, q_tail_s, k_main_s, k_tail_s, p_s, full, empty, red, q_bar = bufs
    p_full = hand.index(0)
    p_free = hand.index(1)
    start = keys[4]
    stop = keys[5]
    o_row: gl.constexpr = gl.SliceLayout(1, HALF_O)
    q_row: gl.constexpr = gl.SliceLayout(1, QUARTER_O)
    acc = gl.zeros([BLOCK_H, HALF], gl.float32, HALF_O)  # columns 256-511
    if LEAD_COLS != HALF:
        acc2 = gl.zeros([BLOCK_H, HALF // 2], gl.float32, QUARTER_O)  # columns 128-255
    pb = p_s.index(0)
    for i in range(start, stop):
        n = i - start
        buf = n % 2
        mbarrier.wait(full.index(buf), (n // 2) & 1)
        mbarrier.wait(p_full, n & 1)
        if FENCE:
            fence_async_shared()
        alpha = red.slice(0, BLOCK_H).load(o_row)
        acc = acc * alpha[:, None]
        kb = k_main_s.index(buf)
        acc = warpgroup_mma(pb, kb.slice(HALF, HALF, dim=1), acc, is_async=True)
        if LEAD_COLS != HALF:
            acc2 = acc2 * red.slice(0, BLOCK_H).load(q_row)[:, None]
            acc2 = warpgroup_mma(pb, kb.slice(LEAD_COLS, HALF // 2, dim=1), acc2,
                                 is_async=True)  # fmt: skip
            acc, acc2 = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc2))
        else:
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(p_free, count=1)
        mbarrier.arrive(empty.index(buf), count=1)
    mbarrier.wait(hand.index(2), 0)
    l_div = red.slice(BLOCK_H, BLOCK_H).load(o_row)
    sink_div = red.slice(2 * BLOCK_H, BLOCK_H).load(o_row)
    heads = hb * BLOCK_H + gl.arange(0, BLOCK_H, o_row)
    hmask = heads < H
    c = HALF + gl.arange(0, HALF, gl.SliceLayout(0, HALF_O))
    _store_cols(acc, l_div, sink_div, c, heads, hmask, outs, parts, t, split, H, HAS_SINK, SPLIT)
    if LEAD_COLS != HALF:
        heads2 = hb * BLOCK_H + gl.arange(0, BLOCK_H, q_row)
        c2 = LEAD_COLS + gl.arange(0, HALF // 2, gl.SliceLayout(0, QUARTER_O))
        _store_cols(acc2, gl.convert_layout(l_div, q_row), gl.convert_layout(sink_div, q_row),
                    c2, heads2, heads2 < H, outs, parts, t, split, H, HAS_SINK, SPLIT)  # fmt: skip


@gluon.jit
def _consume(bufs, cache, x_cache, keys, scale2, HAS_TAIL: gl.constexpr, NPARTS: gl.constexpr,
             FENCE: gl.constexpr, SKIP: gl.constexpr):  # fmt: skip
    """The consumer warpgroups: online softmax (base 2) over the key blocks the producer
    fills; (acc [64, 512] unnormalized, m_i, l_i)."""
    q_main_s, q_tail_s, k_main_s, k_tail_s, p_s, full, empty, red, q_bar = bufs
    await_q(q_bar)
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
        valid = await_block(i, buf, (n // 2) & 1, keys, cache, x_cache, k_cols, full, NPARTS,
                            FENCE)  # fmt: skip
        if SKIP != 2:  # measurement: 2 leaves out the dots and the softmax
            kb = k_main_s.index(buf)
            s = warpgroup_mma(q_main_s, kb.permute((1, 0)), s0, use_acc=False, is_async=True)
            if HAS_TAIL:
                s = warpgroup_mma(q_tail_s, k_tail_s.index(buf).permute((1, 0)), s, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
            p, alpha, m_i, l_i = _softmax_step(s, valid, m_i, l_i, scale2)
            p_op = gl.convert_layout(p.to(gl.bfloat16), P_LAYOUT)
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_LAYOUT))[:, None]
            acc = warpgroup_mma(p_op, kb, acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(empty.index(buf), count=1)
    return acc, m_i, l_i


@gluon.jit
def _softmax_step(s, valid, m_i, l_i, scale2):
    """One key block of the online softmax (base 2) over scores s with the keys along axis 1
    (the wide consumers): (p, the old state's rescale alpha, m_i, l_i) updated; invalid keys
    get p 0."""
    s = gl.where(gl.expand_dims(valid, 0), s * scale2, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1))
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_i - m_use)
    p = gl.exp2(s - gl.expand_dims(m_use, 1))
    return p, alpha, m_new, l_i * alpha + gl.sum(p, 1)


@gluon.jit
def _softmax_bias(s, bias, m_i, l_i, scale2):
    """_softmax_step with the key mask as a bias (0, or -inf for a masked key) added to the
    raw scores: the max taken before the scale (scale2 > 0), the exponent one fma a score."""
    t = s + gl.expand_dims(bias, 0)
    m_new = gl.maximum(m_i, gl.max(t, 1) * scale2)
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_i - m_use)
    p = gl.exp2(t * scale2 - gl.expand_dims(m_use, 1))
    return p, alpha, m_new, l_i * alpha + gl.sum(p, 1)


@gluon.jit
def _consume_narrow(bufs, cache, x_cache, keys, scale2, HAS_TAIL: gl.constexpr,
                    NPARTS: gl.constexpr, FENCE: gl.constexpr, SKIP: gl.constexpr):  # fmt: skip
    """The consumers with NH heads as the wgmma's N: S^T = K Q^T (64 keys x NH, each warpgroup
    NH / 2 heads), the softmax down the keys, P^T through shared memory (double-buffered: one
    partition barrier a block orders both warpgroups' writes and reads), O^T += V^T P^T (each
    warpgroup 256 of the 512 rows, V^T a transposed view of the key buffer); (acc [512, NH]
    unnormalized, m_i, l_i)."""
    q_main_s, q_tail_s, k_main_s, k_tail_s, p_s, full, empty, red, q_bar = bufs
    await_q(q_bar)
    NH: gl.constexpr = p_s.type.shape[2]
    st_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                   instr_shape=[16, NH // 2, 16])  # fmt: skip
    ot_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                   instr_shape=[16, NH, 16])  # fmt: skip
    start = keys[4]
    stop = keys[5]
    m_i = gl.full([NH], float("-inf"), gl.float32, gl.SliceLayout(0, st_l))
    acc = gl.zeros([D_V, NH], gl.float32, ot_l)
    s0 = gl.zeros([BLOCK_N, NH], gl.float32, st_l)
    l_acc = s0
    red_s = red.slice(0, 4 * NH)
    k_rows = gl.arange(0, BLOCK_N, gl.SliceLayout(1, st_l))
    for i in range(start, stop):
        n = i - start
        buf = n % 2
        valid = await_block(i, buf, (n // 2) & 1, keys, cache, x_cache, k_rows, full, NPARTS,
                            FENCE)  # fmt: skip
        if SKIP != 2:  # measurement: 2 leaves out the dots and the softmax
            acc, m_i, l_acc = heads_n_block(bufs, buf, p_s.index(buf), s0, valid, acc, m_i,
                                            l_acc, scale2, red_s, HAS_TAIL)  # fmt: skip
        mbarrier.arrive(empty.index(buf), count=1)
    return acc, m_i, gl.sum(l_acc, 0)


@gluon.jit
def _consume_alternate(bufs, acc_s, ml_s, cache, x_cache, keys, scale2, HAS_TAIL: gl.constexpr,
                       NPARTS: gl.constexpr, FENCE: gl.constexpr, SKIP: gl.constexpr,
                       W: gl.constexpr):  # fmt: skip
    """One consumer warpgroup of ALTERNATE: the key blocks start + W, start + W + 2, ... (the
    producer's buffer W) with all NH heads as the wgmma's N: S^T = K Q^T, the softmax down the
    keys, P^T through its own shared buffer, O^T += V^T P^T. No barrier couples it to the
    other warpgroup, so one's softmax overlaps the other's wgmma, and a key tile is read once
    (the narrow consumers both read every tile, for NH / 2 heads each). Its state (acc^T, m_i,
    l_i) goes to acc_s.index(W) and ml_s (over its own key buffer, which no block uses any
    more)."""
    q_main_s, q_tail_s, k_main_s, k_tail_s, p_s, full, empty, red, q_bar = bufs
    await_q(q_bar)
    NH: gl.constexpr = p_s.type.shape[2]
    lay: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, NH, 16])  # fmt: skip
    start = keys[4]
    stop = keys[5]
    m_i = gl.full([NH], float("-inf"), gl.float32, gl.SliceLayout(0, lay))
    acc = gl.zeros([D_V, NH], gl.float32, lay)
    s0 = gl.zeros([BLOCK_N, NH], gl.float32, lay)
    l_acc = s0
    k_rows = gl.arange(0, BLOCK_N, gl.SliceLayout(1, lay))
    pb = p_s.index(W)
    red_w = red.slice(W * 4 * NH, 4 * NH)
    for i in range(start + W, stop, 2):
        buf = (i - start) % 2  # = W; as the loop's value the dots' descriptors are not hoisted
        valid = await_block(i, buf, ((i - start) // 2) & 1, keys, cache, x_cache, k_rows, full,
                            NPARTS, FENCE)  # fmt: skip
        if SKIP != 2:  # measurement: 2 leaves out the dots and the softmax
            acc, m_i, l_acc = heads_n_block(bufs, buf, pb, s0, valid, acc, m_i, l_acc, scale2,
                                            red_w, HAS_TAIL)  # fmt: skip
        mbarrier.arrive(empty.index(buf), count=1)
    acc_s.index(W).slice(0, NH).store(gl.permute(acc, (1, 0)))
    ml_s.slice(W * TAIL_WORDS, NH).store(m_i)
    ml_s.slice(W * TAIL_WORDS + BLOCK_N, NH).store(gl.sum(l_acc, 0))


@gluon.jit
def _merge_buffers(k_main_s, k_tail_s, NH: gl.constexpr):
    """ALTERNATE's states over the key buffers (fp32): acc_s [2, 32, 512] (acc^T of warpgroup
    W in acc_s.index(W)'s first NH rows), ml_s: its m and l at words TAIL_WORDS W and
    TAIL_WORDS W + 64, in its own buffer's tail."""
    acc_s = k_main_s._reinterpret(gl.float32, [2, BLOCK_N // 2, D_V], MERGE_SL)
    ml_s = k_tail_s._reinterpret(gl.float32, [BLOCK_N * ROPE], WORDS_SL)
    return acc_s, ml_s


@gluon.jit
def _store_merged(acc_s, ml_s, outs, parts, sink_ptr, t, hb, split, H, S_Q,
                  HAS_SINK: gl.constexpr, HAS_MAXL: gl.constexpr, SPLIT: gl.constexpr,
                  NH: gl.constexpr):  # fmt: skip
    """ALTERNATE: the two warpgroups' states merged (base 2) and stored as _store does, 64
    output columns at a time (both accumulators at once would not fit in registers)."""
    row_l: gl.constexpr = gl.SliceLayout(1, OUT_COLS)
    gl.thread_barrier()
    m0 = ml_s.slice(0, NH).load(row_l)
    m1 = ml_s.slice(TAIL_WORDS, NH).load(row_l)
    m_i = gl.maximum(m0, m1)
    m_use = gl.where(m_i == float("-inf"), 0.0, m_i)
    a0 = gl.exp2(m0 - m_use)
    a1 = gl.exp2(m1 - m_use)
    l0 = ml_s.slice(BLOCK_N, NH).load(row_l)
    l_i = l0 * a0 + ml_s.slice(TAIL_WORDS + BLOCK_N, NH).load(row_l) * a1
    heads = hb * NH + gl.arange(0, NH, row_l)
    hmask = heads < H
    l_div, sink_div = store_lse(m_i, l_i, heads, hmask, outs, parts, sink_ptr, t, split, H, S_Q,
                                HAS_SINK, HAS_MAXL, SPLIT)  # fmt: skip
    COLS: gl.constexpr = 64
    acc0_s = acc_s.index(0).slice(0, NH)
    acc1_s = acc_s.index(1).slice(0, NH)
    for j in gl.static_range(D_V // COLS):
        c = j * COLS + gl.arange(0, COLS, gl.SliceLayout(0, OUT_COLS))
        acc = acc0_s.slice(j * COLS, COLS, dim=1).load(OUT_COLS) * a0[:, None]
        acc += acc1_s.slice(j * COLS, COLS, dim=1).load(OUT_COLS) * a1[:, None]
        _store_cols(acc, l_div, sink_div, c, heads, hmask, outs, parts, t, split, H, HAS_SINK,
                    SPLIT)  # fmt: skip


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
    l_div, sink_div = store_lse(m_i, l_i, heads, hmask, outs, parts, sink_ptr, t, split, H, S_Q,
                                HAS_SINK, HAS_MAXL, SPLIT)  # fmt: skip
    c = gl.arange(0, D_V, gl.SliceLayout(0, LAY))
    _store_cols(acc, l_div, sink_div, c, heads, hmask, outs, parts, t, split, H, HAS_SINK, SPLIT)


@gluon.jit
def _store_cols(acc, l_div, sink_div, c, heads, hmask, outs, parts, t, split, H,
                HAS_SINK: gl.constexpr, SPLIT: gl.constexpr):  # fmt: skip
    """Output columns c of the heads: acc normalized, as the split's fp32 partial or bf16."""
    o = acc / l_div[:, None]
    if SPLIT:
        at = (t * gl.num_programs(1) + split) * H + heads
        gl.store(parts.o + at[:, None] * D_V + c[None, :], o, mask=hmask[:, None])
    else:
        if HAS_SINK:
            o = o / sink_div[:, None]
        o_ptrs = outs.out + t * outs.st + heads[:, None] * outs.sh + c[None, :]
        gl.store(o_ptrs, o.to(gl.bfloat16), mask=hmask[:, None])


KERNELS = {"attn": attn_kernel}
