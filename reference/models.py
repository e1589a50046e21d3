"""Attention configs of DeepSeek V3.2, V4-Flash, V4-Pro, V4.1 and GLM-5 (the parts the kernels see).

Each newer model's numbers carry the engine file and version they were read from (`sources`);
numbers an engine reads from the checkpoint's config at load time are not in its code, and a
model whose per-layer list is not there has `num_layers` 0 (its layer kinds are unknown)."""

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
    # compress ratios its layers take, where the per-layer list is not known (V4.1: 0, 1, 2)
    ratio_kinds: tuple[int, ...] = ()
    sources: tuple[str, ...] = ()  # "field: engine file (version)" for each number read

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

_V41_PLAN = "vllm/models/deepseek_v41/amd/mono/attention/plan.py (vLLM 0.33.0)"
_V41_ATTN = "vllm/models/deepseek_v41/attention.py (vLLM 0.33.0)"

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
    page_size=256,
    has_sink=True,
    ratio_kinds=(0, 1, 2),
    sources=(
        f"num_heads N_HEADS, d_qk HEAD_DIM, d_rope ROPE, window WINDOW, index_topk TOPK: "
        f"{_V41_PLAN}",
        f"ratio_kinds 0 / 1 / 2, attn_sink: {_V41_ATTN} (DeepseekV4Attention)",
        "ratio 1 / 2 share one compressed cache, each with its own tile-scheduler plan: "
        "vllm/models/deepseek_v41/sparse_mla.py (vLLM 0.33.0)",
        f"cache_layout v4 on sm90: {_V41_ATTN} (_use_v41_mxfp8_kv_record: sm100 only)",
    ),
)

_DSA = "sglang/srt/layers/attention/dsa_backend.py (sglang 0.5.23)"
_GLM_FLASH = "vllm/v1/attention/backends/mla/flashinfer_mla_sparse_sm90.py (vLLM 0.33.0)"

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
        "architecture of V3.2 (GlmMoeDsaForCausalLM = DeepseekV32ForCausalLM): "
        "vllm/models/deepseek_v32/__init__.py (vLLM 0.33.0)",
        f"num_heads 64 (8 per rank at TP8): {_DSA} ('GLM-5 64 heads / TP8 = 8')",
        "index_topk 2048 (the 2048-wide page-table transform): "
        "sglang/kernels/ops/attention/dsa/transform_index.py (sglang 0.5.23)",
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
        f"d_rope 0 (NoPE, head_dim_kpe=0), d_qk = d_v = 512 latent: {_GLM_FLASH}",
        f"flashmla_kv_format V32_NO_ROPE when qk_rope_head_dim == 0: {_DSA}",
        "index_topk 2048 (index_topk + index_kpool - 1 = 2051): "
        "sglang/kernels/ops/attention/dsa/transform_index.py (sglang 0.5.23)",
        "num_heads 64: not in the engines' code; vLLM issue 56564 and the TP3 split "
        "(24 + 24 + 16 heads) of its public ports",
    ),
)

MODELS: dict[str, ModelConfig] = {
    m.name: m for m in (V32, V4_FLASH, V4_PRO, V4_1, GLM_5_2, GLM_5_3_FLASH)
}
