"""Layout ids and byte offsets of the FP8 caches as the Triton kernels read them, derived from
reference.layout_table (formats: reference/layouts.py; docs/kernel-facts.md, FP8 cache
layouts). Imports no Triton: the host modules pass LAYOUT_IDS[case.layout] to the kernels,
which wrap these numbers as constexprs."""

from __future__ import annotations

from reference.layout_table import LAYOUTS

# the LAYOUT constexpr of the attention kernel: where its keys come from
LAYOUT_IDS = {"bf16": 0, "v32": 1, "v4": 2}
FP8_LAYOUTS = ("v32", "v4")  # the caches the kernels parse

_V32, _V4 = LAYOUTS["v32"], LAYOUTS["v4"]
D_V = 512  # output width: the latent part of K
ROPE = _V32.d_qk - _V32.d_nope  # 64 bf16 rope values per token (both caches)

# V3.2: one record per token: [d_nope e4m3 | tiles x fp32 scale | ROPE x bf16]
V32_TILES = _V32.d_nope // _V32.tile  # 4 tiles of 128 values
V32_TILE = _V32.tile
V32_SCALES_AT = _V32.d_nope  # 512
V32_ROPE_AT = V32_SCALES_AT + 4 * V32_TILES  # 528

# V4: a page of P tokens: P x [d_nope e4m3 | ROPE x bf16], then P x [tiles ue8m0 | pad]
V4_TILES = _V4.d_nope // _V4.tile  # 7 tiles of 64 values
V4_TILE = _V4.tile
V4_ROPE_AT = _V4.d_nope  # 448, within a token's data bytes
V4_DATA_BYTES = _V4.d_nope + 2 * ROPE  # 576
V4_SCALE_BYTES = _V4.token_bytes - V4_DATA_BYTES  # 8 (7 + 1 pad)

assert _V32.token_bytes == V32_ROPE_AT + 2 * ROPE
assert V4_SCALE_BYTES >= V4_TILES and _V4.token_bytes == V4_DATA_BYTES + V4_SCALE_BYTES
assert V4_ROPE_AT == V4_TILES * V4_TILE and (V4_TILES + 1) * V4_TILE == D_V
