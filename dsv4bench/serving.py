"""Attention-path TTFT and TPOT from measured kernel times (the serving model).

Every number this module produces is the sparse-attention part of TTFT/TPOT (LABEL): the kernel
calls a serving engine makes for attention, the FP8 -> bf16 dequantization its sparse-prefill
path needs, and index remapping. GEMMs, MoE, the indexer, communication and scheduling are not
included. Numbers are sums of MEASURED medians: nothing is predicted or interpolated.

Flow: `spec_from_dict` (the `op: serving` entry of a scenario) -> `plan` (the distinct Cases to
measure, and curves whose points list their parts as (case_id, multiplicity)) -> the runner
measures every case -> `aggregate` (serving rows, one per curve point and backend).

What a point sums (multiplicity = number of layers of the kind, KERNEL_FACTS §1):

TTFT(model, L, C, route): the prompt is split into chunks of C tokens (the last one shorter);
chunk i covers positions [start, start + tokens) and is the Case `tokens` = chunk length,
`context_len` = start + tokens (inputs.py: a prefill case is the last `tokens` positions of a
`context_len` sequence). Per chunk and layer kind, the call an engine makes:
  - V4 "window" layers: the 128-token window only (topk 128, no extra cache).
  - V4 "c4" layers: window + indexer top-k over the 4x-compressed entries
    (extra_topk = index_topk, compress_ratio 4).
  - V4 "c128" layers: window + every visible 128x-compressed entry
    (extra_topk = visible entries, compress_ratio 128).
  - V3.2 "dense-topk" layers: top-k (2048) over the whole prefix.
Routes: "decode-kernel" (the decode kernel with b = tokens, sglang's DSv4 path),
"sparse-prefill" (the bf16 sparse prefill kernel, plus a dequant and a remap part, below),
"threshold:N" (decode-kernel for chunks of <= N tokens, sparse-prefill above; sglang's DSv4
uses N = 11673), "safe" (a threshold equal to the measured decode-route limit, passed to
`plan(..., safe_limit=)`; see `safe_limit_from_rows`).

TPOT(model, B, S): one decode step per layer (decode Case batch_size B, s_q 1, context_len S),
same layer kinds as above, summed over layers.

Modelling decisions:
  - Visible entries: a query at position pos sees min(pos+1, window) window tokens and
    (pos+1) // ratio compressed entries (KERNEL_FACTS §1); a chunk's widths are sized for its
    last query (pos = context_len - 1), earlier queries pad with -1.
  - Index widths (topk, extra_topk) are what each kernel takes. On the decode kernel
    (decode-kernel route, TPOT) they are multiples of 64 (FlashMLA asserts topk % 64 and
    extra_topk % 64): the visible count rounded up to 64, -1 padded, as an engine pads. On the
    sparse-prefill route they are the exact visible counts: inputs.py pads the merged width to
    128 itself, so the kernel reads the same width either way (128 + round64(n) and 128 + n
    pad to the same multiple of 128), and the Cases keep topk <= context_len and
    extra_topk <= context_len // ratio (scenarios.validate_case's rules).
    C128 always takes every visible entry. Under topk_padding "clamp" (the default) C4, V3.2
    and window widths are min(index_topk or window, visible): narrower while fewer than
    index_topk entries are visible (V4-Flash C4: context < 2048; V4-Pro C4: < 4096; V3.2:
    < 2048; window: < 128). topk_padding "full" keeps them index_topk (window) wide with -1
    padding at every position, as engines allocate them (such early-chunk Cases break
    validate_case's width rules on both routes). A compressed cache with no visible entry yet
    (context < ratio) is not passed at all (extra_topk 0).
    Decode-kernel Cases whose visible count is not a multiple of 64 (C128 at most contexts;
    others only in tiny contexts) therefore have extra_topk (topk) up to 63 above the visible
    count, which scenarios.validate_case rejects; inputs.py builds them (-1 padding) and
    FlashMLA needs them so.
  - The sparse-prefill route adds, per layer:
      dequant of the workspace the chunk reads: V4 the window tokens
      (min(context_len, tokens + window - 1)) and, for c4/c128 layers, every visible compressed
      entry (context_len // ratio) as two dequant Cases (two caches, two calls); V3.2 the whole
      prefix (context_len tokens). All visible entries are dequantized, not only the selected
      ones, as vLLM's V3.2 prefill does.
      remap: one "remap" Case of tokens x width indices, width = topk + extra_topk padded to
      128 (the merged width the prefill kernel reads); op remap (request-local to global slots)
      is the proxy for building the chunk's workspace indices and merging window and extra
      indices (KERNEL_FACTS §4). Its cost depends on the index count, not on positions, so it
      is one Case per (tokens, width), with context_len = max(tokens, width).
    The decode-kernel route and TPOT read the FP8 cache directly (no dequant) and take global
    slots from the indexer's fused top-k transform: no remap part. Remap parts count once per
    layer: an upper bound for window/c128 layers, whose indices depend on positions only.
  - Backends: attention parts (prefill/decode Cases) use the backend's own row. Dequant and
    remap parts use the fastest ok row of any backend that ran the case (the torch oracle runs
    them unless a faster kernel exists; `ServingPlan.jobs` schedules them on the spec's backends
    plus `helper_backends`), and the part names the backend it took.
  - A point is ok only if every part is ok; otherwise value_ms is None and status is the first
    failing part's status ("missing" when no row exists), so a decode-route chunk that crashes
    the kernel makes its TTFT point a crash, never a smaller number.
  - Distinct Cases are measured once: the same (tokens, context_len) chunk appears in many
    prompts, the same window dequant in every chunk of a length and every layer kind.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import yaml

from dsv4bench.case import Case, Timing, Tolerance
from reference.models import MODELS, ModelConfig

LABEL = (
    "sparse-attention part of TTFT/TPOT (kernels, dequant, index remap), "
    "without GEMMs, MoE and communication"
)
TAG = "serving"
BASE_ROUTES = ("sparse-prefill", "decode-kernel")
SGLANG_DSV4_THRESHOLD = 11673  # sglang's DSv4 backend: q.shape[0] > 11673 -> sparse prefill
TOPK_PADDINGS = ("clamp", "full")
ALIGN = 64  # index width multiple: the decode kernel's topk rule (KERNEL_FACTS §3)
PREFILL_ALIGN = 128  # merged index width of the sparse prefill (inputs pad to it)
HEAD_PADDINGS = ("engine", "none", "64", "128")
SCALE_CONVENTIONS = {"v4": ("flashmla", "vllm", "sglang"), "v32": ("pow2", "raw")}  # default first
ROLES = ("attention", "dequant", "remap")

KEYS: dict[str, str] = {
    "op": 'must be "serving" when present (the scenario entry kind)',
    "model": f"model name: {', '.join(MODELS)}",
    "scenario": 'scenario name recorded in every case and row (default "serving")',
    "prompt_lens": "TTFT: prompt lengths L in tokens (ints, or strings like 64K)",
    "chunk_sizes": "TTFT: chunked-prefill sizes C in tokens; the last chunk of a prompt is shorter",
    "routes": (
        "TTFT: sparse-prefill | decode-kernel | threshold:N (decode-kernel for chunks of <= N "
        f"tokens; sglang's DSv4 uses {SGLANG_DSV4_THRESHOLD}) | safe (threshold = the measured "
        "decode-route limit); default [sparse-prefill, decode-kernel]"
    ),
    "batch_sizes": "TPOT: decode batch sizes B",
    "contexts": "TPOT: context lengths S in tokens",
    "tp": "tensor parallel size: heads per rank = model heads / tp (default 1)",
    "num_heads": "heads per rank, overriding model heads / tp",
    "head_padding": 'Case.head_padding: "engine" (default), "none", "64" or "128"',
    "backends": "backends whose curves are reported (empty: every backend with attention rows)",
    "helper_backends": (
        'backends that run the dequant and remap parts (default ["torch"]); '
        "the fastest ok row counts"
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
    routes: list[str] = field(default_factory=lambda: list(BASE_ROUTES))
    batch_sizes: list[int] = field(default_factory=list)
    contexts: list[int] = field(default_factory=list)
    tp: int = 1
    num_heads: int | None = None  # per rank; None: model heads / tp
    head_padding: str = "engine"
    backends: list[str] = field(default_factory=list)
    helper_backends: list[str] = field(default_factory=lambda: ["torch"])
    page_size: int | None = None  # None: the model's
    layout: str | None = None  # None: the model's
    scale_convention: str | None = None  # None: flashmla (v4), pow2 (v32)
    topk_padding: str = "clamp"
    seed: int = 0
    timing: Timing = field(default_factory=Timing)
    tolerance: Tolerance = field(default_factory=Tolerance)

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
        for key in ("prompt_lens", "chunk_sizes", "batch_sizes", "contexts"):
            for v in getattr(self, key):
                if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                    raise ValueError(f"{key}: expected positive integers, got {v!r}")
        if bool(self.prompt_lens) != bool(self.chunk_sizes):
            raise ValueError("prompt_lens and chunk_sizes: TTFT needs both (or neither)")
        if bool(self.batch_sizes) != bool(self.contexts):
            raise ValueError("batch_sizes and contexts: TPOT needs both (or neither)")
        if not self.prompt_lens and not self.batch_sizes:
            raise ValueError(
                "serving: nothing to build: give prompt_lens + chunk_sizes (TTFT) "
                "and/or batch_sizes + contexts (TPOT)"
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
        pad = self.head_padding
        if self.num_heads is not None and pad.isdigit() and self.num_heads > int(pad):
            raise ValueError(
                f"num_heads: {self.num_heads} heads exceed head_padding {self.head_padding}"
            )
        scales = SCALE_CONVENTIONS[cfg.cache_layout]
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
    for key in ("routes", "backends", "helper_backends"):
        if key in d:
            kw[key] = _str_list(key, d[key])
    for key in ("tp", "num_heads", "page_size", "seed"):
        if d.get(key) is not None:
            kw[key] = _size(key, d[key])
    for key in ("scenario", "head_padding", "layout", "scale_convention", "topk_padding"):
        if d.get(key) is not None:
            if not isinstance(d[key], str):
                raise ValueError(f"{key}: expected a string, got {d[key]!r}")
            kw[key] = d[key]
    if "timing" in d:
        kw["timing"] = _sub("timing", Timing, d["timing"])
    if "tolerance" in d:
        kw["tolerance"] = _sub("tolerance", Tolerance, d["tolerance"])
    if not isinstance(kw["model"], str):
        raise ValueError(f"model: expected a name, got {kw['model']!r}")
    return ServingSpec(**kw).validate()


def parse_route(route: str) -> tuple[str, int | None]:
    """("sparse-prefill"|"decode-kernel", None), ("threshold", N) or ("safe", None)."""
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
        f"routes: unknown route {route!r} (expected sparse-prefill, decode-kernel, "
        "threshold:N or safe)"
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


# ---- shapes ---------------------------------------------------------------------------------


class Chunk(NamedTuple):
    """One prefill chunk: positions [start, start + tokens); context_len = start + tokens."""

    start: int
    tokens: int

    @property
    def context_len(self) -> int:
        return self.start + self.tokens


def chunks(prompt_len: int, chunk_size: int) -> list[Chunk]:
    """A prompt split into chunks of chunk_size tokens, the last one shorter."""
    if prompt_len <= 0 or chunk_size <= 0:
        raise ValueError(
            f"prompt_len and chunk_size must be positive, got {prompt_len}, {chunk_size}"
        )
    return [Chunk(s, min(chunk_size, prompt_len - s)) for s in range(0, prompt_len, chunk_size)]


def align(n: int) -> int:
    """An index width: n rounded up to a multiple of ALIGN, at least ALIGN."""
    return max(ALIGN, -(-n // ALIGN) * ALIGN)


def visible_entries(context_len: int, ratio: int) -> int:
    """Compressed entries the last query of a context_len sequence sees: (pos+1) // ratio."""
    return context_len // ratio


