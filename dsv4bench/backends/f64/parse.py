"""An independent, deliberately slow sparse MLA reference: the check on the oracle.

It shares no code with ``reference/``: it parses the FP8 cache bytes itself from the layout
spec (docs/kernel-facts.md, FP8 cache layouts) and loops over (query, head) in float64,
following the definitions of FlashMLA's tests/ref.py written out one token at a time. Use it on
small shapes only.
"""

from __future__ import annotations

import math
import struct

import torch

NAN = float("nan")


def e4m3_value(byte: int) -> float:
    """float8_e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; S.1111.111 is NaN."""
    sign = -1.0 if byte & 0x80 else 1.0
    exponent = (byte >> 3) & 0xF
    mantissa = byte & 0x7
    if exponent == 0xF and mantissa == 0x7:
        return NAN
    if exponent == 0:
        return sign * (mantissa / 8.0) * 2.0**-6
    return sign * (1.0 + mantissa / 8.0) * 2.0 ** (exponent - 7)


def bf16_value(lo: int, hi: int) -> float:
    """Little-endian bfloat16: the top half of a float32."""
    return struct.unpack("<f", struct.pack("<I", (hi << 24) | (lo << 16)))[0]


def fp32_value(raw: list[int]) -> float:
    return struct.unpack("<f", bytes(raw))[0]


def ue8m0_value(byte: int) -> float:
    """Unsigned power-of-two scale: 2^(byte - 127); 0xFF is NaN."""
    return NAN if byte == 0xFF else 2.0 ** (byte - 127)


def bf16_round(x: float) -> float:
    """Round a float32 to bfloat16, nearest even (NaN kept)."""
    if math.isnan(x):
        return NAN
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    bits += 0x7FFF + ((bits >> 16) & 1)
    return struct.unpack("<f", struct.pack("<I", (bits >> 16) << 16 & 0xFFFFFFFF))[0]


RECORD_BYTES = {"v32": 656, "v4": 584}  # the layouts this parser reads, by name


