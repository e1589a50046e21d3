"""Attention configs of DeepSeek V3.2, V4-Flash, V4-Pro, V4.1 and GLM-5 (the parts the kernels see).

Every number carries where it was read (`sources`: one line per field): an engine file and its
version, or docs/kernel-facts.md for the models' config.json; numbers an engine reads from the
checkpoint's config at load time are not in its code (the line says so and where the value came
from instead), and a model whose per-layer list is not there has `num_layers` 0 (its layer kinds
are unknown)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, fields


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
    # compress ratios its layers take, where the per-layer list is not known (V4.1: 0, 1, 2)
    ratio_kinds: tuple[int, ...] = ()
    sources: tuple[tuple[str, str], ...] = ()  # (field, where its value was read), every field

    def source(self, name: str) -> str:
        """Where field `name`'s value was read; KeyError if it has no source line."""
        return dict(self.sources)[name]

    @property
    def layers_known(self) -> bool:
        """Whether the per-layer structure is known (serving plans need it)."""
        return self.num_layers > 0

    @property
    def d_nope(self) -> int:
        return self.d_qk - self.d_rope

    def layer_kinds(self) -> dict[str, int]:
        """Layer counts by kind: "dense-topk" (V3.2), "window", "c4", "c128"."""
        if not self.layers_known:
            raise ValueError(
                f"{self.name}: its per-layer structure is in the checkpoint's config, not in "
                "the engines' code (no layer counts)"
            )
        if not self.compress_ratios:
            return {"dense-topk": self.num_layers}
        names = {0: "window", 4: "c4", 128: "c128"}
        counts = Counter(names[r] for r in self.compress_ratios)
        return dict(counts)


def sourced() -> tuple[str, ...]:
    """The fields every model gives a source line for: all but its name and the sources."""
    return tuple(f.name for f in fields(ModelConfig) if f.name not in ("name", "sources"))


_FACTS = "docs/kernel-facts.md, Models and layer kinds (the model's config.json)"
_ROUTES = "docs/kernel-facts.md, Head padding and routes"
_SCALE_576 = (
    "576**-0.5, the scale FlashMLA's tests give the 576-wide kernel (docs/kernel-facts.md, "
    "Models and layer kinds); an engine passes its model's own as a number"
)
_NO_RATIOS = (
    f"none: every layer reads one cache through the indexer's top-k, no compressed cache ({_FACTS})"
)


def _v4_sources(heads: str, topk: str, layers: str) -> tuple[tuple[str, str], ...]:
    return (
        ("num_layers", f"{layers}: {_FACTS}"),
        ("num_heads", f"{heads}: {_FACTS}"),
        ("d_qk", f"512 = 448 nope + 64 rope: {_FACTS}"),
        ("d_v", f"512, all of K: {_FACTS}"),
        ("d_rope", f"64: {_FACTS}; docs/kernel-facts.md, V4 584-byte page layout (64 bf16)"),
        ("index_topk", f"{topk}: {_FACTS}"),
        ("window", f"128 (every V4 layer reads the last 128 tokens): {_FACTS}"),
        ("softmax_scale", f"512**-0.5: {_FACTS}"),
        ("cache_layout", "v4, the 584-byte record: docs/kernel-facts.md, V4 584-byte page layout"),
        (
            "page_size",
            f"256, sglang's page: {_ROUTES}",
        ),
        (
            "compress_ratios",
            f"config.json compress_ratios, the trailing MTP entry dropped: {_FACTS}",
        ),
        ("has_sink", f"an attention sink per head: {_FACTS}"),
        ("ratio_kinds", f"none: the per-layer list (compress_ratios) is known ({_FACTS})"),
    )


V32 = ModelConfig(
    name="v3.2",
    num_layers=61,
    num_heads=128,
    d_qk=576,
    d_v=512,
    d_rope=64,
    index_topk=2048,
    window=0,
    softmax_scale=576**-0.5,
    cache_layout="v32",
    page_size=64,
    sources=(
        ("num_layers", f"61: {_FACTS}"),
        ("num_heads", f"128: {_FACTS}"),
        ("d_qk", f"576 = 512 latent + 64 rope: {_FACTS}"),
        ("d_v", f"512, the first 512 of K: {_FACTS}"),
        ("d_rope", "64: docs/kernel-facts.md, V3.2 656-byte record (64 bf16 rope values)"),
        ("index_topk", f"2048: {_FACTS}"),
        ("window", f"0, no sliding window: {_FACTS}"),
        ("softmax_scale", _SCALE_576),
        ("cache_layout", "v32, the 656-byte record: docs/kernel-facts.md, V3.2 656-byte record"),
        (
            "page_size",
            f"64, vLLM's block (vllm/v1/attention/backends/mla/flashmla_sparse.py): {_ROUTES}",
        ),
        ("compress_ratios", _NO_RATIOS),
        ("has_sink", f"none: {_FACTS}"),
        ("ratio_kinds", _NO_RATIOS),
    ),
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
    sources=_v4_sources("64", "512", "43"),
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
    sources=_v4_sources("128", "1024", "61"),
)

