"""The project's Triton kernels for the lightning indexer's FP8 logits (reference/indexer.py has
the definitions): the paged form over the `[block x D e4m3 | block x fp32]` key cache and the
ragged form over contiguous e4m3 keys with one fp32 scale each. Top-k is torch.topk.

  paged   one program per (request, cache block): the block's keys (block_size x D) are loaded
          once and used by the request's next_n query rows; per row a (heads x D) @ (D x block)
          dot, times the key scales, relu, times the row's head weights, summed over heads.
          Positions a row does not see are written -inf (DeepGEMM's clean_logits=True).
  ragged  one program per (BLOCK_Q query rows, BLOCK_N keys): the same per row, -inf outside
          [ks, ke); a row whose range misses the tile skips its dot.

The dot: e4m3 x e4m3 on a GPU (fp32 accumulation, as DeepGEMM's kernels do), or e4m3 widened to
bf16 (exact) when the fp8 dot does not compile; fp32 (ieee) in Triton's CPU interpreter. In
every case the products are exact and only the summation order differs from the oracle
(Hopper's fp8 MMA accumulates with fewer bits: the GPU rows say how much that moves).
"""

from __future__ import annotations

from typing import Any

from dsv4bench.backends import triton_kernels as tk
from dsv4bench.backends.base import Unsupported

PAGED_WARPS = 4
RAGGED_BLOCK_Q = 8  # query rows per program (they share the key tile)
RAGGED_BLOCK_N = 64  # keys per program
RAGGED_WARPS = 4

triton: Any = None
tl: Any = None
_KERNELS: dict[tuple[str, bool], Any] = {}


def _load():
    global triton, tl
    if triton is None:
        tk._load()
        triton, tl = tk.triton, tk.tl
    return triton


def _paged_kernel(
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
    sb = base + BS * D + (pos % BS) * 4
    s0 = tl.load(cache_ptr + sb, mask=kmask, other=0).to(tl.uint32)
    s1 = tl.load(cache_ptr + sb + 1, mask=kmask, other=0).to(tl.uint32)
    s2 = tl.load(cache_ptr + sb + 2, mask=kmask, other=0).to(tl.uint32)
    s3 = tl.load(cache_ptr + sb + 3, mask=kmask, other=0).to(tl.uint32)
    scale = (s0 | (s1 << 8) | (s2 << 16) | (s3 << 24)).to(tl.float32, bitcast=True)
    if DOT == 1:
        k = k.to(tl.bfloat16)
    elif DOT == 2:
        k = k.to(tl.float32)
    for j in tl.static_range(NEXT_N):
        row = b * NEXT_N + j
        if LENS_2D:
            limit = tl.load(lens_ptr + row)
        else:
            limit = tl.minimum(most - NEXT_N + j + 1, most)
        hmask = h < H
        q = tl.load(q_ptr + (row * H + h)[:, None] * D + d[None, :], mask=hmask[:, None], other=0)
        q = q.to(tl.float8e4nv, bitcast=True)
        if DOT == 1:
            q = q.to(tl.bfloat16)
        elif DOT == 2:
            q = q.to(tl.float32)
        w = tl.load(w_ptr + row * H + h, mask=hmask, other=0.0)
        if DOT == 2:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))  # (HP, BS) fp32 accumulation
        s = tl.maximum(s * scale[None, :], 0.0) * w[:, None]
        logit = tl.reduce(s, 0, tl.standard._sum_combine)  # tl.sum: a jit fn
        logit = tl.where(pos < limit, logit, float("-inf"))
        tl.store(out_ptr + row * out_w + pos, logit, mask=pos < out_w)


def _ragged_kernel(
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
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT: tl.constexpr,  # 0: e4m3 x e4m3; 1: widened to bf16; 2: widened to fp32 (interpreter)
):
    pq = tl.program_id(0).to(tl.int64)
    pn = tl.program_id(1).to(tl.int64)
    cols = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    h = tl.arange(0, HP)
    hmask = h < H
    d = tl.arange(0, D)
    k = tl.load(kv_ptr + cols[:, None] * D + d[None, :], mask=cmask[:, None], other=0)
    k = k.to(tl.float8e4nv, bitcast=True)
    if DOT == 1:
        k = k.to(tl.bfloat16)
    elif DOT == 2:
        k = k.to(tl.float32)
    scale = tl.load(scale_ptr + cols, mask=cmask, other=0.0)
    for i in tl.static_range(BLOCK_Q):
        row = pq * BLOCK_Q + i
        if row < S:
            lo = tl.load(ks_ptr + row)
            hi = tl.load(ke_ptr + row)
            if (pn * BLOCK_N < hi) & (pn * BLOCK_N + BLOCK_N > lo):
                q = tl.load(
                    q_ptr + (row * H + h)[:, None] * D + d[None, :], mask=hmask[:, None], other=0
                ).to(tl.float8e4nv, bitcast=True)
                if DOT == 1:
                    q = q.to(tl.bfloat16)
                elif DOT == 2:
                    q = q.to(tl.float32)
                w = tl.load(w_ptr + row * H + h, mask=hmask, other=0.0)
                if DOT == 2:
                    s = tl.dot(q, tl.trans(k), input_precision="ieee")
                else:
                    s = tl.dot(q, tl.trans(k))
                s = tl.maximum(s * scale[None, :], 0.0) * w[:, None]
                logit = tl.reduce(s, 0, tl.standard._sum_combine)  # tl.sum: a jit fn
                logit = tl.where((cols >= lo) & (cols < hi), logit, float("-inf"))
            else:
                logit = tl.full((BLOCK_N,), float("-inf"), tl.float32)
            tl.store(out_ptr + row * N + cols, logit, mask=cmask)


