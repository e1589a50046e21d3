"""The project's own Triton kernels for the sparse-prefill route's helper ops: FP8 -> bf16
dequantization of a V4 or V3.2 cache ("dequant") and request-local -> global index remapping
("remap"), the parts a serving engine runs as fused kernels.

Kernels (byte layouts: reference/layouts.py, KERNEL_FACTS §2 and §4):
  V4 dequant   one program per BLOCK_T tokens; reads the uint8 cache from its base pointer (the
               storage offset included) with the page stride stride(0), never page_size * 584:
               out[t, :448] = e4m3 * 2^(ue8m0 - 127) per 64-value tile, out[t, 448:] = the bf16
               rope bytes as they are.
  V3.2 dequant the same over 656-byte records with strides stride(0) and stride(1): out[t, :512] =
               bf16(float32(e4m3) * fp32 scale) per 128-value tile, rope bit-exact.
  remap        slot = block_table[r, i // P] * P + i % P; a negative i, a block past the table or
               a negative table entry gives -1. int32 or int64, the dtype of local.
  page split   a V4 cache in P-token pages -> 64-token pages (FlashInfer's sm120 layout) in one
               launch, one program per new page: its 64 x 576 data bytes and 64 x 8 scale bytes
               copied as 4-byte words (every offset and stride of the layout is a multiple of
               4); the output has the engines' padded page stride (37440). sglang fused its
               split into one kernel (#29927, SM120 DeepSeek-V4 page-split).
Both dequant kernels can read a list of slots instead of every token (`slots=`: row r of the
output is the token at slots[r], as layouts.to_workspace(cache, slots)).

Exactness: e4m3 is decoded and fp32 is rounded to bf16 (round to nearest even, as torch does)
with integer arithmetic in the kernels, so the GPU and Triton's CPU interpreter compute the same
bits, and the output equals layouts.to_workspace(cache).squeeze(1) bit for bit (NaN payloads
aside; a correct writer stores no NaN). V4 values are exact in bf16; V3.2 values are the fp32
product rounded once, as the oracle does it; scales are read exactly (v32_scale_reading None).

Triton is imported lazily: this module imports without it. Kernels on CUDA tensors are compiled
(triton.JITFunction) whatever TRITON_INTERPRET says; kernels on CPU tensors run in Triton's
interpreter (tests, tiny shapes), which copies the tensors' whole storages per launch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dsv4bench.backends.base import (
    Backend,
    Output,
    Prepared,
    Provider,
    Unsupported,
    check_cache_width,
    fp8_cache_reason,
)
from dsv4bench.cases.case import SPLIT_PAGE, Case
from reference.layout_table import LAYOUTS, of_width

NOT_FOUND = "Triton not found: pip install triton"
REMAP_POISON = -2  # neither -1 nor a slot: a remap that writes nothing is caught

# launch shapes (not tuned on a GPU yet)
DEQUANT_BLOCK_T = 16  # tokens per program
DEQUANT_WARPS = 8
REMAP_BLOCK = 1024  # indices per program
REMAP_WARPS = 4
SPLIT_BLOCK = 1024  # words per step: 9 steps copy a 64-token page's 9216 data words
SPLIT_WARPS = 4

# Set by _load(): the kernels below reference `tl` as a module global, resolved when Triton
# compiles or interprets them (their annotations are strings, thanks to the __future__ import).
triton: Any = None
tl: Any = None
_KERNELS: dict[tuple[str, bool], Any] = {}


def _load():
    """Import Triton (once); raise Unsupported when it is absent."""
    global triton, tl
    if triton is None:
        try:
            import triton as _triton
            import triton.language as _tl
        except ImportError as e:
            raise Unsupported(NOT_FOUND) from e
        triton, tl = _triton, _tl
        _make_device_functions()
    return triton


def _make_device_functions() -> None:
    """Helpers the kernels call: a JITFunction for the compiler, which the interpreter (running
    kernels as Python) calls as the plain function."""
    global _scaled_e4m3_to_bf16
    from triton.runtime.jit import JITFunction

    class _DeviceFn(JITFunction):
        def __call__(self, *args, **kwargs):
            return self.fn(*args, **kwargs)

    _scaled_e4m3_to_bf16 = _DeviceFn(_scaled_e4m3_to_bf16)


# ---- kernels (plain functions, wrapped by _kernel) ------------------------------------------


def _scaled_e4m3_to_bf16(q, scale):
    """e4m3fn bytes times a float32 scale, rounded once to bf16, bit-exact as torch does it.

    A device function of both dequant kernels (a _DeviceFn once Triton is loaded)."""
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


def _dequant_v4_kernel(
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
    page = tok // P
    off = tok % P
    data = page * page_stride + off * 576  # token t's 576 data bytes
    scl = page * page_stride + P * 576 + off * 8  # its 8 scale bytes
    out_row = rows * 512

    # nope: 7 tiles of 64 e4m3, tile g scaled by 2^(byte g - 127); tile 7 (the rope) masked off
    g = tl.arange(0, 8)
    j = tl.arange(0, 64)
    gmask = rmask[:, None] & (g[None, :] < 7)
    sb = tl.load(cache_ptr + scl[:, None] + g[None, :], mask=gmask, other=127).to(tl.uint32)
    # 2^(b - 127) exactly as torch.exp2: b = 0 is the subnormal 2^-127, b = 255 is +inf
    scale = tl.where(sb == 0, 0x400000, sb << 23).to(tl.float32, bitcast=True)
    col = g[:, None] * 64 + j[None, :]  # [8, 64]
    mask3 = gmask[:, :, None] & (j[None, None, :] < 64)
    q = tl.load(cache_ptr + data[:, None, None] + col[None, :, :], mask=mask3, other=0)
    val = _scaled_e4m3_to_bf16(q, scale[:, :, None])
    tl.store(out_ptr + out_row[:, None, None] + col[None, :, :], val, mask=mask3)

    # rope: 64 bf16 at data bytes 448..575, little endian, copied bit for bit
    k = tl.arange(0, 128)
    rb = tl.load(cache_ptr + data[:, None] + 448 + k[None, :], mask=rmask[:, None], other=0)
    lo, hi = tl.split(tl.reshape(rb, [BLOCK_T, 64, 2]))
    rope = (lo.to(tl.uint16) | (hi.to(tl.uint16) << 8)).to(tl.bfloat16, bitcast=True)
    tl.store(out_ptr + out_row[:, None] + 448 + j[None, :], rope, mask=rmask[:, None])


def _dequant_v32_kernel(
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
    rec = (tok // P) * block_stride + (tok % P) * token_stride  # the token's 656-byte record
    out_row = rows * 576

    # 4 fp32 scales at bytes 512..527, little endian, assembled bytewise (any alignment)
    t = tl.arange(0, 4)
    sp = cache_ptr + rec[:, None] + 512 + 4 * t[None, :]
    smask = rmask[:, None] & (t[None, :] < 4)
    s = tl.load(sp, mask=smask, other=0).to(tl.uint32)
    s = s | (tl.load(sp + 1, mask=smask, other=0).to(tl.uint32) << 8)
    s = s | (tl.load(sp + 2, mask=smask, other=0).to(tl.uint32) << 16)
    s = s | (tl.load(sp + 3, mask=smask, other=0).to(tl.uint32) << 24)
    scale = s.to(tl.float32, bitcast=True)

    # latent: 4 tiles of 128 e4m3, tile t times scale t in float32, rounded once to bf16
    j = tl.arange(0, 128)
    col = t[:, None] * 128 + j[None, :]  # [4, 128]
    mask3 = rmask[:, None, None] & (col[None, :, :] < 512)
    q = tl.load(cache_ptr + rec[:, None, None] + col[None, :, :], mask=mask3, other=0)
    val = _scaled_e4m3_to_bf16(q, scale[:, :, None])
    tl.store(out_ptr + out_row[:, None, None] + col[None, :, :], val, mask=mask3)

    # rope: 64 bf16 at bytes 528..655
    k = tl.arange(0, 128)
    rb = tl.load(cache_ptr + rec[:, None] + 528 + k[None, :], mask=rmask[:, None], other=0)
    lo, hi = tl.split(tl.reshape(rb, [BLOCK_T, 64, 2]))
    rope = (lo.to(tl.uint16) | (hi.to(tl.uint16) << 8)).to(tl.bfloat16, bitcast=True)
    jr = tl.arange(0, 64)
    tl.store(out_ptr + out_row[:, None] + 512 + jr[None, :], rope, mask=rmask[:, None])


def _remap_kernel(
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


def _page_split_v4_kernel(
    src_ptr,  # int32 words of the source cache, at its first byte
    dst_ptr,  # int32 words of the output cache (64-token pages)
    src_stride,  # words between source pages: stride(0) / 4
    dst_stride,  # words between output pages
    P: tl.constexpr,  # tokens per source page
    BLOCK: tl.constexpr,
):
    new = tl.program_id(0).to(tl.int64)  # the output page
    R: tl.constexpr = P // 64
    DATA: tl.constexpr = 64 * 576 // 4  # data words of a 64-token page
    SCALES: tl.constexpr = 64 * 8 // 4
    src = src_ptr + (new // R) * src_stride
    dst = dst_ptr + new * dst_stride
    sub = new % R  # which 64 tokens of the source page
    for start in tl.static_range(0, DATA, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < DATA
        tl.store(dst + offs, tl.load(src + sub * DATA + offs, mask=mask), mask=mask)
    offs = tl.arange(0, SCALES)
    words = tl.load(src + P * 576 // 4 + sub * SCALES + offs)
    tl.store(dst + DATA + offs, words)


_SOURCES = {
    "dequant_v4": _dequant_v4_kernel,
    "dequant_v32": _dequant_v32_kernel,
    "remap": _remap_kernel,
    "page_split_v4": _page_split_v4_kernel,
}


def _kernel(name: str, device) -> Any:
    """The kernel, compiled for a GPU tensor's device or interpreted for a CPU tensor's."""
    return kernel_for(_SOURCES, _KERNELS, _load, name, device)


def kernel_for(sources: dict, built: dict, load: Callable[[], Any], name: str, device) -> Any:
    """sources[name] as a JITFunction (a GPU device) or an InterpretedFunction (the CPU), built
    once into `built`; `load` imports Triton and sets the calling module's `tl` first."""
    interpret = device.type == "cpu"
    key = (name, interpret)
    if key not in built:
        load()
        if interpret:
            from triton.runtime.interpreter import InterpretedFunction

            built[key] = InterpretedFunction(sources[name])
        else:
            from triton.runtime.jit import JITFunction

            built[key] = JITFunction(sources[name])
    return built[key]


