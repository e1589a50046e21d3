"""Attention-path TTFT and TPOT from measured kernel times (the serving model).

Every number this module produces is the sparse-attention part of TTFT/TPOT (LABEL): the kernel
calls a serving engine makes for attention, the FP8 -> bf16 dequantization its sparse-prefill
path needs, and index remapping. GEMMs, MoE, the indexer, communication and scheduling are not
included. Numbers are sums of MEASURED medians: nothing is predicted or interpolated.

Flow: `spec_from_dict` (the values of an `op: serving` scenario file, which
dsv4bench.scenarios reads) -> `plan` (the distinct Cases to
measure, and curves whose points list their parts as (case_id, multiplicity)) -> the runner
measures every case -> `aggregate` (serving rows, one per curve point and backend).

What a point sums (multiplicity = number of layers of the kind; docs/kernel-facts.md, Models and
layer kinds):

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
Routes: "decode-kernel" (the decode kernel with b = tokens, sglang's DSv4 path), "decode-mixed"
(the decode kernel as one request of s_q = tokens, q (1, T, h, d): vLLM's mixed batch below 32
heads per rank), "sparse-prefill" (the bf16 sparse prefill kernel, plus a dequant and a remap
part, below),
"threshold:N" (decode-kernel for chunks of <= N tokens, sparse-prefill above; sglang's DSv4
uses N = 11673), "safe" (a threshold equal to the measured decode-route limit, passed to
`plan(..., safe_limit=)`; see `safe_limit_from_rows`).

TPOT(model, B, S): one decode step per layer (decode Case batch_size B, s_q 1, context_len S),
same layer kinds as above, summed over layers. With c128_index "step" (vLLM) or "layer", plus
the C128 layers' decode index build (B queries x every visible compressed entry, timed as a
remap), once per step or once per C128 layer.

With cache_write (both metrics): every chunk and decode step also writes its tokens' cache
records in every layer (one cache_write Case of `requests` x `tokens` each: a chunk's tokens for
one request, one token for each of B requests; its context its own tokens, as the writer's cost
depends on the records only), on the helper backends whose declarations take the model's layout
(serving/writers.py), in the scale convention the engine's writer writes (WRITER_CONVENTION);
with none, no writer part and each row's message says so. Only the main cache's records: V4's
compressed caches and the indexer's keys are written by other kernels, not summed.

Modelling decisions:
  - Visible entries: a query at position pos sees min(pos+1, window) window tokens and
    (pos+1) // ratio compressed entries (docs/kernel-facts.md, Models and layer kinds); a
    chunk's widths are sized for its last query (pos = context_len - 1), earlier queries pad
    with -1.
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
      (min(context_len, tokens + window - 1); with dequant "pool", the request's whole window
      pool, context_len tokens, as sglang #25502 stages it) and, for c4/c128 layers, every
      visible compressed entry (context_len // ratio) as two dequant Cases (two caches, two
      calls); V3.2 the whole prefix (context_len tokens). All visible entries are dequantized,
      not only the selected ones, as vLLM's V3.2 prefill does.
      remap: one "remap" Case of tokens x width indices, width = topk + extra_topk padded to
      128 (the merged width the prefill kernel reads); op remap (request-local to global slots)
      is the proxy for building the chunk's workspace indices and merging window and extra
      indices (docs/kernel-facts.md, Index remapping). Its cost depends on the index count, not
      on positions, so it is one Case per (tokens, width), with context_len = max(tokens, width).
    The decode routes and TPOT read the FP8 cache directly (no dequant) and take global
    slots from the indexer's fused top-k transform: no remap part, unless `decode_remap`
    (V3.2): then each top-k layer's call pays a remap of its queries x topk indices (vLLM
    converts the indexer's request-local top-k to global slots every step, index_group.py;
    one conversion per layer: an upper bound where layers share an index group). Remap parts
    count once per layer: an upper bound for window/c128 layers, whose indices depend on
    positions only.
  - Backends: attention parts (prefill/decode Cases) use the backend's own row. Dequant and
    remap parts use the fastest ok row of any backend that ran the case (the torch oracle runs
    them unless a faster kernel exists; `ServingPlan.jobs` schedules them on the spec's backends
    plus `helper_backends`), and the part names the backend it took.
  - Workspace: every point carries the largest device memory one layer's helper parts of it
    write beside the cache (planning.helper_bytes: dequantized bf16 rows, remapped int32
    indices), as `workspace_mib`; 0 on routes that read the FP8 cache as it is.
  - A point is ok only if every part is ok; otherwise value_ms is None and status is the first
    failing part's status ("missing" when no row exists), so a decode-route chunk that crashes
    the kernel makes its TTFT point a crash, never a smaller number.
  - ENVELOPE rows (where several attention backends ran): each attention part on the fastest
    backend that ran it ok, per layer kind and chunk shape (the parts name the backend).
  - Distinct Cases are measured once: the same (tokens, context_len) chunk appears in many
    prompts, the same window dequant in every chunk of a length and every layer kind.
"""

from dsv4bench.scenarios.serving_spec import (
    BASE_ROUTES,
    C128_INDEX_MODES,
    DEFAULT_ROUTES,
    DEQUANT_MODES,
    KEYS,
    LABEL,
    ServingSpec,
    chunk_route,
    parse_route,
    spec_from_dict,
)
from dsv4bench.serving.aggregate import ENVELOPE, aggregate
from dsv4bench.serving.planning import (
    Chunk,
    Curve,
    CurvePoint,
    Part,
    ServingPlan,
    align,
    chunks,
    jobs_for,
    plan,
    safe_limit_from_rows,
    visible_entries,
    window_span,
)

__all__ = [
    "BASE_ROUTES",
    "C128_INDEX_MODES",
    "DEFAULT_ROUTES",
    "DEQUANT_MODES",
    "ENVELOPE",
    "KEYS",
    "LABEL",
    "Chunk",
    "Curve",
    "CurvePoint",
    "Part",
    "ServingPlan",
    "ServingSpec",
    "aggregate",
    "align",
    "chunk_route",
    "chunks",
    "jobs_for",
    "parse_route",
    "plan",
    "safe_limit_from_rows",
    "spec_from_dict",
    "visible_entries",
    "window_span",
]
