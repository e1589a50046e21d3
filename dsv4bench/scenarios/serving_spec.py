"""The `op: serving` spec: its keys, validation of a plain mapping, and route names.

scenarios/serving_entry.py reads the YAML file (with lines) and hands its values here."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from dsv4bench.cases.case import HEAD_PADDINGS, ROUTES, Timing, Tolerance, padding_count
from reference.layout_table import LAYOUTS
from reference.models import MODELS, ModelConfig

LABEL = (
    "sparse-attention part of TTFT/TPOT (kernels, dequant, index remap), "
    "without GEMMs, MoE and communication"
)
TAG = "serving"
BASE_ROUTES = ROUTES  # kernel routes a chunk can take: sparse-prefill, decode-kernel, decode-mixed
DEFAULT_ROUTES = ("sparse-prefill", "decode-kernel")
DECODE_ROUTES = ("decode-kernel", "decode-mixed")  # the FP8 decode kernel: no dequant, no remap
# How much of the window cache the sparse-prefill route dequantizes per chunk and layer:
#   read  what the chunk's queries read, min(context, chunk + window - 1) tokens (sglang's
#         build_swa_token_ids, python/sglang/srt/layers/attention/dsv4/sparse_prefill_utils.py;
#         vLLM's gather_lens, vllm/v1/attention/backends/mla/sparse_swa.py)
#   pool  the whole window pool of the request, every token written so far (context tokens):
#         sglang #25502 stages the SWA pool into bf16 before flash_mla_sparse_fwd
DEQUANT_MODES = ("read", "pool")
# Where the TPOT model pays for C128 layers' decode indices (every visible compressed entry as
# a global slot, from the block table):
#   none   not counted (the decode call takes them ready, as before)
#   step   once per decode step for all C128 layers (vLLM: DeepseekV4FlashMLAMetadataBuilder.
#          _build_c128a_metadata, vllm/models/deepseek_v4/sparse_mla.py)
#   layer  once per C128 layer
C128_INDEX_MODES = ("none", "step", "layer")
SGLANG_DSV4_THRESHOLD = 11673  # sglang's DSv4 backend: q.shape[0] > 11673 -> sparse prefill
TOPK_PADDINGS = ("clamp", "full")
# index width multiple: the decode kernel's topk rule (docs/kernel-facts.md, FlashMLA sparse
# attention contract)
ALIGN = 64
PREFILL_ALIGN = 128  # merged index width of the sparse prefill (inputs pad to it)
ROLES = ("attention", "dequant", "remap", "indexer")
# The role of a cache-writer part (spec key cache_write); in breakdown_ms only where a point
# has one, so rows without the writer keep their keys.
WRITER = "cache_write"
# The scale convention the engines' own writers write (a writer case is judged in it, whatever
# the attention cases read): vLLM 0.33.0's concat_and_cache_mla "fp8_ds_mla" is pow2 byte for
# byte on H100 (results/sm90/studies/dsa-helpers/README.md); vLLM's V4 quantize_and_insert_k_cache
# is the oracle's "vllm" (docs/dsa-helpers.md). Other layouts: their default.
WRITER_CONVENTION = {"v32": "pow2", "v4": "vllm"}
LABEL_INDEXER = (
    "sparse-attention part of TTFT/TPOT (kernels, dequant, index remap) plus the lightning "
    "indexer (FP8 logits + top-k), without GEMMs, MoE and communication"
)

KEYS: dict[str, str] = {
    "op": 'must be "serving" when present (the scenario entry kind)',
    "model": f"model name: {', '.join(MODELS)}",
    "scenario": 'scenario name recorded in every case and row (default "serving")',
    "prompt_lens": "TTFT: prompt lengths L in tokens (ints, or strings like 64K)",
    "chunk_sizes": "TTFT: chunked-prefill sizes C in tokens; the last chunk of a prompt is shorter",
    "routes": (
        "TTFT: sparse-prefill | decode-kernel (q (T, 1, h, d), sglang) | decode-mixed "
        "(q (1, T, h, d), vLLM's mixed batch) | threshold:N (decode-kernel for chunks of <= N "
        f"tokens; sglang's DSv4 uses {SGLANG_DSV4_THRESHOLD}) | safe (threshold = the measured "
        "decode-route limit); default [sparse-prefill, decode-kernel]"
    ),
    "dequant": (
        "TTFT, sparse-prefill chunks: which window tokens are dequantized per chunk and layer, "
        "one mode or a list: read (what the chunk reads: min(context, chunk + window - 1); "
        "default) | pool (the request's whole window pool: context tokens, sglang #25502)"
    ),
    "c128_index": (
        "TPOT: the C128 layers' decode index build (every visible compressed entry to a global "
        "slot, timed as a remap): none (default) | step (once per decode step, vLLM) | layer "
        "(once per C128 layer)"
    ),
    "batch_sizes": "TPOT: decode batch sizes B",
    "contexts": "TPOT: context lengths S in tokens",
    "ragged": (
        "TPOT over ragged batches: a list of context_lens values ({lengths: [...]}, "
        "{dist: lognormal, mean, batch, sigma, seed, multiple} or {dist: one-long, long, short, "
        "batch}; docs/scenarios.md), one decode step each; no indexer or C128-index parts"
    ),
    "tp": "tensor parallel size: heads per rank = model heads / tp (default 1)",
    "num_heads": "heads per rank, overriding model heads / tp",
    "head_padding": 'Case.head_padding: "engine" (default), "none", "raw", "64" or "128"',
    "backends": (
        "backends whose curves are reported (empty: every backend with attention rows); an "
        "entry {name: BASE, as: NAME, OPTION: VALUE} defines an instance, as in kernel scenarios"
    ),
    "helper_backends": (
        "backends that run the dequant and remap parts, and the cache writer where they write "
        'the layout (default ["torch"]); the fastest ok row counts'
    ),
    "page_size": "cache page size (default: the model's, 256 for V4, 64 for V3.2)",
    "layout": "cache layout (default and only choice: the model's FP8 layout, v4 or v32)",
    "scale_convention": (
        "Case.scale_convention of the FP8 caches: v4 flashmla (default) | vllm | sglang; "
        "v32 pow2 (default) | raw"
    ),
    "topk_padding": (
        "clamp (default): index widths shrink to the visible entries while fewer than "
        "index_topk are visible (rounded up to 64 on the decode kernel); full: always "
        "index_topk (window) wide, -1 padded"
    ),
    "indexer": (
        "true: add the lightning indexer (FP8 logits + top-k) of the layers that have one "
        "(V3.2 every layer, V4 the C4 layers), timed on the fastest helper backend, its time "
        "split as its rows split it (breakdown_ms.indexer_logits + indexer_topk; default false)"
    ),
    "indexer_topk": (
        "true (with indexer): also time each indexer part's top-k alone (op topk, plain form, "
        "on the helper backends that take it): the fastest top-k kernel on its own beside the "
        "indexer's own (breakdown_ms.topk_alone; default false)"
    ),
    "decode_remap": (
        "true: the decode routes and TPOT also pay the remap of every top-k layer's indices to "
        "global slots (b x topk per step, timed as a remap on the helper backends), as vLLM "
        "converts the indexer's request-local top-k each step (index_group.py, "
        "triton_convert_req_index_to_global_index); V3.2's top-k layers (default false: the "
        "decode call takes them ready)"
    ),
    "cache_write": (
        "true: every TTFT chunk and TPOT step also pays the KV-cache writer, once per layer, "
        "for the tokens it writes (a chunk's tokens; one per request of a decode step), timed "
        "as a cache_write case on the helper backends that write the model's layout (vLLM's "
        "concat_and_cache_mla fp8_ds_mla for V3.2) in the engine's scale convention; where "
        "none does, no writer part and the rows say so (default false)"
    ),
    "seed": "Case.seed (default 0)",
    "timing": "Case.timing fields: warmup, iters, flush_l2, timer, timeout_s",
    "tolerance": "Case.tolerance fields: cos_diff, lse_abs",
}


# ---- spec -----------------------------------------------------------------------------------


@dataclass
class ServingSpec:
    """One `op: serving` entry: which TTFT and TPOT curves to build for one model."""

    model: str
    scenario: str = "serving"
    prompt_lens: list[int] = field(default_factory=list)
    chunk_sizes: list[int] = field(default_factory=list)
    routes: list[str] = field(default_factory=lambda: list(DEFAULT_ROUTES))
    batch_sizes: list[int] = field(default_factory=list)
    contexts: list[int] = field(default_factory=list)
    ragged: list = field(default_factory=list)  # cases.lengths.Lengths: one TPOT step each
    tp: int = 1
    num_heads: int | None = None  # per rank; None: model heads / tp
    head_padding: str = "engine"
    backends: list[str] = field(default_factory=list)
    helper_backends: list[str] = field(default_factory=lambda: ["torch"])
    page_size: int | None = None  # None: the model's
    layout: str | None = None  # None: the model's
    scale_convention: str | None = None  # None: flashmla (v4), pow2 (v32)
    topk_padding: str = "clamp"
    indexer: bool = False  # add the indexer's parts (role "indexer")
    indexer_topk: bool = False  # and each indexer part's top-k alone (op topk)
    dequant: list[str] = field(default_factory=lambda: ["read"])  # DEQUANT_MODES
    c128_index: str = "none"  # C128_INDEX_MODES
    decode_remap: bool = False  # the decode routes' and TPOT's remap of top-k layers
    cache_write: bool = False  # every chunk's and step's cache writer (role WRITER)
    seed: int = 0
    timing: Timing = field(default_factory=Timing)
    tolerance: Tolerance = field(default_factory=Tolerance)
    # backend instances the file defines ({name, base, options, origin}; rules.Parser.instance)
    instances: list[dict] = field(default_factory=list)

    @property
    def config(self) -> ModelConfig:
        return MODELS[self.model]

    @property
    def heads(self) -> int:
        """Useful query heads per rank."""
        return self.num_heads if self.num_heads is not None else self.config.num_heads // self.tp

    def validate(self) -> ServingSpec:
        """Raise ValueError (one line naming the key) for a bad value; returns self."""
        if self.model not in MODELS:
            raise ValueError(f"model: unknown model {self.model!r} (known: {', '.join(MODELS)})")
        cfg = self.config
        if not cfg.layers_known:
            raise ValueError(
                f"model: {self.model} has no per-layer structure here (its layer list is in "
                "the checkpoint's config): serving plans need one"
            )
        for key in ("prompt_lens", "chunk_sizes", "batch_sizes", "contexts"):
            for v in getattr(self, key):
                if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                    raise ValueError(f"{key}: expected positive integers, got {v!r}")
        if bool(self.prompt_lens) != bool(self.chunk_sizes):
            raise ValueError("prompt_lens and chunk_sizes: TTFT needs both (or neither)")
        if bool(self.batch_sizes) != bool(self.contexts):
            raise ValueError("batch_sizes and contexts: TPOT needs both (or neither)")
        if not self.prompt_lens and not self.batch_sizes and not self.ragged:
            raise ValueError(
                "serving: nothing to build: give prompt_lens + chunk_sizes (TTFT) "
                "and/or batch_sizes + contexts or ragged (TPOT)"
            )
        if self.prompt_lens and not self.routes:
            raise ValueError("routes: TTFT needs at least one route")
        for r in self.routes:
            parse_route(r)
        if not isinstance(self.tp, int) or self.tp <= 0 or cfg.num_heads % self.tp:
            raise ValueError(
                f"tp: expected a positive divisor of {cfg.num_heads} heads, got {self.tp!r}"
            )
        if self.num_heads is not None and (
            not isinstance(self.num_heads, int) or self.num_heads <= 0
        ):
            raise ValueError(f"num_heads: expected a positive integer, got {self.num_heads!r}")
        if self.page_size is not None and (
            not isinstance(self.page_size, int) or self.page_size <= 0
        ):
            raise ValueError(f"page_size: expected a positive integer, got {self.page_size!r}")
        if self.layout is not None and self.layout != cfg.cache_layout:
            raise ValueError(
                f"layout: {self.model} serves from its {cfg.cache_layout!r} FP8 "
                f"cache, got {self.layout!r}"
            )
        if self.head_padding not in HEAD_PADDINGS:
            raise ValueError(
                f"head_padding: expected one of {', '.join(HEAD_PADDINGS)}, "
                f"got {self.head_padding!r}"
            )
        pad = padding_count(self.head_padding)
        if self.num_heads is not None and pad is not None and self.num_heads > pad:
            raise ValueError(
                f"num_heads: {self.num_heads} heads exceed head_padding {self.head_padding}"
            )
        scales = LAYOUTS[cfg.cache_layout].conventions
        if self.scale_convention is not None and self.scale_convention not in scales:
            raise ValueError(
                f"scale_convention: the {cfg.cache_layout} cache takes {' or '.join(scales)}, "
                f"got {self.scale_convention!r}"
            )
        if self.topk_padding not in TOPK_PADDINGS:
            raise ValueError(
                f"topk_padding: expected one of {', '.join(TOPK_PADDINGS)}, "
                f"got {self.topk_padding!r}"
            )
        if not self.dequant or any(m not in DEQUANT_MODES for m in self.dequant):
            raise ValueError(
                f"dequant: expected {' or '.join(DEQUANT_MODES)} (or a list), got {self.dequant!r}"
            )
        if self.c128_index not in C128_INDEX_MODES:
            raise ValueError(
                f"c128_index: expected one of {', '.join(C128_INDEX_MODES)}, "
                f"got {self.c128_index!r}"
            )
        return self._validate_parts()

    def _validate_parts(self) -> ServingSpec:
        """The rules of what the points sum: decode_remap's layers, the backends' names."""
        if self.decode_remap and "dense-topk" not in self.config.layer_kinds():
            raise ValueError(
                f"decode_remap: modelled for V3.2's top-k layers (dense-topk); {self.model} has "
                "none"
            )
        for key in ("backends", "helper_backends"):
            for b in getattr(self, key):
                if not isinstance(b, str) or not b:
                    raise ValueError(f"{key}: expected backend names, got {b!r}")
        return self


def _size(key: str, v) -> int:
    """An int, or a string such as "64K" / "1M" (K = 1024)."""
    if isinstance(v, bool):
        raise ValueError(f"{key}: expected an integer, got {v!r}")
    if isinstance(v, int):
        return v
    if isinstance(v, str):
        s = v.strip().upper()
        mult = {"K": 1 << 10, "M": 1 << 20}.get(s[-1:], 1)
        digits = s[:-1] if mult > 1 else s
        if digits.isdigit():
            return int(digits) * mult
    raise ValueError(f"{key}: expected an integer (or a size like 64K), got {v!r}")


def _size_list(key: str, v) -> list[int]:
    items = v if isinstance(v, (list, tuple)) else [v]
    return [_size(key, x) for x in items]


def _str_list(key: str, v) -> list[str]:
    items = v if isinstance(v, (list, tuple)) else [v]
    for x in items:
        if not isinstance(x, str):
            raise ValueError(f"{key}: expected strings, got {x!r}")
    return list(dict.fromkeys(items))


def _sub(key: str, cls, v):
    if isinstance(v, cls):
        return v
    if not isinstance(v, dict):
        raise ValueError(f"{key}: expected a mapping, got {v!r}")
    known = {f.name for f in dataclasses.fields(cls)}
    bad = sorted(set(v) - known)
    if bad:
        raise ValueError(
            f"{key}: unknown key(s) {', '.join(bad)} (known: {', '.join(sorted(known))})"
        )
    try:
        return cls(**v)
    except TypeError as e:
        raise ValueError(f"{key}: {e}") from None


def _ragged(v) -> list:
    """`ragged`: context_lens values as the scenario loader parsed them (cases.lengths)."""
    from dsv4bench.cases.lengths import Lengths

    if not isinstance(v, list) or not v or not all(isinstance(x, Lengths) for x in v):
        raise ValueError(f"ragged: expected a non-empty list of context_lens values, got {v!r}")
    return list(v)


def spec_from_dict(d: dict) -> ServingSpec:
    """A validated ServingSpec from a scenario's `op: serving` mapping; ValueError if bad."""
    if not isinstance(d, dict):
        raise ValueError(f"serving: expected a mapping, got {type(d).__name__}")
    bad = sorted(set(d) - set(KEYS))
    if bad:
        raise ValueError(f"serving: unknown key(s) {', '.join(bad)} (known: {', '.join(KEYS)})")
    if d.get("op", "serving") != "serving":
        raise ValueError(f"op: expected 'serving', got {d['op']!r}")
    if "model" not in d:
        raise ValueError("model: missing (known: " + ", ".join(MODELS) + ")")
    kw: dict = {"model": d["model"]}
    for key in ("prompt_lens", "chunk_sizes", "batch_sizes", "contexts"):
        if key in d:
            kw[key] = _size_list(key, d[key])
    for key in ("routes", "backends", "helper_backends", "dequant"):
        if key in d:
            kw[key] = _str_list(key, d[key])
    for key in ("tp", "num_heads", "page_size", "seed"):
        if d.get(key) is not None:
            kw[key] = _size(key, d[key])
    for key in (
        "scenario",
        "head_padding",
        "layout",
        "scale_convention",
        "topk_padding",
        "c128_index",
    ):
        if d.get(key) is not None:
            if not isinstance(d[key], str):
                raise ValueError(f"{key}: expected a string, got {d[key]!r}")
            kw[key] = d[key]
    for key in ("indexer", "indexer_topk", "decode_remap", "cache_write"):
        if key in d:
            if not isinstance(d[key], bool):
                raise ValueError(f"{key}: expected true or false, got {d[key]!r}")
            kw[key] = d[key]
    if kw.get("indexer_topk") and not kw.get("indexer"):
        raise ValueError("indexer_topk: true needs indexer: true (it times the indexer's top-k)")
    if "ragged" in d:
        kw["ragged"] = _ragged(d["ragged"])
    if "timing" in d:
        kw["timing"] = _sub("timing", Timing, d["timing"])
    if "tolerance" in d:
        kw["tolerance"] = _sub("tolerance", Tolerance, d["tolerance"])
    if not isinstance(kw["model"], str):
        raise ValueError(f"model: expected a name, got {kw['model']!r}")
    return ServingSpec(**kw).validate()


