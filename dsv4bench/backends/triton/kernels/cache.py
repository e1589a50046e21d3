"""Kernels of the sparse-prefill route's helper ops (host side and docs: ../cache_ops.py):
FP8 cache -> bf16 dequantization (V4, V3.2), request-local -> global index remap, and the V4
page split. Byte offsets: layout.py."""

from __future__ import annotations

import triton.language as tl

from dsv4bench.backends.triton.kernels import device_fn
from dsv4bench.backends.triton.kernels import layout as L

V32_SCALES_AT = tl.constexpr(L.V32_SCALES_AT)
V32_ROPE_AT = tl.constexpr(L.V32_ROPE_AT)
V32_TILES = tl.constexpr(L.V32_TILES)
V32_TILE = tl.constexpr(L.V32_TILE)
V32_D_QK = tl.constexpr(L.D_V + L.ROPE)
V4_DATA = tl.constexpr(L.V4_DATA_BYTES)
V4_SCALE = tl.constexpr(L.V4_SCALE_BYTES)
V4_ROPE_AT = tl.constexpr(L.V4_ROPE_AT)
V4_TILES = tl.constexpr(L.V4_TILES)
V4_TILE = tl.constexpr(L.V4_TILE)
ROPE = tl.constexpr(L.ROPE)
D_V = tl.constexpr(L.D_V)


@device_fn
def scaled_e4m3_to_bf16(q, scale):
    """e4m3fn bytes times a float32 scale, rounded once to bf16, bit-exact as torch does it."""
    # e4m3fn -> float32 bits, exactly: normal (8 + m) * 2^(e - 10), subnormal m * 2^-9, 0x7f NaN
    # (bit operations, not -x: Triton negates as 0 - x, which turns -0 into +0)
    b = q.to(tl.uint32)
    e = (b >> 3) & 15
    m = b & 7
    sub = (m.to(tl.float32) * 0.001953125).to(tl.uint32, bitcast=True)
    mag = tl.where(e == 0, sub, ((e + 120) << 23) | (m << 20))
    mag = tl.where((b & 127) == 127, 0x7FC00000, mag)
    x = (mag | ((b & 128) << 24)).to(tl.float32, bitcast=True)  # the sign as a bit: -0 stays
    v = (x * scale).to(tl.uint32, bitcast=True)
    # float32 -> bf16, round to nearest even (torch's rule; NaN -> 0x7fc0)
    r = (v + 0x7FFF + ((v >> 16) & 1)) >> 16
    r = tl.where((v & 0x7FFFFFFF) > 0x7F800000, 0x7FC0, r)
    return r.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@device_fn
def rope_bf16(cache_ptr, at, rmask, BLOCK_T: tl.constexpr):
    """ROPE bf16 values from 2 * ROPE little-endian bytes at byte offsets `at` [BLOCK_T]."""
    k = tl.arange(0, 2 * ROPE)
    rb = tl.load(cache_ptr + at[:, None] + k[None, :], mask=rmask[:, None], other=0)
    lo, hi = tl.split(tl.reshape(rb, [BLOCK_T, ROPE, 2]))
    return (lo.to(tl.uint16) | (hi.to(tl.uint16) << 8)).to(tl.bfloat16, bitcast=True)