# ---- host side: checks, allocation and launches --------------------------------------------


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _cache_u8(cache, layout: str):
    """The cache as uint8 (a view), checked for the shape and byte strides the kernel reads."""
    import torch

    width = LAYOUTS[layout].token_bytes
    if not (
        isinstance(cache, torch.Tensor)
        and cache.dim() == 4
        and cache.shape[2] == 1
        and cache.shape[3] == width
        and cache.element_size() == 1
    ):
        shape = tuple(cache.shape) if isinstance(cache, torch.Tensor) else type(cache).__name__
        raise ValueError(f"{layout} cache must be a 1-byte tensor (pages, P, 1, {width}), {shape}")
    num_pages, page_size = cache.shape[:2]
    if cache.stride(3) != 1:
        raise ValueError(
            f"{layout} cache bytes of a token must be contiguous, got {cache.stride()}"
        )
    if layout == "v4" and page_size > 1 and cache.stride(1) != 584:
        raise ValueError(f"V4 cache must have stride(1) == 584, got {cache.stride(1)}")
    if layout == "v4" and num_pages > 1 and cache.stride(0) < page_size * 584:
        raise ValueError(f"V4 page stride {cache.stride(0)} < page_size * 584: pages overlap")
    return cache if cache.dtype == torch.uint8 else cache.view(torch.uint8)