def _ragged_keys_kernel(
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
):
    pq = tl.program_id(0).to(tl.int64)
    pn = tl.program_id(1).to(tl.int64)
    cols = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    h = tl.arange(0, HP)
    hmask = h < H
    d = tl.arange(0, D)
    k = tl.load(kv_ptr + cols[:, None] * D + d[None, :], mask=cmask[:, None], other=0)
    k = k.to(tl.float8e4nv, bitcast=True)
    if DOT == 1:
        k = k.to(tl.bfloat16)
    elif DOT == 2:
        k = k.to(tl.float32)
    scale = tl.load(scale_ptr + cols, mask=cmask, other=0.0)
    for i in range(BLOCK_Q):
        row = tl.minimum(pq * BLOCK_Q + i, S - 1)  # rows past S redo row S - 1 (same values)
        lo = tl.load(ks_ptr + row)
        hi = tl.load(ke_ptr + row)
        if (pn * BLOCK_N < hi) & (pn * BLOCK_N + BLOCK_N > lo):
            q = tl.load(q_ptr + (row * H + h)[:, None] * D + d[None, :], mask=hmask[:, None],
                        other=0).to(tl.float8e4nv, bitcast=True)  # fmt: skip
            if DOT == 1:
                q = q.to(tl.bfloat16)
            elif DOT == 2:
                q = q.to(tl.float32)
            w = tl.load(w_ptr + row * H + h, mask=hmask, other=0.0)
            if DOT == 2:
                s = tl.dot(k, tl.trans(q), input_precision="ieee")
            else:
                s = tl.dot(k, tl.trans(q))  # (BLOCK_N, HP): heads along the accumulator's N
            s = tl.maximum(s * scale[:, None], 0.0) * w[None, :]
            logit = tl.reduce(s, 1, tl.standard._sum_combine)
            logit = tl.where((cols >= lo) & (cols < hi), logit, float("-inf"))
        else:
            logit = tl.full((BLOCK_N,), float("-inf"), tl.float32)
        tl.store(out_ptr + row * N + cols, logit, mask=cmask)

_SOURCES = {"paged": _paged_kernel, "ragged": _ragged_kernel, "ragged_keys": _ragged_keys_kernel}


def _kernel(name: str, device) -> Any:
    return tk.kernel_for(_SOURCES, _KERNELS, _load, name, device)


DOTS = ("fp8", "bf16", "fp32")


def default_dot(device) -> str:
    """fp8 on a GPU; fp32 in Triton's interpreter (its bf16 dot is not numeric: numpy has no
    bf16, and fp8 dots are not emulated)."""
    return "fp32" if device.type == "cpu" else "fp8"


def _dot_code(dot: str | None, device) -> int:
    dot = dot or default_dot(device)
    if dot not in DOTS:
        raise ValueError(f"dot must be one of {DOTS}, got {dot!r}")
    return DOTS.index(dot)


def _heads_padded(h: int) -> int:
    p = 16
    while p < h:
        p *= 2
    return p


def _check_d(d: int) -> None:
    if d < 16 or d & (d - 1):
        raise Unsupported(f"triton indexer needs a power-of-two head_dim >= 16, got {d}")


def _e4m3(x, name: str):
    import torch

    if x.dtype == torch.uint8:
        x = x.view(torch.float8_e4m3fn)
    if x.dtype != torch.float8_e4m3fn:
        raise ValueError(f"{name} must be float8_e4m3fn, got {x.dtype}")
    return x.contiguous().view(torch.uint8)  # loaded as bytes, bitcast to e4m3 in the kernel


