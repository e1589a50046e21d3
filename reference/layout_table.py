"""The KV-cache layouts: every fact a module needs about one, in one table (no torch import).

Adding a layout means one `CacheLayout` entry here, its writer and reader (named by
`write`/`read`, in reference/layouts.py or any module `module` names), the backends that opt in
(their `layouts`), and tests; every other module asks this table (bytes per token for metrics,
d_qk for validation and backends, conventions for scenarios). A layout's identity is its name,
carried by the Case from the scenario to every reader: never guessed from a width.
The byte formats themselves are described in reference/layouts.py's docstring.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class CacheLayout:
    name: str
    description: str
    token_bytes: int | None  # bytes one token occupies; None: bf16 rows of 2 * d_qk bytes
    d_qk: int | None  # the key width it stores (latent + rope); None: any (bf16 rows)
    d_v: int  # the value width (the latent part the output reads)
    d_nope: int | None  # FP8 part of a token; the rest (d_qk - d_nope) is bf16 rope
    tile: int | None  # values sharing one scale
    scale_format: str  # "fp32" (read exactly, or as bf16/e8m0 per arch), "ue8m0", "" (none)
    conventions: tuple[str, ...]  # scale writers (reference.layouts), the default first
    page_size: int = 64  # tokens per page engines use by default
    write: str = ""  # function (kv [N, d_qk] fp32, page_size, convention) -> cache
    read: str = ""  # function (cache, *, scale_rounding) -> fp32 [slots, d_qk]
    # optional: (cache, slots, scale_rounding) -> fp32 [len(slots), d_qk] reading only those
    # tokens (without one, `read` then index: fine for small caches)
    gather: str = ""
    # optional: (cache, slots) writing NaN-reading tokens in place (without one, unused slots
    # keep the writer's values and a kernel reading outside its indices goes unseen)
    poison: str = ""
    module: str = "reference.layouts"  # where write/read/gather/poison live

    @property
    def fp8(self) -> bool:
        return self.token_bytes is not None

    @property
    def default_convention(self) -> str:
        return self.conventions[0] if self.conventions else ""

    @property
    def sizes(self) -> tuple:
        """(token_bytes, d_qk, d_nope, tile)."""
        return self.token_bytes, self.d_qk, self.d_nope, self.tile

    def bytes_per_token(self, d_qk: int) -> int:
        return self.token_bytes if self.token_bytes is not None else 2 * d_qk

    @property
    def complete(self) -> bool:
        """Whether the oracle can build and read this layout (a writer and a reader exist)."""
        return bool(self.write and self.read)

    def _function(self, name: str) -> Callable:
        if not name:
            raise ValueError(f"layout {self.name} has no such function in the layout table")
        return getattr(importlib.import_module(self.module), name)

    def writer(self) -> Callable:
        return self._function(self.write)

    def reader(self) -> Callable:
        return self._function(self.read)

    def gatherer(self) -> Callable | None:
        return self._function(self.gather) if self.gather else None

    def poisoner(self) -> Callable | None:
        return self._function(self.poison) if self.poison else None


LAYOUTS: dict[str, CacheLayout] = {
    "v32": CacheLayout(
        "v32",
        "DeepSeek V3.2: token-major 656 B records (512 e4m3, 4 fp32 scales, 64 bf16 rope)",
        token_bytes=656,
        d_qk=576,
        d_v=512,
        d_nope=512,
        tile=128,
        scale_format="fp32",
        conventions=("pow2", "raw"),  # raw: any fp32 scale (vLLM 0.33.0 writes pow2)
        write="quantize_v32",
        read="dequantize_v32",
        gather="gather_v32",
        poison="poison_v32",
    ),
    "v4": CacheLayout(
        "v4",
        "DeepSeek V4 (FlashMLA MODEL1): 584 B per token, data then ue8m0 scales per page",
        token_bytes=584,
        d_qk=512,
        d_v=512,
        d_nope=448,
        tile=64,
        scale_format="ue8m0",
        conventions=("flashmla", "vllm", "sglang"),
        write="quantize_v4",
        read="dequantize_v4",
        gather="gather_v4",
        poison="poison_v4",
    ),
    "v41": CacheLayout(
        "v41",
        "DeepSeek V4.1 (FlashMLA V41, sm100 kernels): 528 B per token, 512 e4m3 (rope "
        "included), then 16 ue8m0 scales of 32 values",
        token_bytes=528,
        d_qk=512,
        d_v=512,
        d_nope=512,
        tile=32,
        scale_format="ue8m0",
        conventions=("vllm",),
        page_size=256,
        write="quantize_v41",
        read="dequantize_v41",
        gather="gather_v41",
        module="reference.layouts_v41",
    ),
    "v41-fp4": CacheLayout(
        "v41-fp4",
        "DeepSeek V4.1 FP4 compressed cache (FlashMLA V41_FP4, extra cache only): 288 B per "
        "token, 512 e2m1 (two a byte, even index low), then 32 e4m3 scales of 16 values",
        token_bytes=288,
        d_qk=512,
        d_v=512,
        d_nope=512,
        tile=16,
        scale_format="e4m3",
        conventions=("vllm",),
        page_size=256,
        write="quantize_v41_fp4",
        read="dequantize_v41_fp4",
        gather="gather_v41_fp4",
        module="reference.layouts_v41",
    ),
    "v41-blocks": CacheLayout(
        "v41-blocks",
        "DeepSeek V4.1 records as FlashMLA read them before 2026.09.30: a page's 512-byte "
        "data rows, then its 16-byte ue8m0 scale rows (page stride padded to 512)",
        token_bytes=528,
        d_qk=512,
        d_v=512,
        d_nope=512,
        tile=32,
        scale_format="ue8m0",
        conventions=("vllm",),
        page_size=256,
        write="quantize_v41_blocks",
        read="dequantize_v41_blocks",
        gather="gather_v41_blocks",
        module="reference.layouts_blocks",
    ),
    "v41-fp4-blocks": CacheLayout(
        "v41-fp4-blocks",
        "DeepSeek V4.1 FP4 records before 2026.09.30: a page's 256-byte e2m1 data rows, then "
        "its 32-byte e4m3 scale rows (page stride padded to 256)",
        token_bytes=288,
        d_qk=512,
        d_v=512,
        d_nope=512,
        tile=16,
        scale_format="e4m3",
        conventions=("vllm",),
        page_size=256,
        write="quantize_v41_fp4_blocks",
        read="dequantize_v41_fp4_blocks",
        gather="gather_v41_fp4_blocks",
        module="reference.layouts_blocks",
    ),
    "v32-nope": CacheLayout(
        "v32-nope",
        "NoPE MLA (FlashMLA V32_NO_ROPE, GLM-5.3-Flash): 528 B per token, 512 e4m3, then 4 "
        "fp32 scales of 128 values; no rope",
        token_bytes=528,
        d_qk=512,
        d_v=512,
        d_nope=512,
        tile=128,
        scale_format="fp32",
        conventions=("pow2", "raw"),
        write="quantize_v32_nope",
        read="dequantize_v32_nope",
        gather="gather_v32_nope",
        module="reference.layouts_v41",
    ),
    "indexer-fp8": CacheLayout(
        "indexer-fp8",
        "the lightning indexer's paged FP8 keys (DeepGEMM's, vLLM's indexer cache): a page's "
        "128-byte e4m3 keys, then their fp32 scales (one per key)",
        token_bytes=132,
        d_qk=128,
        d_v=128,
        d_nope=128,
        tile=128,
        scale_format="fp32",
        conventions=("ue8m0", "raw"),  # ue8m0: vLLM's scale_fmt on sm90; raw: DeepGEMM's
        write="quantize_indexer",
        read="dequantize_indexer",
        gather="gather_indexer",
        module="reference.layouts_indexer",
    ),
    "bf16": CacheLayout(
        "bf16",
        "plain bf16 rows (the sparse-prefill workspace)",
        token_bytes=None,
        d_qk=None,
        d_v=512,
        d_nope=None,
        tile=None,
        scale_format="",
        conventions=(),
    ),
}

FP8_LAYOUTS = tuple(name for name, lay in LAYOUTS.items() if lay.fp8)  # as shipped


def layout(name: str) -> CacheLayout:
    try:
        return LAYOUTS[name]
    except KeyError:
        raise ValueError(f"unknown layout {name!r} (known: {', '.join(LAYOUTS)})") from None


def of_width(token_bytes: int) -> CacheLayout | None:
    """The one FP8 layout whose tokens take `token_bytes`, else None (none, or several).

    Only for a cache handed in without its name (reference/ used on its own, and the Triton
    files until they read `layout(case.layout)`): the pipeline carries the name."""
    found = [lay for lay in LAYOUTS.values() if lay.token_bytes == token_bytes]
    return found[0] if len(found) == 1 else None


def of_cache(cache, name: str | None = None) -> CacheLayout:
    """The entry of a cache tensor's layout: `name`'s (checked against the cache's last
    dimension), or without a name the one layout of that width."""
    width = cache.shape[-1] if cache.dim() else None
    if name is None:
        found = of_width(width) if width is not None else None
        if found is None:
            widths = " or ".join(
                f"{lay.token_bytes} ({n})" for n, lay in LAYOUTS.items() if lay.fp8
            )
            raise ValueError(
                f"cache last dim must be {widths} (or pass layout=), got {tuple(cache.shape)}"
            )
        return found
    lay = layout(name)
    if not lay.fp8 or width != lay.token_bytes:
        raise ValueError(
            f"a {name} cache has {lay.token_bytes}-byte tokens, got shape {tuple(cache.shape)}"
        )
    return lay


def of_d_qk(d_qk: int) -> str:
    """The FP8 layout storing keys of width d_qk, else "bf16" (a model's default layout)."""
    return next((n for n, lay in LAYOUTS.items() if lay.fp8 and lay.d_qk == d_qk), "bf16")