def dequant_v4_kernel(
    cache_ptr,  # uint8, at the cache's first byte (storage offset included)
    slots_ptr,  # int32/int64 slots when HAS_SLOTS, else unused
    out_ptr,  # bf16 (n_rows, 512), contiguous
    n_rows,
    page_stride,  # bytes between pages: cache.stride(0)
    P: tl.constexpr,  # tokens per page
    HAS_SLOTS: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    rows = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    rmask = rows < n_rows
    if HAS_SLOTS:
        tok = tl.load(slots_ptr + rows, mask=rmask, other=0).to(tl.int64)
    else:
        tok = rows
    data = (tok // P) * page_stride + (tok % P) * V4_DATA  # the token's data bytes
    scl = (tok // P) * page_stride + P * V4_DATA + (tok % P) * V4_SCALE  # its scale bytes
    out_row = rows * D_V

    # nope: V4_TILES tiles of V4_TILE e4m3, tile g times 2^(byte g - 127); the last of the 8
    # tiles (the rope's place) masked off
    g = tl.arange(0, 8)
    j = tl.arange(0, V4_TILE)
    gmask = rmask[:, None] & (g[None, :] < V4_TILES)
    sb = tl.load(cache_ptr + scl[:, None] + g[None, :], mask=gmask, other=127).to(tl.uint32)
    # 2^(b - 127) exactly as torch.exp2: b = 0 is the subnormal 2^-127, b = 255 is +inf
    scale = tl.where(sb == 0, 0x400000, sb << 23).to(tl.float32, bitcast=True)
    col = g[:, None] * V4_TILE + j[None, :]  # [8, 64]
    mask3 = gmask[:, :, None] & (j[None, None, :] < V4_TILE)
    q = tl.load(cache_ptr + data[:, None, None] + col[None, :, :], mask=mask3, other=0)
    val = scaled_e4m3_to_bf16(q, scale[:, :, None])
    tl.store(out_ptr + out_row[:, None, None] + col[None, :, :], val, mask=mask3)

    rope = rope_bf16(cache_ptr, data + V4_ROPE_AT, rmask, BLOCK_T)  # copied bit for bit
    r = tl.arange(0, ROPE)
    tl.store(out_ptr + out_row[:, None] + V4_ROPE_AT + r[None, :], rope, mask=rmask[:, None])


def dequant_v32_kernel(
    cache_ptr,  # uint8, at the cache's first byte
    slots_ptr,
    out_ptr,  # bf16 (n_rows, 576), contiguous
    n_rows,
    block_stride,  # cache.stride(0)
    token_stride,  # cache.stride(1)
    P: tl.constexpr,  # tokens per block
    HAS_SLOTS: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    rows = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    rmask = rows < n_rows
    if HAS_SLOTS:
        tok = tl.load(slots_ptr + rows, mask=rmask, other=0).to(tl.int64)
    else:
        tok = rows
    rec = (tok // P) * block_stride + (tok % P) * token_stride  # the token's record
    out_row = rows * V32_D_QK

    # V32_TILES fp32 scales, little endian, assembled bytewise (any alignment)
    t = tl.arange(0, V32_TILES)
    sp = cache_ptr + rec[:, None] + V32_SCALES_AT + 4 * t[None, :]
    smask = rmask[:, None] & (t[None, :] < V32_TILES)
    s = tl.load(sp, mask=smask, other=0).to(tl.uint32)
    s = s | (tl.load(sp + 1, mask=smask, other=0).to(tl.uint32) << 8)
    s = s | (tl.load(sp + 2, mask=smask, other=0).to(tl.uint32) << 16)
    s = s | (tl.load(sp + 3, mask=smask, other=0).to(tl.uint32) << 24)
    scale = s.to(tl.float32, bitcast=True)

    # latent: tile t of V32_TILE e4m3 times scale t in float32, rounded once to bf16
    j = tl.arange(0, V32_TILE)
    col = t[:, None] * V32_TILE + j[None, :]  # [4, 128]
    mask3 = rmask[:, None, None] & (col[None, :, :] < D_V)
    q = tl.load(cache_ptr + rec[:, None, None] + col[None, :, :], mask=mask3, other=0)
    val = scaled_e4m3_to_bf16(q, scale[:, :, None])
    tl.store(out_ptr + out_row[:, None, None] + col[None, :, :], val, mask=mask3)

    rope = rope_bf16(cache_ptr, rec + V32_ROPE_AT, rmask, BLOCK_T)
    r = tl.arange(0, ROPE)
    tl.store(out_ptr + out_row[:, None] + D_V + r[None, :], rope, mask=rmask[:, None])


def remap_kernel(
    local_ptr,  # (b * per_req,) contiguous request-local positions, negative = invalid
    table_ptr,  # block table (b, max_blocks), any strides
    out_ptr,  # like local
    n_total,
    per_req,  # positions per request (s_q * topk)
    table_s0,
    table_s1,
    max_blocks,
    P: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_total
    i = tl.load(local_ptr + offs, mask=mask, other=-1).to(tl.int64)
    req = offs // per_req
    block = i // P  # only read where i >= 0
    valid = mask & (i >= 0) & (block < max_blocks)
    page = tl.load(table_ptr + req * table_s0 + block * table_s1, mask=valid, other=-1)
    page = page.to(tl.int64)
    valid = valid & (page >= 0)
    slot = tl.where(valid, page * P + i % P, -1)
    tl.store(out_ptr + offs, slot.to(out_ptr.dtype.element_ty), mask=mask)


def page_split_v4_kernel(
    src_ptr,  # int32 words of the source cache, at its first byte
    dst_ptr,  # int32 words of the output cache (64-token pages)
    src_stride,  # words between source pages: stride(0) / 4
    dst_stride,  # words between output pages
    P: tl.constexpr,  # tokens per source page
    BLOCK: tl.constexpr,
):
    new = tl.program_id(0).to(tl.int64)  # the output page
    R: tl.constexpr = P // 64
    DATA: tl.constexpr = 64 * V4_DATA // 4  # data words of a 64-token page
    SCALES: tl.constexpr = 64 * V4_SCALE // 4
    src = src_ptr + (new // R) * src_stride
    dst = dst_ptr + new * dst_stride
    sub = new % R  # which 64 tokens of the source page
    for start in tl.static_range(0, DATA, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < DATA
        tl.store(dst + offs, tl.load(src + sub * DATA + offs, mask=mask), mask=mask)
    offs = tl.arange(0, SCALES)
    words = tl.load(src + P * V4_DATA // 4 + sub * SCALES + offs)
    tl.store(dst + DATA + offs, words)


KERNELS = {
    "dequant_v4": dequant_v4_kernel,
    "dequant_v32": dequant_v32_kernel,
    "remap": remap_kernel,
    "page_split_v4": page_split_v4_kernel,
}
