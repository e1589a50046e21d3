"""Attention configs of DeepSeek V3.2, V4-Flash and V4-Pro (the parts the kernels see)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelConfig:
    name: str
    num_layers: int
    num_heads: int
    d_qk: int
    d_v: int
    d_rope: int
    index_topk: int  # top-k of the indexer (V3.2: every layer; V4: C4 layers)
    window: int  # sliding window every layer attends to (V4), 0 = none
    softmax_scale: float
    cache_layout: str  # "v32" (656 B/token) or "v4" (584 B/token, paged SoA)
    page_size: int  # the cache page size engines use for this model
    compress_ratios: tuple[int, ...] = ()  # per attention layer: 0 window only, 4 C4, 128 C128
    has_sink: bool = False

    @property
    def d_nope(self) -> int:
        return self.d_qk - self.d_rope

    def layer_kinds(self) -> dict[str, int]:
        """Layer counts by kind: "dense-topk" (V3.2), "window", "c4", "c128"."""
        if not self.compress_ratios:
            return {"dense-topk": self.num_layers}
        names = {0: "window", 4: "c4", 128: "c128"}
        counts = Counter(names[r] for r in self.compress_ratios)
        return dict(counts)


V32 = ModelConfig(
    name="v3.2",
    num_layers=61,
    num_heads=128,
    d_qk=576,
    d_v=512,
    d_rope=64,
    index_topk=2048,
    window=0,
    softmax_scale=576**-0.5,  # FlashMLA's tests use d_qk ** -0.5 for the 576-wide kernel
    cache_layout="v32",
    page_size=64,
)

# compress_ratios from the model configs; the trailing MTP entry is not a main-model layer.
_V4_FLASH_RATIOS = (0, 0) + (4, 128) * 20 + (4,)
_V4_PRO_RATIOS = (128, 128) + (4, 128) * 29 + (4,)

V4_FLASH = ModelConfig(
    name="v4-flash",
    num_layers=43,
    num_heads=64,
    d_qk=512,
    d_v=512,
    d_rope=64,
    index_topk=512,
    window=128,
    softmax_scale=512**-0.5,
    cache_layout="v4",
    page_size=256,
    compress_ratios=_V4_FLASH_RATIOS,
    has_sink=True,
)

V4_PRO = ModelConfig(
    name="v4-pro",
    num_layers=61,
    num_heads=128,
    d_qk=512,
    d_v=512,
    d_rope=64,
    index_topk=1024,
    window=128,
    softmax_scale=512**-0.5,
    cache_layout="v4",
    page_size=256,
    compress_ratios=_V4_PRO_RATIOS,
    has_sink=True,
)

MODELS: dict[str, ModelConfig] = {m.name: m for m in (V32, V4_FLASH, V4_PRO)}