def _rows(cache, slots, device):
    """Output rows, and the slots handed to the kernel (None: every slot in order)."""
    import torch

    num_slots = cache.shape[0] * cache.shape[1]
    if slots is None:
        return num_slots, None
    if not isinstance(slots, torch.Tensor) or slots.dim() != 1 or slots.is_floating_point():
        raise ValueError("slots must be a 1-D integer tensor")
    if slots.numel() and (int(slots.min()) < 0 or int(slots.max()) >= num_slots):
        raise ValueError(f"slots must lie in [0, {num_slots}), got [{slots.min()}, {slots.max()}]")
    return slots.numel(), slots.to(device).contiguous()


def _out(out, rows: int, d: int, device):
    import torch

    if out is None:
        return torch.empty(rows, d, dtype=torch.bfloat16, device=device)
    if out.shape != (rows, d) or out.dtype != torch.bfloat16 or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous bf16 ({rows}, {d}) tensor")
    return out


def dequant_launcher(cache, slots=None, out=None):
    """(launch, out): launch() dequantizes cache (V4 or V3.2, by its last dim) into out, a bf16
    (rows, d_qk) tensor (allocated here unless given), and returns out. All checks and
    allocations happen here; launch() is only the kernel launch."""
    found = of_width(cache.shape[-1]) if cache.dim() else None
    if found is None:
        raise ValueError(f"cache last dim must be 584 (V4) or 656 (V3.2), got {tuple(cache.shape)}")
    layout = found.name
    u8 = _cache_u8(cache, layout)
    rows, slot_t = _rows(u8, slots, u8.device)
    out = _out(out, rows, found.d_qk, u8.device)
    if rows == 0:
        return (lambda: out), out
    kernel = _kernel(f"dequant_{layout}", u8.device)
    grid = (_cdiv(rows, DEQUANT_BLOCK_T),)
    page_size = u8.shape[1]
    has_slots = slot_t is not None
    slot_arg = slot_t if has_slots else out  # never read without HAS_SLOTS
    strides = (u8.stride(0),) if layout == "v4" else (u8.stride(0), u8.stride(1))
    args = (u8, slot_arg, out, rows, *strides)
    meta = {"P": page_size, "HAS_SLOTS": has_slots, "BLOCK_T": DEQUANT_BLOCK_T}

    def launch():
        kernel[grid](*args, **meta, num_warps=DEQUANT_WARPS)
        return out

    return launch, out


