"""The project's Triton kernels for the lightning indexer's FP8 logits (reference/indexer.py has
the definitions): the paged form over the `[block x D e4m3 | block x fp32]` key cache and the
ragged form over contiguous e4m3 keys with one fp32 scale each. Top-k is torch.topk.

  paged   one program per (request, cache block): the block's keys (block_size x D) are loaded
          once and used by the request's next_n query rows; per row a (block x D) @ (D x heads)
          dot (keys as M: 1.4-1.9x the (heads x D) @ (D x block) form, KEYS_M), times the key
          scales, relu, times the row's head weights, summed over heads. Positions a row does
          not see are written -inf (DeepGEMM's clean_logits=True).
  ragged  one program per (BLOCK_Q query rows, BLOCK_N keys): the key tile is loaded once
          and, row after row, is the M of a (BLOCK_N x D) @ (D x heads) dot: the head sum
          then stays within a thread's quad (heads as M instead, summed across threads, was
          2x slower on an H100: results/sm90/triton-speed-h100). -inf outside [ks, ke). The
          row loop is software-pipelined (the next rows' q in flight), which needs every row
          to run its dot (SKIP off: a row outside the tile is masked, not skipped), and the
          key scale's sign is folded into the key bytes (relu(s * c) = |c| relu(s * sign(c)),
          exact for any sign), leaving one max and one fma per (key, head). A program whose
          rows all miss its key tile (past the causal diagonal) writes -inf without a dot.

The dot: e4m3 x e4m3 on a GPU (fp32 accumulation, as DeepGEMM's kernels do), or e4m3 widened to
bf16 (exact) when the fp8 dot does not compile; fp32 (ieee) in Triton's CPU interpreter. In
every case the products are exact and only the summation order differs from the oracle
(Hopper's fp8 MMA accumulates with fewer bits: the GPU rows say how much that moves).
"""

from __future__ import annotations

from typing import Any

from dsv4bench.backends.base import Unsupported
from dsv4bench.backends.triton import jit

PAGED_WARPS = 4
PAGED_KEYS_M = True  # keys as the dot's M: 1.4-1.9x the heads-as-M form on an H100
RAGGED_BLOCK_Q = 64  # query rows per program (they share the key tile)
RAGGED_BLOCK_N = 256  # keys per program: each q row load serves 256 keys (1.3-1.45x 128)
RAGGED_WARPS = 4
RAGGED_STAGES = 3  # the row loop pipelined: the next rows' q in flight (needs SKIP off)
RAGGED_SKIP = False  # a row whose range misses the tile still runs its dot, masked
RAGGED_SIGN_FOLD = True  # one max + one fma per (key, head): 1.07-1.1x


def _kernel(name: str, device) -> Any:
    return jit.kernel("indexer", name, device)


def _opts(device, **opts) -> dict:
    return {} if device.type == "cpu" else opts


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
    q,
    kv_cache,
    weights,
    context_lens,
    block_table,
    max_model_len: int,
    *,
    dot: str | None = None,
    keys_m: bool = PAGED_KEYS_M,
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
        KEYS_M=keys_m,
    )
    opts = _opts(device, num_warps=PAGED_WARPS)

    def launch():
        kernel[grid](*args, max_model_len, **meta, **opts)
        return out

    return launch, out


def ragged_launcher(q, kv: tuple, weights, ks, ke, *, dot: str | None = None, tiles=None):
    """(launch, out): launch() writes the ragged logits (S, N) fp32 into out. tiles: a dict
    overriding BLOCK_Q, BLOCK_N, num_warps, num_stages (sweeps)."""
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
    t = dict(BLOCK_Q=RAGGED_BLOCK_Q, BLOCK_N=RAGGED_BLOCK_N, num_warps=RAGGED_WARPS,
             STAGES=RAGGED_STAGES, SKIP=RAGGED_SKIP, SIGN_FOLD=RAGGED_SIGN_FOLD)  # fmt: skip
    t.update(tiles or {})
    opts = _opts(device, num_warps=t.pop("num_warps"))
    kernel = _kernel("ragged", device)
    grid = (-(-s_len // t["BLOCK_Q"]), -(-n // t["BLOCK_N"]))
    meta = dict(H=heads, HP=_heads_padded(heads), D=d, DOT=_dot_code(dot, device), **t)

    def launch():
        kernel[grid](q8, k8, scales, w, ks32, ke32, out, s_len, n, **meta, **opts)
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

    from dsv4bench.backends.base import Prepared
    from dsv4bench.cases.output import Output
    from reference.indexer import topk_indices

    jit.load()
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
        logits=launch,
    )
