"""The lightning indexer's logits kernels (host side and docs: ../indexer.py). DOT: 0 an
e4m3 x e4m3 dot (fp32 accumulation), 1 widened to bf16, 2 widened to fp32 (the interpreter)."""

from __future__ import annotations

import triton.language as tl

from dsv4bench.backends.triton.kernels import device_fn


@device_fn
def _widen(x, DOT: tl.constexpr):
    """e4m3 as the dot takes it (one return: Triton types every return statement alike)."""
    y = x
    if DOT == 1:
        y = x.to(tl.bfloat16)
    elif DOT == 2:
        y = x.to(tl.float32)
    return y


@device_fn
def _dot(a, b, DOT: tl.constexpr):
    """a @ b^T, fp32 accumulation."""
    if DOT == 2:
        s = tl.dot(a, tl.trans(b), input_precision="ieee")
    else:
        s = tl.dot(a, tl.trans(b))
    return s


@device_fn
def _le_f32(ptr, at, mask):
    """float32 from 4 little-endian bytes at byte offsets `at` (any alignment)."""
    s0 = tl.load(ptr + at, mask=mask, other=0).to(tl.uint32)
    s1 = tl.load(ptr + at + 1, mask=mask, other=0).to(tl.uint32)
    s2 = tl.load(ptr + at + 2, mask=mask, other=0).to(tl.uint32)
    s3 = tl.load(ptr + at + 3, mask=mask, other=0).to(tl.uint32)
    return (s0 | (s1 << 8) | (s2 << 16) | (s3 << 24)).to(tl.float32, bitcast=True)


def paged_kernel(
    q_ptr,  # e4m3 bytes (B, NEXT_N, H, D) contiguous
    cache_ptr,  # uint8 cache, block b at b * block_stride: [BS x D e4m3 | BS x fp32]
    w_ptr,  # fp32 (B * NEXT_N, H) contiguous
    lens_ptr,  # int32 (B,) or (B, NEXT_N)
    table_ptr,  # int32 (B, table_w)
    out_ptr,  # fp32 (B * NEXT_N, out_w)
    table_s0,
    table_w,
    block_stride,
    out_w,
    H: tl.constexpr,
    HP: tl.constexpr,  # H padded to a power of two >= 16
    D: tl.constexpr,
    BS: tl.constexpr,
    NEXT_N: tl.constexpr,
    LENS_2D: tl.constexpr,
    DOT: tl.constexpr,  # 0: e4m3 x e4m3; 1: widened to bf16; 2: widened to fp32 (interpreter)
    KEYS_M: tl.constexpr,  # the keys are the dot's M (heads along N), else the heads are
):
    b = tl.program_id(0).to(tl.int64)
    t = tl.program_id(1).to(tl.int64)
    pos = t * BS + tl.arange(0, BS)
    h = tl.arange(0, HP)
    d = tl.arange(0, D)
    if LENS_2D:
        most = tl.load(lens_ptr + b * NEXT_N + NEXT_N - 1)
        for jj in tl.static_range(NEXT_N - 1):
            most = tl.maximum(most, tl.load(lens_ptr + b * NEXT_N + jj))
    else:
        most = tl.load(lens_ptr + b)
    live = (t * BS < most) & (t < table_w)
    blk = tl.load(table_ptr + b * table_s0 + t, mask=live, other=0).to(tl.int64)
    base = blk * block_stride
    kmask = live & (pos < out_w)
    koffs = base + (pos % BS)[:, None] * D + d[None, :]
    kb = tl.load(cache_ptr + koffs, mask=kmask[:, None], other=0)
    k = kb.to(tl.float8e4nv, bitcast=True)
    scale = _le_f32(cache_ptr, base + BS * D + (pos % BS) * 4, kmask)
    k = _widen(k, DOT)
    for j in tl.static_range(NEXT_N):
        row = b * NEXT_N + j
        if LENS_2D:
            limit = tl.load(lens_ptr + row)
        else:
            limit = tl.minimum(most - NEXT_N + j + 1, most)
        hmask = h < H
        q = tl.load(q_ptr + (row * H + h)[:, None] * D + d[None, :], mask=hmask[:, None], other=0)
        q = _widen(q.to(tl.float8e4nv, bitcast=True), DOT)
        w = tl.load(w_ptr + row * H + h, mask=hmask, other=0.0)
        if KEYS_M:  # (BS, HP): the head sum stays within a thread's quad
            s = tl.maximum(_dot(k, q, DOT) * scale[:, None], 0.0) * w[None, :]
            logit = tl.reduce(s, 1, tl.standard._sum_combine)  # tl.sum: a jit fn
        else:  # (HP, BS)
            s = tl.maximum(_dot(q, k, DOT) * scale[None, :], 0.0) * w[:, None]
            logit = tl.reduce(s, 0, tl.standard._sum_combine)
        logit = tl.where(pos < limit, logit, float("-inf"))
        tl.store(out_ptr + row * out_w + pos, logit, mask=pos < out_w)