class Fp8Cache:
    """Reads tokens of a V3.2 (656 B) or V4 (584 B) cache by global slot, byte by byte.

    layout: the cache's layout name (the Case's); None: by its record width."""

    def __init__(
        self, cache: torch.Tensor, scale_rounding: str | None = None, layout: str | None = None
    ) -> None:
        if cache.element_size() != 1 or cache.dim() != 4 or cache.shape[2] != 1:
            raise ValueError(f"expected a 1-byte (pages, P, 1, bytes) cache, got {cache.shape}")
        self.cache = cache.cpu().view(torch.uint8)
        self.page_size = cache.shape[1]
        self.record = cache.shape[3]
        if layout is None:
            layout = next((n for n, w in RECORD_BYTES.items() if w == self.record), "")
        if RECORD_BYTES.get(layout) != self.record:
            raise ValueError(
                f"slow_f64 parses {' and '.join(RECORD_BYTES)} caches, not {layout or 'this'} "
                f"({self.record}-byte tokens)"
            )
        self.d = 576 if layout == "v32" else 512
        self.scale_rounding = scale_rounding
        self._tokens: dict[int, list[float]] = {}
        self._pages: dict[int, list[int]] = {}  # V4 bytes by page: one read, not one per token

    def token(self, slot: int) -> list[float]:
        if slot not in self._tokens:
            page, offset = divmod(slot, self.page_size)
            assert 0 <= page < self.cache.shape[0], f"slot {slot} outside the cache"
            if self.record == 656:
                self._tokens[slot] = self._token_v32(page, offset)
            else:
                self._tokens[slot] = self._token_v4(page, offset)
        return self._tokens[slot]

    def _token_v32(self, page: int, offset: int) -> list[float]:
        # [0,512) e4m3 latent, [512,528) 4 x fp32 scale (one per 128), [528,656) 64 x bf16 rope
        raw = self.cache[page, offset, 0].tolist()
        scales = [fp32_value(raw[512 + 4 * i : 516 + 4 * i]) for i in range(4)]
        if self.scale_rounding == "bf16":
            scales = [bf16_round(s) for s in scales]
        elif self.scale_rounding == "e8m0":
            scales = [2.0 ** math.floor(math.log2(s)) if s > 0 else s for s in scales]
        else:
            assert self.scale_rounding in (None, "bf16-product"), self.scale_rounding
        latent = [e4m3_value(raw[i]) * scales[i // 128] for i in range(512)]
        if self.scale_rounding in ("bf16", "bf16-product"):  # the product rounded to bf16
            latent = [bf16_round(x) for x in latent]
        rope = [bf16_value(raw[528 + 2 * i], raw[529 + 2 * i]) for i in range(64)]
        return latent + rope

    def _token_v4(self, page: int, offset: int) -> list[float]:
        # Page = [P x 576 token data | P x 8 scales]; the P*584 logical bytes of one page
        # are contiguous whatever the (padded) page stride is.
        if page not in self._pages:
            self._pages[page] = self.cache[page].reshape(-1).tolist()
        page_bytes = self._pages[page]
        data = page_bytes[offset * 576 : offset * 576 + 576]
        base = self.page_size * 576 + offset * 8
        scales = [ue8m0_value(page_bytes[base + i]) for i in range(7)]
        nope = [e4m3_value(data[i]) * scales[i // 64] for i in range(448)]
        rope = [bf16_value(data[448 + 2 * i], data[449 + 2 * i]) for i in range(64)]
        return nope + rope


def _attend_one(
    q: torch.Tensor, keys: torch.Tensor, scale: float, d_v: int, sink: float | None
) -> tuple[torch.Tensor, float, float]:
    """One (query, head), keys ``(n, d)`` float64: returns (out, lse, max_logit)."""
    if keys.shape[0] == 0:
        return torch.zeros(d_v, dtype=torch.float64), math.inf, -math.inf
    logits = [scale * float(torch.dot(k, q.double())) for k in keys]
    m = max(logits)
    lse = m + math.log(sum(math.exp(x - m) for x in logits))
    out = torch.zeros(d_v, dtype=torch.float64)
    for x, k in zip(logits, keys, strict=True):
        out += math.exp(x - lse) * k[:d_v]
    if sink is not None:
        out *= _sigmoid(lse - sink)
    return out, lse, m


def _sigmoid(x: float) -> float:
    """exp(lse) / (exp(lse) + exp(sink)) with x = lse - sink, for x in [-inf, inf]."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def slow_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    indices: torch.Tensor,
    softmax_scale: float,
    *,
    d_v: int = 512,
    topk_length: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    extra_k_cache: torch.Tensor | None = None,
    extra_indices: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
    scale_rounding: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """out float64 (b, s_q, h, d_v), lse float64 (b, h, s_q)."""
    b, s_q, h, _ = q.shape
    kv_sets = [(Fp8Cache(k_cache, scale_rounding), indices.cpu(), topk_length)]
    if extra_k_cache is not None:
        kv_sets.append(
            (Fp8Cache(extra_k_cache, scale_rounding), extra_indices.cpu(), extra_topk_length)
        )
    out = torch.zeros(b, s_q, h, d_v, dtype=torch.float64)
    lse = torch.zeros(b, h, s_q, dtype=torch.float64)
    q = q.cpu()
    for bi in range(b):
        for si in range(s_q):
            keys = []
            for cache, idx, lengths in kv_sets:
                row = idx[bi, si].tolist()
                used = len(row) if lengths is None else max(0, int(lengths[bi]))
                keys += [cache.token(slot) for slot in row[:used] if slot != -1]
            keys_t = torch.tensor(keys, dtype=torch.float64).reshape(len(keys), q.shape[-1])
            for hi in range(h):
                sink = None if attn_sink is None else float(attn_sink[hi])
                o, row_lse, _ = _attend_one(q[bi, si, hi], keys_t, softmax_scale, d_v, sink)
                out[bi, si, hi] = o
                lse[bi, hi, si] = row_lse
    return out, lse


def slow_prefill(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    *,
    d_v: int = 512,
    attn_sink: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """out float64 (s_q, h, d_v), max_logits and lse float64 (s_q, h)."""
    s_q, h, _ = q.shape
    kv_rows = kv.reshape(kv.shape[0], -1).cpu().double()
    s_kv = kv_rows.shape[0]
    idx = indices.reshape(s_q, -1).cpu()
    out = torch.zeros(s_q, h, d_v, dtype=torch.float64)
    max_logits = torch.zeros(s_q, h, dtype=torch.float64)
    lse = torch.zeros(s_q, h, dtype=torch.float64)
    q = q.cpu()
    for si in range(s_q):
        row = idx[si].tolist()
        used = len(row) if topk_length is None else max(0, int(topk_length[si]))
        keys = kv_rows[[i for i in row[:used] if 0 <= i < s_kv]]
        for hi in range(h):
            sink = None if attn_sink is None else float(attn_sink[hi])
            o, row_lse, row_max = _attend_one(q[si, hi], keys, sm_scale, d_v, sink)
            out[si, hi] = o
            lse[si, hi] = row_lse
            max_logits[si, hi] = row_max
    return out, max_logits, lse
