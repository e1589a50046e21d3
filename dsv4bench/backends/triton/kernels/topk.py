"""The indexer's top-k kernel (host side and docs: ../topk.py): one program per row, a radix
select of the k-th largest logit (four 8-bit passes over the row's window), then one pass that
writes the picks in the row's form. FORM: 0 plain, 1 page_table, 2 ragged."""

from __future__ import annotations

import triton.language as tl

from dsv4bench.backends.triton.kernels import device_fn


@device_fn
def _order_key(x):
    """uint32 whose unsigned order is x's float order (-0 folded into +0 by the caller)."""
    bits = x.to(tl.uint32, bitcast=True)
    return tl.where((bits >> 31) != 0, bits ^ 0xFFFFFFFF, bits | 0x80000000)


@device_fn
def _window(row_ptr, cols, length):
    """(order keys, which of them are finite logits of the window) of one block."""
    inside = cols < length
    x = tl.load(row_ptr + cols, mask=inside, other=float("-inf")) + 0.0  # -0 -> +0
    return _order_key(x), inside & (x > float("-inf"))  # NaN compares false: never picked


@device_fn
def _cumsum(x):
    """Inclusive prefix sum (tl.cumsum is a jit function: not callable when interpreted)."""
    return tl.associative_scan(x, 0, tl.standard._sum_combine)


@device_fn
def _digit_pick(hist, bins, remaining):
    """The digit holding the remaining-th largest key, and the keys above that digit."""
    total = tl.reduce(hist, 0, tl.standard._sum_combine)
    above = total - _cumsum(hist)  # keys in higher bins
    hit = (above < remaining) & (above + hist >= remaining)
    digit = tl.reduce(tl.where(hit, bins, 0), 0, tl.standard._sum_combine)
    skipped = tl.reduce(tl.where(hit, above, 0), 0, tl.standard._sum_combine)
    return digit, skipped


def topk_kernel(
    logits_ptr,  # fp32 (rows, width), rows row_stride apart
    row_stride,
    lengths_ptr,  # int32 (rows,)
    starts_ptr,  # int32 (rows,): the window starts here
    out_ptr,  # int32 (rows, K)
    table_ptr,  # int32 (b, pages): page_table form
    table_s0,
    batch_ptr,  # int32 (rows,): the row's request (page_table form)
    offsets_ptr,  # int32 (rows,): ragged form
    K,
    FORM: tl.constexpr,
    PAGE: tl.constexpr,  # page_table: keys per page
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    start = tl.load(starts_ptr + row)
    length = tl.load(lengths_ptr + row)
    row_ptr = logits_ptr + row * row_stride + start
    bins = tl.arange(0, 256)
    lanes = tl.arange(0, BLOCK)
    prefix = tl.full((), 0, tl.uint32)
    remaining = tl.full((), 0, tl.int32)
    kept = tl.full((), 0, tl.int32)
    for p in tl.static_range(4):  # 8 bits a pass, highest first
        shift = 24 - 8 * p
        hist = tl.full((256,), 0, tl.int32)
        for off in range(0, length, BLOCK):
            key, ok = _window(row_ptr, off + lanes, length)
            if p > 0:
                ok = ok & ((key >> (shift + 8)) == (prefix >> (shift + 8)))
            byte = ((key >> shift) & 255).to(tl.int32)
            hist += tl.histogram(byte, 256, mask=ok)
        if p == 0:  # every finite logit of the window lands in the first histogram
            kept = tl.minimum(tl.reduce(hist, 0, tl.standard._sum_combine), K)
            remaining = kept
        digit, skipped = _digit_pick(hist, bins, remaining)
        remaining -= skipped
        prefix = prefix | (digit.to(tl.uint32) << shift)
    # prefix: the kept-th largest key; `remaining` keys equal to it are taken, all above it
    written = tl.full((), 0, tl.int32)
    ties = tl.full((), 0, tl.int32)
    for off in range(0, length, BLOCK):
        cols = off + lanes
        key, ok = _window(row_ptr, cols, length)
        eq = ok & (key == prefix)
        take_eq = eq & (ties + _cumsum(eq.to(tl.int32)) <= remaining)
        take = (ok & (key > prefix)) | take_eq
        at = written + _cumsum(take.to(tl.int32)) - 1
        pick = _form_index(cols, start, row, table_ptr, table_s0, batch_ptr, offsets_ptr,
                           take, FORM, PAGE)  # fmt: skip
        tl.store(out_ptr + row * K + at, pick, mask=take & (kept > 0))
        written += tl.reduce(take.to(tl.int32), 0, tl.standard._sum_combine)
        ties += tl.reduce(eq.to(tl.int32), 0, tl.standard._sum_combine)
    for off in range(0, K, BLOCK):  # -1 past the picks
        at = off + lanes
        pad = tl.full((BLOCK,), -1, tl.int32)
        tl.store(out_ptr + row * K + at, pad, mask=(at >= kept) & (at < K))


@device_fn
def _form_index(local, start, row, table_ptr, table_s0, batch_ptr, offsets_ptr, take,
                FORM: tl.constexpr, PAGE: tl.constexpr):  # fmt: skip
    """A window position as the form's index (reference/topk.py)."""
    if FORM == 1:
        b = tl.load(batch_ptr + row).to(tl.int64)
        page = tl.load(table_ptr + b * table_s0 + local // PAGE, mask=take, other=-1)
        out = tl.where(page >= 0, page * PAGE + local % PAGE, -1)
    elif FORM == 2:
        out = local + tl.load(offsets_ptr + row)
    else:
        out = local + start
    return out.to(tl.int32)


KERNELS = {"topk": topk_kernel}