def ragged_kernel(
    q_ptr,  # e4m3 bytes (S, H, D) contiguous
    kv_ptr,  # e4m3 bytes (N, D) contiguous
    scale_ptr,  # fp32 (N,)
    w_ptr,  # fp32 (S, H)
    ks_ptr,
    ke_ptr,
    out_ptr,  # fp32 (S, N)
    S,
    N,
    H: tl.constexpr,
    HP: tl.constexpr,
    D: tl.constexpr,
    BLOCK_Q: tl.constexpr,  # query rows per program, one after another over the key tile
    BLOCK_N: tl.constexpr,  # keys per program: the M of a (BLOCK_N, D) x (D, HP) dot
    DOT: tl.constexpr,
    SKIP: tl.constexpr,  # skip the dot of a row whose range misses the tile (else masks only)
    STAGES: tl.constexpr,  # software pipelining of the row loop (q loads in flight)
    SIGN_FOLD: tl.constexpr,  # relu(s * scale) = |scale| * relu(s * sign(scale)), the sign
    # flipped into the key bytes once: one max and one fma per (key, head) in the epilogue
):
    pq = tl.program_id(0).to(tl.int64)
    pn = tl.program_id(1).to(tl.int64)
    cols = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    rows = tl.minimum(pq * BLOCK_Q + tl.arange(0, BLOCK_Q), S - 1)
    lo_rows = tl.load(ks_ptr + rows)
    hi_rows = tl.load(ke_ptr + rows)
    seen = (hi_rows > pn * BLOCK_N) & (lo_rows < pn * BLOCK_N + BLOCK_N)
    if tl.reduce(seen.to(tl.int32), 0, tl.standard._sum_combine) == 0:
        # no row of the program sees a key of the tile (past a causal diagonal): -inf only
        at = out_ptr + rows[:, None] * N + cols[None, :]
        tl.store(at, tl.full((BLOCK_Q, BLOCK_N), float("-inf"), tl.float32), mask=cmask[None, :])
        return
    h = tl.arange(0, HP)
    hmask = h < H
    d = tl.arange(0, D)
    kb = tl.load(kv_ptr + cols[:, None] * D + d[None, :], mask=cmask[:, None], other=0)
    scale = tl.load(scale_ptr + cols, mask=cmask, other=0.0)
    if SIGN_FOLD:
        kb = tl.where((scale < 0.0)[:, None], kb ^ 0x80, kb)
    k = _widen(kb.to(tl.float8e4nv, bitcast=True), DOT)
    for i in tl.range(0, BLOCK_Q, num_stages=STAGES):
        row = tl.minimum(pq * BLOCK_Q + i, S - 1)  # rows past S redo row S - 1 (same values)
        lo = tl.load(ks_ptr + row)
        hi = tl.load(ke_ptr + row)
        live = (pn * BLOCK_N < hi) & (pn * BLOCK_N + BLOCK_N > lo)
        if live | (not SKIP):
            logit = _ragged_row(q_ptr, w_ptr, k, scale, row, h, hmask, d, H, DOT, SIGN_FOLD)
            logit = tl.where((cols >= lo) & (cols < hi), logit, float("-inf"))
        else:
            logit = tl.full((BLOCK_N,), float("-inf"), tl.float32)
        tl.store(out_ptr + row * N + cols, logit, mask=cmask)


@device_fn
def _ragged_row(q_ptr, w_ptr, k, scale, row, h, hmask, d, H: tl.constexpr, DOT: tl.constexpr,
                SIGN_FOLD: tl.constexpr):  # fmt: skip
    """One query row's logits over the key tile: sum over heads of w * relu(scale * q.k)."""
    q = tl.load(q_ptr + (row * H + h)[:, None] * d.shape[0] + d[None, :], mask=hmask[:, None],
                other=0).to(tl.float8e4nv, bitcast=True)  # fmt: skip
    w = tl.load(w_ptr + row * H + h, mask=hmask, other=0.0)
    s = _dot(k, _widen(q, DOT), DOT)  # (BLOCK_N, HP): heads along the accumulator's N
    if SIGN_FOLD:
        logit = tl.abs(scale) * tl.reduce(tl.maximum(s, 0.0) * w[None, :], 1,
                                          tl.standard._sum_combine)  # fmt: skip
    else:
        s = tl.maximum(s * scale[:, None], 0.0) * w[None, :]
        logit = tl.reduce(s, 1, tl.standard._sum_combine)  # tl.sum: a jit fn
    return logit


KERNELS = {"paged": paged_kernel, "ragged": ragged_kernel}
