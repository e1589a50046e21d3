"""The lightning indexer of DeepSeek V3.2 / V4 (C4 layers): FP8 logits and top-k, the oracle.

Definitions (DeepGEMM, tests/test_attention.py: `ref_fp8_mqa_logits`, `ref_fp8_paged_mqa_logits`,
`kv_cache_cast_to_fp8`; the API is `deep_gemm.fp8_mqa_logits` / `fp8_paged_mqa_logits`):

    k_j          = float(k_fp8[j]) * s[j]                 one fp32 scale per key token
    logit[i, j]  = sum_h relu(q[i, h] . k_j) * w[i, h]    q: e4m3 (no scale; engines fold the
                                                          q scale into w), w: fp32 (rows, heads)

Since s[j] > 0, relu(q.k_fp8 * s) = relu(q.k_fp8) * s: where the scale multiplies does not
change the value; DeepGEMM's kernels multiply the fp8 dot product by s before the relu.

Ragged form (`fp8_mqa_logits(q (S,H,D) e4m3, (kv (N,D) e4m3, s (N,) fp32), w (S,H), ks, ke)`):
logits (S, N) fp32, -inf outside [ks[i], ke[i]). With `max_seqlen_k` (DeepGEMM's compressed
output) row i is (logits[i, ks[i]:ke[i]] then -inf padding), width max_seqlen_k.

Paged form (`fp8_paged_mqa_logits(q (B,next_n,H,D), kv_cache, w (B*next_n,H), context_lens,
block_table, schedule_meta, max_model_len)`): logits (B*next_n, max_model_len) fp32. Row
b*next_n + j sees keys at request positions p with
    context_lens (B,):          p < context_lens[b] and p <= context_lens[b] - next_n + j
    context_lens (B, next_n):   p < context_lens[b, j]
and -inf everywhere else (DeepGEMM's clean_logits=True). The cache: blocks of `block_size`
tokens, each block `[block_size x D e4m3 | block_size x fp32 scale]` bytes, viewed as
(num_blocks, block_size, 1, D + 4) uint8; the writer stores s = max(amax, 1e-4) / 448 and
e4m3(x * (1 / s)) (`kv_cache_cast_to_fp8`). Position p of request b lives in block
block_table[b, p // block_size] at offset p % block_size.

Top-k (`topk_indices`): per row the k highest logits, descending, as column indices; -1 where a
row has fewer than k finite logits. Ties are broken arbitrarily (by torch.topk): compare top-k
results by the scores they select, never by the index sets.

Configurations (`INDEXERS`; sources: DeepSeek-V3.2-Exp config.json `index_n_heads: 64`,
`index_head_dim: 128`, `index_topk: 2048`, and DeepGEMM's tests use H 64, D 128; the
DeepSeek-V4-Flash config.json `index_n_heads: 64, index_head_dim: 128, index_topk: 512` and
V4-Pro `index_n_heads: 64, index_head_dim: 128, index_topk: 1024`, as quoted by public ports of
those configs). V3.2 runs the indexer in every layer over every token; V4 runs it only in the C4
layers (compress_ratios 4), over the 4x-compressed entries: a query at position p sees
(p + 1) // 4 entries, so the paged form takes per-query (2-D) context lengths there.

Memory: logits are computed in (query rows x key columns) tiles whose fp32 working set stays
near `block_bytes`; the paged form dequantizes one tile of cache blocks at a time. The output
matrix itself is rows x columns fp32 (4 bytes each): that is the size engines must hold.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

BLOCK_BYTES = 128 * 2**20
"""Default working-set budget of one tile (bytes)."""

FP8_MAX = 448.0
AMAX_FLOOR = 1e-4  # kv_cache_cast_to_fp8 clamps amax at 1e-4
SCALE_BYTES = 4
BLOCK_SIZE = 64  # vLLM's indexer cache block; DeepGEMM's tests use 32 and 64


@dataclass(frozen=True)
class IndexerConfig:
    model: str
    heads: int
    head_dim: int
    topk: int
    compress_ratio: int  # 1: every token is a key (V3.2); 4: the C4 compressed entries (V4)
    layers: int  # layers that run the indexer

    def keys(self, context_len: int) -> int:
        """Key entries of a context of `context_len` tokens."""
        return context_len // self.compress_ratio

    def visible(self, pos: torch.Tensor) -> torch.Tensor:
        """Keys a query at position `pos` sees (causal)."""
        return (pos + 1) // self.compress_ratio


INDEXERS = {
    "v3.2": IndexerConfig("v3.2", 64, 128, 2048, 1, 61),
    "v4-flash": IndexerConfig("v4-flash", 64, 128, 512, 4, 21),
    "v4-pro": IndexerConfig("v4-pro", 64, 128, 1024, 4, 30),
}


@contextlib.contextmanager
def _exact_fp32():
    """No TF32 for the duration (the oracle's matmuls are true fp32)."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


# ---- the paged FP8 key cache ----------------------------------------------------------------


SCALE_FORMATS = ("raw", "ue8m0")


def _pow2_ceil(s: torch.Tensor) -> torch.Tensor:
    """2 ** ceil(log2 s) for positive finite fp32 s, exactly (frexp: s = m * 2^e, m in [0.5, 1))."""
    m, e = torch.frexp(s)
    return torch.ldexp(torch.ones_like(s), torch.where(m == 0.5, e - 1, e))


def quantize_key_cache(
    k: torch.Tensor, block_size: int = BLOCK_SIZE, scale_fmt: str = "raw"
) -> torch.Tensor:
    """Keys (n, D) -> the paged FP8 cache (num_blocks, block_size, 1, D + 4) uint8, tokens in
    order (token t in block t // block_size); padding tokens are zeros (scale 1e-4 / 448).
    scale_fmt "raw": s = max(amax, 1e-4) / 448 (DeepGEMM's kv_cache_cast_to_fp8); "ue8m0": s
    rounded up to a power of two (vLLM's indexer_k_quant_and_cache with scale_fmt "ue8m0", the
    fp32 scale still stored as fp32)."""
    if scale_fmt not in SCALE_FORMATS:
        raise ValueError(f"scale_fmt must be one of {SCALE_FORMATS}, got {scale_fmt!r}")
    n, d = k.shape
    num_blocks = max(1, -(-n // block_size))
    x = torch.zeros(num_blocks * block_size, d, dtype=torch.float32, device=k.device)
    x[:n] = k.float()
    sf = x.abs().amax(dim=1, keepdim=True).clamp(min=AMAX_FLOOR) / FP8_MAX
    if scale_fmt == "ue8m0":
        sf = _pow2_ceil(sf)
    fp8 = (x * (1.0 / sf)).to(torch.float8_e4m3fn)
    out = torch.empty(
        num_blocks, block_size * (d + SCALE_BYTES), dtype=torch.uint8, device=k.device
    )
    out[:, : block_size * d] = fp8.view(torch.uint8).view(num_blocks, block_size * d)
    out[:, block_size * d :] = sf.view(num_blocks, block_size).view(torch.uint8)
    return out.view(num_blocks, block_size, 1, d + SCALE_BYTES)


def read_blocks(cache: torch.Tensor, blocks: torch.Tensor | None = None):
    """The e4m3 keys (n, block_size, D) and fp32 scales (n, block_size) of the given blocks
    (all blocks when None). Reads the bytes through the block stride stride(0)."""
    num_blocks, block_size, _, width = cache.shape
    d = width - SCALE_BYTES
    if cache.dtype != torch.uint8 or cache.shape[2] != 1 or d < 1:
        raise ValueError(
            f"expected a (blocks, block_size, 1, D + 4) uint8 cache, got {cache.shape}"
        )
    flat = torch.as_strided(
        cache, (num_blocks, block_size * width), (cache.stride(0), 1), cache.storage_offset()
    )
    if blocks is not None:
        flat = flat[blocks.long()]
    n = flat.shape[0]
    data = flat[:, : block_size * d].contiguous().view(torch.float8_e4m3fn)
    scales = flat[:, block_size * d :].contiguous().view(torch.float32)
    return data.view(n, block_size, d), scales.view(n, block_size)


def dequantize_key_cache(cache: torch.Tensor) -> torch.Tensor:
    """Every token of the cache as fp32 (num_blocks * block_size, D)."""
    data, scales = read_blocks(cache)
    return (data.float() * scales[..., None]).flatten(0, 1)


def split_key_cache(cache: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first n tokens as the ragged form's (kv e4m3 (n, D), scales fp32 (n,))."""
    data, scales = read_blocks(cache)
    return data.flatten(0, 1)[:n].contiguous(), scales.flatten()[:n].contiguous()


# ---- logits ---------------------------------------------------------------------------------


def _scores(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """q (m, H, D) fp32, k (n, D) fp32 dequantized, w (m, H) -> (m, n) sum_h relu(q.k) w."""
    s = torch.einsum("mhd,nd->mhn", q, k)
    return (s.relu_() * w[:, :, None]).sum(dim=1)


def _tiles(rows: int, cols: int, heads: int, block_bytes: int) -> tuple[int, int]:
    """Rows and columns of a tile whose fp32 (rows, heads, cols) scores fit the budget."""
    per_col = 4 * heads
    cols_t = max(1, min(cols, block_bytes // per_col))
    rows_t = max(1, min(rows, block_bytes // (per_col * cols_t)))
    return rows_t, cols_t


def mqa_logits(
    q: torch.Tensor,
    kv: tuple[torch.Tensor, torch.Tensor],
    weights: torch.Tensor,
    ks: torch.Tensor,
    ke: torch.Tensor,
    *,
    max_seqlen_k: int | None = None,
    block_bytes: int = BLOCK_BYTES,
) -> torch.Tensor:
    """The ragged form (DeepGEMM fp8_mqa_logits): (S, N) fp32, or (S, max_seqlen_k) rows
    starting at ks[i] when max_seqlen_k is given."""
    k_fp8, k_scale = kv
    s_len, heads, d = q.shape
    n = k_fp8.shape[0]
    if k_fp8.shape != (n, d) or k_scale.shape != (n,) or weights.shape != (s_len, heads):
        raise ValueError(
            f"shapes: q {tuple(q.shape)}, kv {tuple(k_fp8.shape)}, scales "
            f"{tuple(k_scale.shape)}, weights {tuple(weights.shape)}"
        )
    ks, ke = ks.long(), ke.long()
    out = torch.full((s_len, n), float("-inf"), dtype=torch.float32, device=q.device)
    rows_t, cols_t = _tiles(s_len, n, heads, block_bytes)
    cols = torch.arange(n, device=q.device)
    with _exact_fp32():
        for c in range(0, n, cols_t):
            k = k_fp8[c : c + cols_t].float() * k_scale[c : c + cols_t].float()[:, None]
            for r in range(0, s_len, rows_t):
                qf = q[r : r + rows_t].float()
                tile = _scores(qf, k, weights[r : r + rows_t].float())
                col = cols[None, c : c + cols_t]
                keep = (col >= ks[r : r + rows_t, None]) & (col < ke[r : r + rows_t, None])
                out[r : r + rows_t, c : c + cols_t] = tile.masked_fill(~keep, float("-inf"))
    if max_seqlen_k is None:
        return out
    offs = ks[:, None] + torch.arange(max_seqlen_k, device=q.device)[None, :]
    valid = offs < ke[:, None]
    packed = out.gather(1, offs.clamp(0, max(n - 1, 0)))
    return packed.masked_fill(~valid, float("-inf"))


def paged_visible(context_lens: torch.Tensor, next_n: int) -> torch.Tensor:
    """(B * next_n,) keys each query row sees: the 1-D rule (last next_n positions of each
    request, causal) or the 2-D one (context_lens[b, j] itself)."""
    if context_lens.dim() == 2:
        return context_lens.reshape(-1).long()
    last = (
        context_lens.long()[:, None] - next_n + 1 + torch.arange(next_n, device=context_lens.device)
    )
    return torch.minimum(last, context_lens.long()[:, None]).clamp(min=0).reshape(-1)


def paged_mqa_logits(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_model_len: int,
    *,
    block_bytes: int = BLOCK_BYTES,
) -> torch.Tensor:
    """The paged form (DeepGEMM fp8_paged_mqa_logits, clean_logits=True)."""
    b, next_n, heads, d = q.shape
    block_size = kv_cache.shape[1]
    if kv_cache.shape[-1] != d + SCALE_BYTES:
        raise ValueError(f"cache rows are {kv_cache.shape[-1]} bytes, expected D + 4 = {d + 4}")
    if weights.shape != (b * next_n, heads):
        raise ValueError(f"weights {tuple(weights.shape)}, expected {(b * next_n, heads)}")
    visible = paged_visible(context_lens, next_n).view(b, next_n)
    out = torch.full(
        (b * next_n, max_model_len), float("-inf"), dtype=torch.float32, device=q.device
    )
    _, cols_t = _tiles(next_n, max_model_len, heads, block_bytes)
    blocks_t = max(1, cols_t // block_size)
    with _exact_fp32():
        for i in range(b):
            need = min(int(visible[i].max()), max_model_len)
            n_blocks = -(-need // block_size)
            qf = q[i].float()
            w = weights[i * next_n : (i + 1) * next_n].float()
            for c in range(0, n_blocks, blocks_t):
                ids = block_table[i, c : min(n_blocks, c + blocks_t)]
                data, scales = read_blocks(kv_cache, ids)
                k = (data.float() * scales[..., None]).flatten(0, 1)
                start = c * block_size
                stop = min(start + k.shape[0], max_model_len)
                tile = _scores(qf, k[: stop - start], w)
                pos = torch.arange(start, stop, device=q.device)
                tile = tile.masked_fill(pos[None, :] >= visible[i][:, None], float("-inf"))
                out[i * next_n : (i + 1) * next_n, start:stop] = tile
    return out


def topk_indices(logits: torch.Tensor, k: int, *, block_rows: int = 4096) -> torch.Tensor:
    """(rows, k) int32 column indices of the k highest logits per row, descending; -1 where a
    row has fewer than k finite logits."""
    rows, n = logits.shape
    out = torch.full((rows, k), -1, dtype=torch.int32, device=logits.device)
    kk = min(k, n)
    for r in range(0, rows, block_rows):
        top = logits[r : r + block_rows].topk(kk, dim=1)
        idx = top.indices.masked_fill(top.values == float("-inf"), -1)
        out[r : r + block_rows, :kk] = idx.to(torch.int32)
    return out