_V41_PLAN = "vllm/models/deepseek_v41/amd/mono/attention/plan.py (vLLM 0.33.0)"
_V41_ATTN = "vllm/models/deepseek_v41/attention.py (vLLM 0.33.0)"
# read from the stored vllm-project/vllm snapshot at commit 02ee13b (main, after 0.33.0)
_V41_ATTN_MAIN = "vllm/models/deepseek_v41/attention.py (vLLM main, commit 02ee13b)"
_V41_MLA_MAIN = "vllm/models/deepseek_v41/sparse_mla.py (vLLM main, commit 02ee13b)"
_V41_CONFIG = "the CUDA path reads it from the checkpoint's config"

# Hopper serves V4.1 from the V4 584-byte record: FlashMLA reads V4.1's own 528-byte record
# only in its sm100 kernels (attention.py `_use_v41_mxfp8_kv_record`).
V4_1 = ModelConfig(
    name="v4.1",
    num_layers=0,
    num_heads=64,
    d_qk=512,
    d_v=512,
    d_rope=64,
    index_topk=512,
    window=128,
    softmax_scale=512**-0.5,
    cache_layout="v4",
    page_size=64,
    has_sink=True,
    ratio_kinds=(0, 1, 2),
    sources=(
        (
            "num_layers",
            f"unknown (0): the per-layer compress_ratios are the checkpoint's ({_V41_ATTN_MAIN}: "
            "`getattr(config, 'compress_ratios')`)",
        ),
        (
            "num_heads",
            f"64, N_HEADS: {_V41_PLAN} (the ROCm mono kernel's geometry; {_V41_CONFIG}, "
            f"config.num_attention_heads: {_V41_ATTN_MAIN})",
        ),
        (
            "d_qk",
            f"512, HEAD_DIM: {_V41_PLAN}; get_supported_head_sizes [512] ('448 NoPE + 64 RoPE "
            f"= 512'): {_V41_MLA_MAIN}",
        ),
        (
            "d_v",
            f"512: the output buffer is [tokens, padded heads, head_dim] "
            f"(get_padded_num_q_heads): {_V41_ATTN_MAIN}",
        ),
        ("d_rope", f"64, ROPE: {_V41_PLAN}; '448 NoPE + 64 RoPE': {_V41_MLA_MAIN}"),
        (
            "index_topk",
            f"512, TOPK: {_V41_PLAN} (the ROCm mono kernel's; {_V41_CONFIG}, "
            f"hf_config.index_topk: {_V41_MLA_MAIN}). vLLM issue 56837's top-k 1152 at 64 heads "
            "is a decode call's whole index width, window 128 + 1024 compressed entries (a "
            "checkpoint with index_topk 1024): the envelope's V4 cells at extra_topk 1024",
        ),
        ("window", f"128, WINDOW: {_V41_PLAN}"),
        ("softmax_scale", f"head_dim**-0.5 (`self.scale = self.head_dim**-0.5`): {_V41_ATTN_MAIN}"),
        ("cache_layout", f"v4 on sm90 (_use_v41_mxfp8_kv_record: sm100 only): {_V41_ATTN}"),
        (
            "page_size",
            f"64: get_supported_kernel_block_sizes returns [64] on SM90 ('for alignment with "
            f"the indexer kernel constraints'), 128 elsewhere: {_V41_MLA_MAIN}",
        ),
        (
            "compress_ratios",
            f"unknown: one per layer in the checkpoint's config ({_V41_ATTN_MAIN})",
        ),
        ("has_sink", f"attn_sink (DeepseekV4Attention): {_V41_ATTN}"),
        (
            "ratio_kinds",
            f"0 / 1 / 2: {_V41_ATTN} (DeepseekV4Attention); ratio 1 / 2 share one compressed "
            "cache, each with its own tile-scheduler plan: vllm/models/deepseek_v41/sparse_mla.py "
            "(vLLM 0.33.0)",
        ),
    ),
)