def window_span(tokens: int, context_len: int, window: int) -> int:
    """Window-cache tokens a chunk reads: its own tokens and the window - 1 before it."""
    return min(context_len, tokens + window - 1)


class Part(NamedTuple):
    """One term of a curve point: multiplicity x the median time of case_id."""

    case_id: str
    multiplicity: int
    role: str = "attention"  # attention (backend's own row) | dequant | remap (fastest row)


@dataclass
class CurvePoint:
    point_id: str
    metric: str  # ttft | tpot
    route: str  # the curve's route policy (ttft), "decode" (tpot)
    prompt_len: int | None = None
    chunk_size: int | None = None
    batch_size: int | None = None
    context_len: int | None = None
    threshold: int | None = None  # decode-kernel for chunks of <= threshold tokens
    parts: list[Part] = field(default_factory=list)
    chunks: list[tuple[int, int, str]] = field(default_factory=list)  # (tokens, context, route)


@dataclass
class Curve:
    curve_id: str
    metric: str
    model: str
    x: str  # the axis the points vary: prompt_len (ttft) or batch_size (tpot)
    fixed: dict  # what is constant along the curve: chunk_size + route, or context_len
    points: list[CurvePoint]
    label: str = LABEL


@dataclass
class ServingPlan:
    spec: ServingSpec
    cases: list[Case]  # distinct, each measured once
    curves: list[Curve]
    safe_limit: int | None = None

    def points(self) -> list[CurvePoint]:
        return [p for c in self.curves for p in c.points]

    def case(self, case_id: str) -> Case:
        return self._by_id()[case_id]

    def _by_id(self) -> dict[str, Case]:
        return {c.case_id: c for c in self.cases}

    def backends_for(self, case: Case) -> tuple[str, ...]:
        """Attention cases run on the spec's backends, dequant/remap on helper_backends."""
        if case.op in ("dequant", "remap"):
            return tuple(dict.fromkeys(self.spec.helper_backends))
        return tuple(dict.fromkeys(self.spec.backends))

    def jobs(self) -> list[tuple[Case, str]]:
        """Every (case, backend) pair the plan needs measured (as Scenario.jobs)."""
        return [(c, b) for c in self.cases for b in self.backends_for(c)]

    def summary(self) -> dict:
        """Counts: cases by op, curve points, parts (what sharing saves)."""
        by_op: dict[str, int] = {}
        for c in self.cases:
            by_op[c.op] = by_op.get(c.op, 0) + 1
        pts = self.points()
        return {
            "cases": len(self.cases),
            "cases_by_op": by_op,
            "curves": len(self.curves),
            "points": len(pts),
            "parts": sum(len(p.parts) for p in pts),
            "jobs": sum(len(self.backends_for(c)) for c in self.cases),
        }


