"""Which kernel calls a serving engine makes: distinct Cases and the curves that sum them."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from dsv4bench.cases.case import Case
from dsv4bench.scenarios.rules import ModelSpec
from dsv4bench.scenarios.serving_spec import (
    ALIGN,
    DECODE_ROUTES,
    DEFAULT_ROUTES,
    LABEL,
    PREFILL_ALIGN,
    TAG,
    WRITER,
    WRITER_CONVENTION,
    ServingSpec,
    chunk_route,
    dequantizes,
    parse_route,
)
from dsv4bench.serving import writers
from reference.layout_table import LAYOUTS

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
    # attention (backend's own row) | dequant | remap | indexer | cache_write (fastest row)
    role: str = "attention"


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
    dequant: str | None = None  # DEQUANT_MODES of sparse-prefill chunks; None: none dequantize
    c128_index: str | None = None  # C128_INDEX_MODES of a TPOT point
    parts: list[Part] = field(default_factory=list)
    chunks: list[tuple[int, int, str]] = field(default_factory=list)  # (tokens, context, route)
    # the route's workspace beside the cache: the largest one layer's call allocates (helper_bytes)
    workspace_bytes: int = 0
    not_summed: str = ""  # a part the spec asks for that no helper backend has, and why


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
    writer_backends: tuple[str, ...] = ()  # the helper backends that write the cache's records

    def points(self) -> list[CurvePoint]:
        return [p for c in self.curves for p in c.points]

    def case(self, case_id: str) -> Case:
        return self._by_id()[case_id]

    def _by_id(self) -> dict[str, Case]:
        return {c.case_id: c for c in self.cases}

    def backends_for(self, case: Case) -> tuple[str, ...]:
        """Attention cases run on the spec's backends, dequant/remap on helper_backends, the
        cache writer on those of them that write the layout (writers.py)."""
        if case.op == "cache_write":
            return self.writer_backends
        if case.op in ("dequant", "remap", "indexer", "topk"):
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
            scale_convention=spec.scale_convention or LAYOUTS[layout].default_convention,
            softmax_scale=cfg.softmax_scale,  # as scenarios.py writes it: the same case ids
            seed=spec.seed,
            timing=spec.timing,
            tolerance=spec.tolerance,
        )
        self.cases: dict[str, Case] = {}
        self.writers: tuple[str, ...] = ()
        self.no_writer = ""  # why no writer part (spec.cache_write, yet no backend writes)
        if spec.cache_write:
            probe = self.writer_case(1, 1)
            self.writers = writers.writer_backends(spec.helper_backends, probe)
            if not self.writers:
                self.no_writer = writers.no_writer(spec.helper_backends, probe)

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
        context_lens: tuple[int, ...] = (),
        ragged: str = "",
    ) -> str:
        aligned = op == "decode" or route in DECODE_ROUTES
        return self._add(
            "attention",
            op=op,
            tokens=tokens,
            batch_size=batch_size,
            context_lens=context_lens,
            ragged=ragged,
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

    def writer_case(self, requests: int, tokens: int) -> Case:
        """The cache writer of `requests` requests writing `tokens` new tokens each, in the
        engine writer's scale convention. Its cost depends on the records written, not on
        their positions: one Case per (requests, tokens), each request's context its tokens."""
        convention = WRITER_CONVENTION.get(self.cfg.cache_layout, self.base["scale_convention"])
        fields = dict(op="cache_write", batch_size=requests, s_q=tokens, context_len=tokens)
        fields |= dict(scale_convention=convention, tags=(TAG, f"{TAG}-{WRITER}"))
        return Case(**{**self.base, **fields})

    def writer(self, requests: int, tokens: int) -> list[Part]:
        """The writer part of one layer (spec.cache_write, where a helper backend writes the
        layout); none otherwise."""
        if not self.writers:
            return []
        case = self.writer_case(requests, tokens)
        self.cases.setdefault(case.case_id, case)
        return [Part(case.case_id, 1, WRITER)]

    def indexer(self, kind: str, *, context_len: int, tokens: int = 0, batch_size: int = 1):
        """The indexer part of one layer of `kind` (None: that kind has no indexer, or the
        spec leaves the indexer out): the Case scenarios.py makes for op indexer (the same
        case id, so an indexer scenario's rows serve here too)."""
        if not self.spec.indexer or kind not in ("dense-topk", "c4"):
            return None
        from dsv4bench.cases import indexer_case

        defaults = indexer_case.defaults(self.cfg_model)
        fields = {**self.base, **defaults, "page_size": 64}
        fields.update(
            op="indexer",
            tokens=tokens,
            batch_size=batch_size,
            s_q=1,
            context_len=context_len,
            head_padding="engine",
            scale_convention=LAYOUTS[self.cfg.cache_layout].default_convention,
        )
        case = Case(**{**fields, "tags": (TAG, f"{TAG}-indexer")})
        self.cases.setdefault(case.case_id, case)
        if self.spec.indexer_topk:  # its top-k alone: no part, beside the indexer
            from dsv4bench.cases import topk_case

            twin = topk_case.of_indexer(case)
            self.cases.setdefault(twin.case_id, twin)
        return Part(case.case_id, 1, "indexer")

    @property
    def cfg_model(self):
        """The scenario-side model view indexer_case.defaults reads (heads, ratio, top-k)."""
        return ModelSpec.builtin(self.cfg)

    def chunk_parts(
        self, kind: str, chunk: Chunk, route: str, dequant: str | None = "read"
    ) -> list[Part]:
        """The parts one layer of `kind` costs for one chunk on a kernel route; `dequant`
        (DEQUANT_MODES): how many window tokens the sparse-prefill route dequantizes."""
        t, ctx = chunk.tokens, chunk.context_len
        cid = self.attention(kind, op="prefill", tokens=t, context_len=ctx, route=route)
        parts = [Part(cid, 1, "attention")]
        ix = self.indexer(kind, context_len=ctx, tokens=t)
        if ix is not None:  # the indexer runs whichever route the attention takes
            parts.append(ix)
        if route in DECODE_ROUTES:
            return parts + self.decode_remap(kind, t, ctx)
        w = self.widths(kind, ctx, aligned=False)
        if kind == "dense-topk":
            parts.append(Part(self.dequant(ctx), 1, "dequant"))
        else:
            span = ctx if dequant == "pool" else window_span(t, ctx, self.cfg.window)
            parts.append(Part(self.dequant(span), 1, "dequant"))
            if w["compress_ratio"]:
                entries = visible_entries(ctx, w["compress_ratio"])
                if entries:
                    parts.append(Part(self.dequant(entries), 1, "dequant"))
        merged = -(-(w["topk"] + w["extra_topk"]) // PREFILL_ALIGN) * PREFILL_ALIGN
        parts.append(Part(self.remap(t, merged), 1, "remap"))
        return parts

    def decode_remap(self, kind: str, queries: int, context_len: int) -> list[Part]:
        """The remap a decode-kernel call of `queries` rows pays for a top-k layer's indices
        (spec.decode_remap: vLLM converts them to global slots each step); none otherwise."""
        if not self.spec.decode_remap or kind != "dense-topk":
            return []
        width = self.widths(kind, context_len)["topk"]
        return [Part(self.remap(queries, width), 1, "remap")]

    def helper_bytes(self, parts: Iterable[Part]) -> int:
        """Device bytes one layer's helper parts write beside the cache: every dequant part's
        bf16 rows (d_qk wide) and every remap part's int32 indices (the workspace the
        sparse-prefill call reads; the C128 decode index build's). Attention parts add none."""
        total = 0
        for p in parts:
            case = self.cases[p.case_id]
            if p.role == "dequant":
                total += case.batch_size * case.context_len * case.d_qk * 2
            elif p.role == "remap":
                total += case.query_tokens * case.topk * 4
        return total

    def c128_index(self, batch_size: int, context_len: int) -> str | None:
        """The decode index build of a C128 layer, as a remap of batch_size queries x every
        visible compressed entry (global slots from the block table); None: nothing visible."""
        entries = visible_entries(context_len, 128)
        return self.remap(batch_size, align(entries)) if entries else None


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
    layers = sum(kinds.values())  # every layer writes its cache (spec.cache_write)
    suffix = "" if spec.heads == cfg.num_heads else f"-h{spec.heads}"
    suffix += "" if spec.topk_padding == "clamp" else f"-pad{spec.topk_padding}"
    curves: list[Curve] = []

    for route in spec.routes if spec.prompt_lens else ():
        kind_, n = parse_route(route)
        threshold = safe_limit if kind_ == "safe" else n
        modes = spec.dequant if dequantizes(route) else [None]
        for mode, c in [(m, c) for m in modes for c in spec.chunk_sizes]:
            tail = _slug(route) + ("" if mode in (None, "read") else f"-dq{mode}")
            curve_id = f"ttft-{cfg.name}{suffix}-C{c}-{tail}"
            points = []
            for L in spec.prompt_lens:
                scaled, plan_chunks, workspace = [], [], 0
                for ch in chunks(L, c):
                    r = chunk_route(route, ch.tokens, safe_limit)
                    plan_chunks.append((ch.tokens, ch.context_len, r))
                    for kind, count in kinds.items():
                        layer = b.chunk_parts(kind, ch, r, mode)
                        workspace = max(workspace, b.helper_bytes(layer))
                        scaled += [(p, count) for p in layer]
                    scaled += [(p, layers) for p in b.writer(1, ch.tokens)]
                points.append(
                    CurvePoint(
                        point_id=f"ttft-{cfg.name}{suffix}-L{L}-C{c}-{tail}",
                        metric="ttft",
                        route=route,
                        prompt_len=L,
                        chunk_size=c,
                        batch_size=1,
                        threshold=threshold,
                        dequant=mode,
                        parts=_merge(scaled),
                        chunks=plan_chunks,
                        workspace_bytes=workspace,
                        not_summed=b.no_writer,
                    )
                )
            fixed = {"chunk_size": c, "route": route, "threshold": threshold, "dequant": mode}
            curves.append(Curve(curve_id, "ttft", cfg.name, "prompt_len", fixed, points))

    c128 = spec.c128_index
    tpot_suffix = suffix + ("" if c128 == "none" else f"-c128{c128}")
    for s in spec.contexts if spec.batch_sizes else ():
        points = []
        for bs in spec.batch_sizes:
            scaled = _tpot_parts(b, kinds, bs, s, c128)
            points.append(
                CurvePoint(
                    point_id=f"tpot-{cfg.name}{tpot_suffix}-B{bs}-S{s}",
                    metric="tpot",
                    route="decode",
                    batch_size=bs,
                    context_len=s,
                    c128_index=c128,
                    parts=_merge(scaled),
                    workspace_bytes=max((b.helper_bytes([p]) for p, _ in scaled), default=0),
                    not_summed=b.no_writer,
                )
            )
        curve_id = f"tpot-{cfg.name}{tpot_suffix}-S{s}"
        curves.append(Curve(curve_id, "tpot", cfg.name, "batch_size", {"context_len": s}, points))

    for i, lens in enumerate(spec.ragged):
        curves.append(_ragged_curve(b, kinds, lens, f"tpot-{cfg.name}{suffix}-ragged{i}"))
    return ServingPlan(spec, list(b.cases.values()), curves, safe_limit, b.writers)


def _tpot_parts(b: _Builder, kinds: dict, bs: int, s: int, c128: str) -> list:
    """(part, layers) of one decode step of bs requests at context s: attention per layer
    kind, the indexer where a kind has one, the C128 index build (c128_index), the cache
    writer of one token per request in every layer (cache_write)."""
    scaled = [
        (Part(b.attention(kind, op="decode", context_len=s, batch_size=bs), 1), count)
        for kind, count in kinds.items()
    ]
    for kind, count in kinds.items():
        ix = b.indexer(kind, context_len=s, batch_size=bs)
        if ix is not None:
            scaled.append((ix, count))
        scaled += [(p, count) for p in b.decode_remap(kind, bs, s)]
    if c128 != "none" and "c128" in kinds:
        cid = b.c128_index(bs, s)
        if cid is not None:  # once a step (shared by the C128 layers) or per layer
            scaled.append((Part(cid, 1, "remap"), 1 if c128 == "step" else kinds["c128"]))
    return scaled + [(p, sum(kinds.values())) for p in b.writer(bs, 1)]


def _ragged_curve(b: _Builder, kinds: dict, lens, curve_id: str) -> Curve:
    """One decode step over a ragged batch: every layer kind's attention over the requests'
    own contexts, index widths sized by the longest (as engines size their buffers), and the
    cache writer of one token per request (cache_write)."""
    n, longest = len(lens.lengths), max(lens.lengths)
    parts = [
        (
            Part(
                b.attention(
                    kind,
                    op="decode",
                    context_len=longest,
                    batch_size=n,
                    context_lens=lens.lengths,
                    ragged=lens.label,
                ),
                1,
            ),
            count,
        )
        for kind, count in kinds.items()
    ]
    parts += [(p, sum(kinds.values())) for p in b.writer(n, 1)]
    point = CurvePoint(
        point_id=f"{curve_id}-B{n}-S{longest}",
        metric="tpot",
        route="decode",
        batch_size=n,
        context_len=longest,
        parts=_merge(parts),
        not_summed=b.no_writer,
    )
    fixed = {"ragged": lens.label, "context_lens": list(lens.lengths)}
    return Curve(curve_id, "tpot", b.cfg.name, "batch_size", fixed, [point])


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


def jobs_for(spec: ServingSpec) -> list[tuple[Case, str]]:
    """The (case, backend) pairs a spec needs; "safe" needs no cases of its own."""
    routes = [r for r in spec.routes if r != "safe"] or list(DEFAULT_ROUTES)
    measured = dataclasses.replace(spec, routes=routes)
    return plan(measured).jobs()