def dequant(cache, slots=None, out=None):
    """bf16 (rows, d_qk) of a V4 or V3.2 cache: every slot in order, or the given slots."""
    launch, _ = dequant_launcher(cache, slots, out)
    return launch()


def dequant_v4(cache, slots=None, out=None):
    """V4 cache (pages, P, 1, 584) -> bf16 (rows, 512) = layouts.to_workspace(...).squeeze(1)."""
    _cache_u8(cache, "v4")
    return dequant(cache, slots, out)


def dequant_v32(cache, slots=None, out=None):
    """V3.2 cache (blocks, P, 1, 656) -> bf16 (rows, 576) = layouts.to_workspace(...).squeeze(1)."""
    _cache_u8(cache, "v32")
    return dequant(cache, slots, out)


def remap_launcher(local, block_table, page_size: int, out=None):
    """(launch, out): launch() writes indices.to_global_slots(local, block_table, page_size)
    into out (same shape and dtype as local) and returns it."""
    import torch

    if block_table.dim() != 2 or local.dim() < 1 or local.shape[0] != block_table.shape[0]:
        raise ValueError(
            f"block_table must be (b, max_blocks) with b = local.shape[0], got "
            f"{tuple(block_table.shape)} for local {tuple(local.shape)}"
        )
    if not isinstance(page_size, int) or page_size <= 0:
        raise ValueError(f"page_size must be a positive int, got {page_size!r}")
    if local.is_floating_point() or block_table.is_floating_point():
        raise ValueError("local and block_table must be integer tensors")
    local_c = local.contiguous()
    table = block_table.to(local.device)
    if out is None:
        out = torch.empty_like(local_c, memory_format=torch.contiguous_format)
    elif out.shape != local.shape or out.dtype != local.dtype or not out.is_contiguous():
        raise ValueError("out must be a contiguous tensor of local's shape and dtype")
    n_total = local_c.numel()
    if n_total == 0:
        return (lambda: out), out
    kernel = _kernel("remap", local_c.device)
    per_req = n_total // local_c.shape[0]
    grid = (_cdiv(n_total, REMAP_BLOCK),)
    args = (local_c, table, out, n_total, per_req, table.stride(0), table.stride(1), table.shape[1])
    meta = {"P": page_size, "BLOCK": REMAP_BLOCK}

    def launch():
        kernel[grid](*args, **meta, num_warps=REMAP_WARPS)
        return out

    return launch, out


def remap(local, block_table, page_size: int, out=None):
    """Global slots of request-local positions (reference.indices.to_global_slots)."""
    launch, _ = remap_launcher(local, block_table, page_size, out)
    return launch()