_DSA = "sglang/srt/layers/attention/dsa_backend.py (sglang 0.5.23)"
_GLM_FLASH = "vllm/v1/attention/backends/mla/flashinfer_mla_sparse_sm90.py (vLLM 0.33.0)"
_GLM_V32 = (
    "V3.2's (GlmMoeDsaForCausalLM = DeepseekV32ForCausalLM): "
    "vllm/models/deepseek_v32/__init__.py (vLLM 0.33.0)"
)
_TRANSFORM = "sglang/kernels/ops/attention/dsa/transform_index.py (sglang 0.5.23)"
_NO_LAYERS = "unknown (0): the layer list is the checkpoint's config, not the engines' code"

# GLM-5.1 / 5.2 (glm_moe_dsa) run the V3.2 architecture (vllm/models/deepseek_v32/__init__.py,
# vLLM 0.33.0): V3.2's widths, cache and indexer, with 64 heads.
GLM_5_2 = ModelConfig(
    name="glm-5.2",
    num_layers=0,
    num_heads=64,
    d_qk=576,
    d_v=512,
    d_rope=64,
    index_topk=2048,
    window=0,
    softmax_scale=576**-0.5,
    cache_layout="v32",
    page_size=64,
    sources=(
        ("num_layers", _NO_LAYERS),
        ("num_heads", f"64 (8 per rank at TP8): {_DSA} ('GLM-5 64 heads / TP8 = 8')"),
        ("d_qk", f"576, {_GLM_V32}"),
        ("d_v", f"512, {_GLM_V32}"),
        ("d_rope", f"64, {_GLM_V32}"),
        ("index_topk", f"2048 (the 2048-wide page-table transform): {_TRANSFORM}"),
        ("window", f"0, {_GLM_V32}"),
        ("softmax_scale", f"as V3.2's ({_SCALE_576})"),
        ("cache_layout", f"v32, the 656-byte record: {_GLM_V32}"),
        ("page_size", f"64, as V3.2 (vLLM's block, {_ROUTES}): {_GLM_V32}"),
        ("compress_ratios", f"{_NO_RATIOS}: {_GLM_V32}"),
        ("has_sink", f"none, {_GLM_V32}"),
        ("ratio_kinds", _NO_RATIOS),
    ),
)

# GLM-5.3-Flash (glm5_next): NoPE MLA, keys of 512 latent values and no rope, in FlashMLA's
# 528-byte V32_NO_ROPE record (sglang; vLLM's FlashInfer sm90 backend keeps plain E4M3 rows).
GLM_5_3_FLASH = ModelConfig(
    name="glm-5.3-flash",
    num_layers=0,
    num_heads=64,
    d_qk=512,
    d_v=512,
    d_rope=0,
    index_topk=2048,
    window=0,
    softmax_scale=512**-0.5,
    cache_layout="v32-nope",
    page_size=64,
    sources=(
        ("num_layers", _NO_LAYERS),
        (
            "num_heads",
            "64: not in the engines' code (they read the checkpoint's num_attention_heads); "
            "taken from vLLM issue 56564 and the TP3 split (24 + 24 + 16 heads) of its public "
            "ports",
        ),
        ("d_qk", f"512 latent (NoPE, head_dim_kpe=0): {_GLM_FLASH}"),
        ("d_v", f"512 latent: {_GLM_FLASH}"),
        ("d_rope", f"0 (NoPE, head_dim_kpe=0): {_GLM_FLASH}"),
        ("index_topk", f"2048 (index_topk + index_kpool - 1 = 2051): {_TRANSFORM}"),
        (
            "window",
            "0: not read from its code; it runs V3.2's sparse MLA (vLLM issue 56564), which "
            f"has no sliding window ({_FACTS})",
        ),
        (
            "softmax_scale",
            f"512**-0.5, d_qk**-0.5 as V3.2's ({_SCALE_576}); the checkpoint's own scale not read",
        ),
        (
            "cache_layout",
            f"v32-nope, flashmla_kv_format V32_NO_ROPE when qk_rope_head_dim == 0: {_DSA}",
        ),
        (
            "page_size",
            f"64: not read for GLM-5.3-Flash itself; the DSA cache's block as V3.2 ({_ROUTES})",
        ),
        ("compress_ratios", f"{_NO_RATIOS} (the DSA attention of {_DSA})"),
        (
            "has_sink",
            "none: not read from its code; it runs V3.2's sparse MLA (vLLM issue 56564), which "
            f"has none ({_FACTS})",
        ),
        ("ratio_kinds", _NO_RATIOS),
    ),
)

MODELS: dict[str, ModelConfig] = {
    m.name: m for m in (V32, V4_FLASH, V4_PRO, V4_1, GLM_5_2, GLM_5_3_FLASH)
}