# ---- cases ----------------------------------------------------------------------------------


class _Builder:
    """Makes the Cases of one spec and keeps each distinct one once."""

    def __init__(self, spec: ServingSpec):
        self.spec = spec
        self.cfg = cfg = spec.config
        self.full = spec.topk_padding == "full"
        layout = cfg.cache_layout
        self.base = dict(
            scenario=spec.scenario,
            model=cfg.name,
            d_qk=cfg.d_qk,
            d_v=cfg.d_v,
            num_heads=spec.heads,
            head_padding=spec.head_padding,
            page_size=spec.page_size or cfg.page_size,
            layout=layout,
            scale_convention=spec.scale_convention or SCALE_CONVENTIONS[layout][0],
            softmax_scale=cfg.softmax_scale,  # as scenarios.py writes it: the same case ids
            seed=spec.seed,
            timing=spec.timing,
            tolerance=spec.tolerance,
        )
        self.cases: dict[str, Case] = {}

    def _add(self, role: str, **fields) -> str:
        case = Case(**{**self.base, **fields, "tags": (TAG, f"{TAG}-{role}")})
        self.cases.setdefault(case.case_id, case)
        return case.case_id

    def _width(self, visible: int, cap: int | None, aligned: bool) -> int:
        """Index width for `visible` entries, at most cap (None: no cap): rounded up to ALIGN
        for the decode kernel, exact for sparse prefill (its inputs pad to 128 themselves);
        0 when nothing is visible (a compressed cache before its first entry: not passed);
        always cap under topk_padding "full"."""
        if cap is not None and self.full:
            return cap
        n = align(visible) if aligned and visible else visible  # 0 entries: no extra cache
        return n if cap is None else min(cap, n)

    def widths(self, kind: str, context_len: int, *, aligned: bool = True) -> dict:
        """topk, extra_topk, compress_ratio, window, sink of a layer kind's call; `aligned`:
        the call goes to the decode kernel (widths multiples of 64)."""
        cfg = self.cfg
        if kind == "dense-topk":
            topk = self._width(context_len, cfg.index_topk, aligned)
            return dict(topk=topk, extra_topk=0, compress_ratio=0, window=0, sink=cfg.has_sink)
        w = dict(
            topk=self._width(context_len, cfg.window, aligned),
            window=cfg.window,
            sink=cfg.has_sink,
        )
        if kind == "window":
            return {**w, "extra_topk": 0, "compress_ratio": 0}
        if kind in ("c4", "c128"):
            ratio = 4 if kind == "c4" else 128
            cap = cfg.index_topk if kind == "c4" else None  # c128: every visible entry
            entries = visible_entries(context_len, ratio)
            return {**w, "extra_topk": self._width(entries, cap, aligned), "compress_ratio": ratio}
        raise ValueError(f"unknown layer kind {kind!r}")

    def attention(
        self,
        kind: str,
        *,
        op: str,
        context_len: int,
        tokens: int = 0,
        batch_size: int = 1,
        route: str = "sparse-prefill",
    ) -> str:
        aligned = op == "decode" or route == "decode-kernel"
        return self._add(
            "attention",
            op=op,
            tokens=tokens,
            batch_size=batch_size,
            s_q=1,
            context_len=context_len,
            route=route,
            **self.widths(kind, context_len, aligned=aligned),
        )

    def dequant(self, n_tokens: int) -> str:
        # topk/window/sink do not matter to a dequant; set as scenarios.py defaults them
        cfg = self.cfg
        topk = min(cfg.window or cfg.index_topk, n_tokens)
        return self._add(
            "dequant",
            op="dequant",
            batch_size=1,
            context_len=n_tokens,
            topk=topk,
            window=cfg.window,
            sink=cfg.has_sink,
        )

    def remap(self, tokens: int, width: int) -> str:
        return self._add(
            "remap",
            op="remap",
            batch_size=1,
            s_q=tokens,
            topk=width,
            context_len=max(tokens, width),
        )

    def chunk_parts(self, kind: str, chunk: Chunk, route: str) -> list[Part]:
        """The parts one layer of `kind` costs for one chunk on a kernel route."""
        t, ctx = chunk.tokens, chunk.context_len
        cid = self.attention(kind, op="prefill", tokens=t, context_len=ctx, route=route)
        parts = [Part(cid, 1, "attention")]
        if route == "decode-kernel":
            return parts
        w = self.widths(kind, ctx, aligned=False)
        if kind == "dense-topk":
            parts.append(Part(self.dequant(ctx), 1, "dequant"))
        else:
            parts.append(Part(self.dequant(window_span(t, ctx, self.cfg.window)), 1, "dequant"))
            if w["compress_ratio"]:
                entries = visible_entries(ctx, w["compress_ratio"])
                if entries:
                    parts.append(Part(self.dequant(entries), 1, "dequant"))
        merged = -(-(w["topk"] + w["extra_topk"]) // PREFILL_ALIGN) * PREFILL_ALIGN
        parts.append(Part(self.remap(t, merged), 1, "remap"))
        return parts


def _merge(parts: Iterable[tuple[Part, int]]) -> list[Part]:
    """Parts scaled by layer counts, one per (case_id, role), in first-seen order."""
    acc: dict[tuple[str, str], int] = {}
    for p, n in parts:
        key = (p.case_id, p.role)
        acc[key] = acc.get(key, 0) + p.multiplicity * n
    return [Part(cid, m, role) for (cid, role), m in acc.items()]


def _slug(route: str) -> str:
    return route.replace(":", "-")


def plan(spec: ServingSpec, *, safe_limit: int | None = None) -> ServingPlan:
    """Distinct Cases and the TTFT/TPOT curves built from them.

    safe_limit: the largest chunk (decode batch) the decode route survived, as measured
    (`safe_limit_from_rows`); required when spec.routes has "safe".
    """
    spec.validate()
    if "safe" in spec.routes and spec.prompt_lens and safe_limit is None:
        raise ValueError("routes: 'safe' needs safe_limit, the measured decode-route limit")
    b = _Builder(spec)
    cfg = b.cfg
    kinds = cfg.layer_kinds()
    suffix = "" if spec.heads == cfg.num_heads else f"-h{spec.heads}"
    suffix += "" if spec.topk_padding == "clamp" else f"-pad{spec.topk_padding}"
    curves: list[Curve] = []

    for route in spec.routes if spec.prompt_lens else ():
        kind_, n = parse_route(route)
        threshold = safe_limit if kind_ == "safe" else n
        for c in spec.chunk_sizes:
            curve_id = f"ttft-{cfg.name}{suffix}-C{c}-{_slug(route)}"
            points = []
            for L in spec.prompt_lens:
                scaled, plan_chunks = [], []
                for ch in chunks(L, c):
                    r = chunk_route(route, ch.tokens, safe_limit)
                    plan_chunks.append((ch.tokens, ch.context_len, r))
                    for kind, count in kinds.items():
                        scaled += [(p, count) for p in b.chunk_parts(kind, ch, r)]
                points.append(
                    CurvePoint(
                        point_id=f"ttft-{cfg.name}{suffix}-L{L}-C{c}-{_slug(route)}",
                        metric="ttft",
                        route=route,
                        prompt_len=L,
                        chunk_size=c,
                        batch_size=1,
                        threshold=threshold,
                        parts=_merge(scaled),
                        chunks=plan_chunks,
                    )
                )
            fixed = {"chunk_size": c, "route": route, "threshold": threshold}
            curves.append(Curve(curve_id, "ttft", cfg.name, "prompt_len", fixed, points))

    for s in spec.contexts if spec.batch_sizes else ():
        points = []
        for bs in spec.batch_sizes:
            scaled = [
                (Part(b.attention(kind, op="decode", context_len=s, batch_size=bs), 1), count)
                for kind, count in kinds.items()
            ]
            points.append(
                CurvePoint(
                    point_id=f"tpot-{cfg.name}{suffix}-B{bs}-S{s}",
                    metric="tpot",
                    route="decode",
                    batch_size=bs,
                    context_len=s,
                    parts=_merge(scaled),
                )
            )
        curve_id = f"tpot-{cfg.name}{suffix}-S{s}"
        curves.append(Curve(curve_id, "tpot", cfg.name, "batch_size", {"context_len": s}, points))

    return ServingPlan(spec, list(b.cases.values()), curves, safe_limit)


def safe_limit_from_rows(
    rows: Iterable[dict], *, model: str | None = None, backend: str | None = None
) -> int | None:
    """The smallest measured decode-route limit (last_ok) among limit rows, or None.

    Counts limit searches over `tokens` of a decode-kernel-route prefill case and over
    `batch_size` of a decode case (b is what the decode schedule's shared memory grows with).
    A search whose smallest probe failed gives no limit and is skipped.
    """
    found = []
    for r in rows:
        if r.get("kind") != "limit" or r.get("last_ok") is None:
            continue
        p = r.get("params") or {}
        if model is not None and p.get("model") != model:
            continue
        if backend is not None and r.get("backend") != backend:
            continue
        decode_route = p.get("op") == "prefill" and p.get("route") == "decode-kernel"
        if (r.get("axis") == "tokens" and decode_route) or (
            r.get("axis") == "batch_size" and p.get("op") == "decode"
        ):
            found.append(int(r["last_ok"]))
    return min(found) if found else None


# ---- aggregation ----------------------------------------------------------------------------


def _median(row: dict) -> float | None:
    t = row.get("timing") or {}
    m = t.get("median_ms")
    return float(m) if isinstance(m, (int, float)) and not isinstance(m, bool) else None


def _usable(row: dict | None) -> bool:
    return row is not None and row.get("status") == "ok" and _median(row) is not None


def aggregate(plan: ServingPlan, rows: list[dict]) -> list[dict]:
    """Serving rows, one per (curve point, backend), from case rows of a run."""
    by_key: dict[tuple[str, str], dict] = {}
    for r in rows:
        if r.get("kind", "case") == "case" and "case_id" in r and "backend" in r:
            by_key[(r["case_id"], r["backend"])] = r  # a later row (a rerun) wins
    by_case: dict[str, list[dict]] = {}
    for (cid, _), r in by_key.items():
        by_case.setdefault(cid, []).append(r)

    ops = {c.case_id: c.op for c in plan.cases}
    backends = list(plan.spec.backends)
    if not backends:
        attention_ids = {cid for cid, op in ops.items() if op in ("prefill", "decode")}
        backends = sorted({b for (cid, b) in by_key if cid in attention_ids})

    out = []
    for curve in plan.curves:
        for point in curve.points:
            for backend in backends:
                out.append(_point_row(plan, curve, point, backend, by_key, by_case))
    return out


def _pick(part: Part, backend: str, by_key: dict, by_case: dict) -> tuple[str | None, dict | None]:
    """The row a part takes: the backend's own (attention), the fastest ok one (dequant/remap)."""
    if part.role == "attention":
        return backend, by_key.get((part.case_id, backend))
    candidates = by_case.get(part.case_id, [])
    ok = [r for r in candidates if _usable(r)]
    if ok:
        best = min(ok, key=lambda r: (_median(r), r["backend"] != backend, r["backend"]))
        return best["backend"], best
    own = by_key.get((part.case_id, backend))
    failed = own or (sorted(candidates, key=lambda r: r["backend"])[0] if candidates else None)
    return (failed["backend"] if failed else None), failed


def _point_row(plan, curve, point, backend, by_key, by_case) -> dict:
    parts, total, status, message, env = [], 0.0, "ok", "", None
    breakdown = dict.fromkeys(ROLES, 0.0)
    for part in point.parts:
        used, row = _pick(part, backend, by_key, by_case)
        median = _median(row) if row is not None else None
        if row is None:
            p_status, p_msg = "missing", f"no result row for {part.case_id} on {backend}"
        elif row.get("status") == "ok" and median is None:
            p_status, p_msg = "missing", f"{part.case_id} on {used}: row has no timing"
        else:
            p_status, p_msg = row.get("status", "error"), row.get("message") or ""
        if p_status == "ok":
            total += part.multiplicity * median
            breakdown[part.role] += part.multiplicity * median
        elif status == "ok":
            status = p_status
            where = f"{part.case_id} on {used or backend}"
            message = f"{where}: {p_status}" + (f": {p_msg}" if p_msg else "")
            if p_status == "missing":
                message = p_msg
        if env is None and row is not None and row.get("env"):
            env = row["env"]
        parts.append(
            {
                "case_id": part.case_id,
                "multiplicity": part.multiplicity,
                "role": part.role,
                "backend": used,
                "median_ms": median,
                "status": p_status,
            }
        )
    ok = status == "ok"
    spec = plan.spec
    return {
        "kind": "serving",
        "scenario": spec.scenario,
        "case_id": point.point_id,
        "curve_id": curve.curve_id,
        "model": spec.model,
        "metric": point.metric,
        "backend": backend,
        "route": point.route,
        "threshold": point.threshold,
        "prompt_len": point.prompt_len,
        "chunk_size": point.chunk_size,
        "batch_size": point.batch_size,
        "context_len": point.context_len,
        "num_heads": spec.heads,
        "tp": spec.tp,
        "value_ms": total if ok else None,
        "breakdown_ms": breakdown if ok else None,
        "status": status,
        "message": message,
        "parts": parts,
        "label": LABEL,
        "env": env,
    }


# ---- scenario files -------------------------------------------------------------------------


def is_serving_file(text: str) -> bool:
    """Whether a scenario file's top level says `op: serving`."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return False  # scenarios.load reports the syntax error with its line
    return isinstance(data, dict) and data.get("op") == "serving"


def load_spec(path: str | Path, *, known_backends: Collection[str]) -> ServingSpec:
    """A ServingSpec from an `op: serving` file; errors as `FILE:LINE: key: what was expected`."""
    from dsv4bench.scenarios import ScenarioError

    text = Path(path).read_text()
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    lines = {k.value: k.start_mark.line + 1 for k, _ in root.value}
    data = yaml.safe_load(text)
    data = {("scenario" if k == "name" else k): v for k, v in data.items() if k != "description"}
    try:
        spec = spec_from_dict(data)
        for b in (*spec.backends, *spec.helper_backends):
            if b not in known_backends:
                raise ValueError(f"backends: unknown backend {b!r}")
    except ValueError as e:
        key = str(e).split(":", 1)[0]
        key = "name" if key == "scenario" else key
        raise ScenarioError(str(path), lines.get(key, 1), key, str(e).split(": ", 1)[-1]) from None
    return spec


def jobs_for(spec: ServingSpec) -> list[tuple[Case, str]]:
    """The (case, backend) pairs a spec needs; "safe" needs no cases of its own."""
    routes = [r for r in spec.routes if r != "safe"] or list(BASE_ROUTES)
    measured = dataclasses.replace(spec, routes=routes)
    return plan(measured).jobs()