def page_split_launcher(cache, page_size: int = 64, out=None):
    """(launch, out): launch() writes layouts.split_pages_v4(cache, page_size) into out (a V4
    cache of page_size-token pages at the padded page stride, allocated here unless given)."""
    import torch

    from reference import layouts

    if page_size != 64:
        raise ValueError(f"the kernel splits into 64-token pages, got page_size {page_size}")
    u8 = _cache_u8(cache, "v4")
    num_pages, P = u8.shape[:2]
    if P % 64 or P < 64:
        raise ValueError(f"source pages of {P} tokens do not split into 64-token pages")
    if u8.stride(0) % 4 or u8.storage_offset() % 4:
        raise ValueError("the page stride and the storage offset must be multiples of 4 bytes")
    n_new = num_pages * (P // 64)
    if out is None:
        out = layouts.split_pages_v4(u8[:0], 64) if n_new == 0 else _empty_v4(n_new, u8.device)
    if out.shape != (n_new, 64, 1, 584) or out.stride(0) % 4 or out.storage_offset() % 4:
        raise ValueError(f"out must be a V4 cache ({n_new}, 64, 1, 584), 4-byte aligned")
    if n_new == 0:
        return (lambda: out), out
    src = _words(u8)
    dst = _words(out.view(torch.uint8))
    kernel = _kernel("page_split_v4", u8.device)
    args = (src, dst, u8.stride(0) // 4, out.stride(0) // 4)
    meta = {"P": P, "BLOCK": SPLIT_BLOCK}

    def launch():
        kernel[(n_new,)](*args, **meta, num_warps=SPLIT_WARPS)
        return out

    return launch, out


def _empty_v4(num_pages: int, device):
    """An uninitialized V4 cache of 64-token pages at the engines' padded stride."""
    import torch

    from reference import layouts

    stride = layouts.v4_page_stride(64)
    buf = torch.empty(num_pages * stride, dtype=torch.uint8, device=device)
    return buf.as_strided((num_pages, 64, 1, 584), (stride, 584, 584, 1))


def _words(u8):
    """int32 words from the tensor's first byte to the end of its storage (a flat view)."""
    import torch

    n = (u8.untyped_storage().nbytes() - u8.storage_offset()) // 4 * 4
    return torch.as_strided(u8, (n,), (1,), u8.storage_offset()).view(torch.int32)


def page_split(cache, page_size: int = 64, out=None):
    """layouts.split_pages_v4(cache, page_size) by one kernel launch."""
    launch, _ = page_split_launcher(cache, page_size, out)
    return launch()


# ---- the backend ------------------------------------------------------------------------


def _case_reason(case: Case) -> str | None:
    """Why the kernels cannot take this case, whatever the arch; None if they can."""
    if case.op == "dequant":
        reason = fp8_cache_reason(case, "triton dequant kernels")
        if reason:
            return reason
    if case.op == "page_split" and case.layout != "v4":
        return f"the triton page split re-pages v4 caches, not {case.layout}"
    if case.page_size < 1:
        return f"page_size must be >= 1, got {case.page_size}"
    return None


class TritonKernels(Backend):
    name = "triton"
    description = (
        "the project's Triton kernels: sparse MLA decode from the FP8 caches and sparse prefill "
        "(triton_attention), FP8 cache -> bf16 dequant (V4, V3.2), index remap, "
        "the lightning indexer's FP8 logits"
    )
    archs = ("sm90", "sm100", "sm120")
    ops = ("dequant", "remap", "indexer", "decode", "prefill", "page_split")
    layouts = ("v32", "v4")

    def provider(self) -> Provider:
        t = _load()
        return Provider("triton", t.__version__, __name__)

    def supports(self, case: Case, arch: str) -> str | None:
        reason = super().supports(case, arch) or _case_reason(case)
        if reason or case.op not in ("decode", "prefill"):
            return reason
        from dsv4bench.backends import triton_attention

        return triton_attention.case_reason(case)

    def prepare(self, case: Case, inputs: dict, device: str) -> Prepared:
        """Checks and allocates here; run() only launches. poison() returns what it filled."""
        self.provider()  # Unsupported without Triton
        if case.op == "indexer":
            from dsv4bench.backends import triton_indexer

            return triton_indexer.prepare(case, inputs, device)
        if case.op in ("decode", "prefill"):
            from dsv4bench.backends import triton_attention

            return triton_attention.prepare(case, inputs, device)
        reason = _case_reason(case) if case.op in self.ops else f"no {case.op} kernel"
        if reason:
            raise Unsupported(reason)
        if case.op == "dequant":
            cache = inputs["k_cache"]
            check_cache_width(case, "k_cache", cache)
            launch, out = dequant_launcher(cache)
            poison = lambda: out.fill_(float("nan"))
            kernel = f"dequant_{case.layout}"
            info = {"kernel": kernel, "block_tokens": DEQUANT_BLOCK_T, "num_warps": DEQUANT_WARPS}
        elif case.op == "page_split":
            cache = inputs["k_cache"]
            check_cache_width(case, "k_cache", cache)
            launch, out = page_split_launcher(cache, SPLIT_PAGE)
            poison = lambda: out.fill_(0xA5)  # not a byte a correct split leaves everywhere
            info = {"kernel": "page_split_v4", "block_words": SPLIT_BLOCK, "num_warps": SPLIT_WARPS}
        else:
            launch, out = remap_launcher(
                inputs["local_indices"], inputs["block_table"], case.page_size
            )
            poison = lambda: out.fill_(REMAP_POISON)
            info = {"kernel": "remap", "block": REMAP_BLOCK, "num_warps": REMAP_WARPS}
        return Prepared(run=launch, finish=lambda raw: Output(raw), poison=poison, info=info)