def paged_launcher(
    q, kv_cache, weights, context_lens, block_table, max_model_len: int, *, dot: str | None = None
):
    """(launch, out): launch() writes the paged logits (B * next_n, max_model_len) fp32 into out.
    dot: "fp8", "bf16" or "fp32" (DOTS); None: fp8 on a GPU, fp32 in the interpreter."""
    import torch

    b, next_n, heads, d = q.shape
    _check_d(d)
    nb, bs, one, width = kv_cache.shape
    if one != 1 or width != d + 4 or kv_cache.element_size() != 1 or kv_cache.stride(3) != 1:
        raise ValueError(f"kv_cache must be (blocks, block_size, 1, {d + 4}) bytes")
    if bs < 16 or bs & (bs - 1):
        raise Unsupported(f"triton indexer needs a power-of-two block_size >= 16, got {bs}")
    device = q.device
    q8 = _e4m3(q, "q")
    cache = kv_cache.view(torch.uint8)
    w = weights.float().contiguous()
    lens = context_lens.to(torch.int32).contiguous()
    table = block_table.to(torch.int32).contiguous()
    out = torch.empty(b * next_n, max_model_len, dtype=torch.float32, device=device)
    code = _dot_code(dot, device)
    kernel = _kernel("paged", device)
    grid = (b, -(-max_model_len // bs))
    args = (q8, cache, w, lens, table, out, table.stride(0), table.shape[1], cache.stride(0))
    meta = dict(
        H=heads,
        HP=_heads_padded(heads),
        D=d,
        BS=bs,
        NEXT_N=next_n,
        LENS_2D=lens.dim() == 2,
        DOT=code,
    )

    def launch():
        kernel[grid](*args, max_model_len, **meta, num_warps=PAGED_WARPS)
        return out

    return launch, out


TILES = dict(BLOCK_Q=16, BLOCK_N=128, num_warps=4, num_stages=2)


def ragged_launcher(q, kv: tuple, weights, ks, ke, *, dot: str | None = None, tiles=None):
    """(launch, out): launch() writes the ragged logits (S, N) fp32 into out."""
    import torch

    s_len, heads, d = q.shape
    _check_d(d)
    k8 = _e4m3(kv[0], "kv")
    n = k8.shape[0]
    scales = kv[1].float().contiguous()
    device = q.device
    q8 = _e4m3(q, "q")
    w = weights.float().contiguous()
    ks32, ke32 = ks.to(torch.int32).contiguous(), ke.to(torch.int32).contiguous()
    out = torch.empty(s_len, n, dtype=torch.float32, device=device)
    code = _dot_code(dot, device)
    if tiles:
        kernel = _kernel("ragged_keys", device)
        t = dict(TILES, **(tiles if isinstance(tiles, dict) else {}))
        opts = {"num_warps": t.pop("num_warps"), "num_stages": t.pop("num_stages")}
        if device.type == "cpu":
            opts = {}
        grid = (-(-s_len // t["BLOCK_Q"]), -(-n // t["BLOCK_N"]))
        meta = dict(H=heads, HP=_heads_padded(heads), D=d, DOT=code, **t)

        def launch_tiles():
            kernel[grid](q8, k8, scales, w, ks32, ke32, out, s_len, n, **meta, **opts)
            return out

        return launch_tiles, out
    kernel = _kernel("ragged", device)
    grid = (-(-s_len // RAGGED_BLOCK_Q), -(-n // RAGGED_BLOCK_N))
    meta = dict(
        H=heads,
        HP=_heads_padded(heads),
        D=d,
        BLOCK_Q=RAGGED_BLOCK_Q,
        BLOCK_N=RAGGED_BLOCK_N,
        DOT=code,
    )

    def launch():
        kernel[grid](q8, k8, scales, w, ks32, ke32, out, s_len, n, **meta, num_warps=RAGGED_WARPS)
        return out

    return launch, out


def paged_logits(q, kv_cache, weights, context_lens, block_table, max_model_len, **kw):
    launch, _ = paged_launcher(q, kv_cache, weights, context_lens, block_table, max_model_len, **kw)
    return launch()


def ragged_logits(q, kv, weights, ks, ke, **kw):
    launch, _ = ragged_launcher(q, kv, weights, ks, ke, **kw)
    return launch()


def _launcher(case, x: dict, dot: str):
    from dsv4bench.cases import indexer_case

    if "kv" in x:
        return ragged_launcher(
            x["q"], (x["kv"], x["kv_scales"]), x["weights"], x["ks"], x["ke"], dot=dot
        )
    return paged_launcher(
        x["q"],
        x["kv_cache"],
        x["weights"],
        x["context_lens"],
        x["block_table"],
        indexer_case.keys(case),
        dot=dot,
    )


def prepare(case, inputs: dict, device: str):
    """The suite's Prepared for an indexer case: run() = logits kernel + torch top-k."""
    import torch

    from dsv4bench.backends.base import Output, Prepared
    from reference.indexer import topk_indices

    _load()
    dot = default_dot(torch.device(device))
    info: dict = {}
    launch, out = _launcher(case, inputs, dot)
    if dot == "fp8":  # compile now; a Triton that cannot build the e4m3 dot gets bf16
        try:
            launch()
        except Exception as e:
            if isinstance(e, torch.OutOfMemoryError) or "CUDA error" in str(e):
                raise
            info["dot_fallback"] = f"{type(e).__name__}: {e}"[:300]
            dot = "bf16"
            launch, out = _launcher(case, inputs, dot)

    def run():
        logits = launch()
        return logits, topk_indices(logits, case.topk)

    info.update(
        kernel="indexer_ragged" if "kv" in inputs else "indexer_paged",
        dot=dot,
        logits_bytes=out.numel() * out.element_size(),
        topk="torch.topk",
    )
    return Prepared(
        run=run,
        finish=lambda raw: Output(raw[0], None, raw[1]),
        poison=lambda: out.fill_(float("nan")),
        info=info,
    )