def parse_route(route: str) -> tuple[str, int | None]:
    """(a kernel route of BASE_ROUTES, None), ("threshold", N) or ("safe", None)."""
    if route in BASE_ROUTES:
        return route, None
    if route == "safe":
        return "safe", None
    if isinstance(route, str) and route.startswith("threshold:"):
        try:
            n = _size("routes", route.split(":", 1)[1])
        except ValueError:
            n = -1
        if n >= 0:
            return "threshold", n
    raise ValueError(
        f"routes: unknown route {route!r} (expected {', '.join(BASE_ROUTES)}, threshold:N or safe)"
    )


def chunk_route(route: str, tokens: int, safe_limit: int | None = None) -> str:
    """The kernel route one chunk of `tokens` takes under a curve's route policy."""
    kind, n = parse_route(route)
    if kind in BASE_ROUTES:
        return kind
    if kind == "safe":
        if safe_limit is None:
            raise ValueError("route 'safe' needs safe_limit (the measured decode-route limit)")
        n = safe_limit
    return "decode-kernel" if tokens <= n else "sparse-prefill"


def dequantizes(route: str) -> bool:
    """Whether some chunk of a route policy can take the sparse-prefill route (and dequantize)."""
    return parse_route(route)[0] not in DECODE_ROUTES
