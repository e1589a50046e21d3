"""One point of a sweep: the plain, serializable description a worker needs to run a kernel."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields, replace

from reference.layout_table import LAYOUTS as LAYOUT_TABLE

OPS = ("decode", "prefill", "dequant", "remap", "indexer", "page_split", "topk", "cache_write")
TOPK_FORMS = (
    "plain",
    "page_table",
    "ragged",
)  # how a topk case returns its picks (reference/topk.py)
# a remap case's forms beside the default (global slots; tokens > 0: vLLM's prefill workspace):
# dcp, one decode-context-parallel rank's slots of request-global top-k in place (reference/dcp.py);
# dcp-compact, the same compacted to the front of each row (the rank's slots in order, then -1)
DCP_FORMS = ("dcp", "dcp-compact")
REMAP_FORMS = DCP_FORMS
# The ops that read the Case's KV cache (in `layout`): a backend must declare that layout.
CACHE_OPS = ("decode", "prefill", "dequant", "page_split", "cache_write")
SPLIT_PAGE = 64  # page_split's target: the tokens per page FlashInfer's sm120 kernels read
LAYOUTS = tuple(LAYOUT_TABLE)  # as shipped; the live set is reference.layout_table.LAYOUTS
# How a prefill chunk of T tokens reaches a kernel: the bf16 sparse prefill kernel over a
# dequantized workspace, or the FP8 decode kernel as T requests of one token (sglang's DSv4)
# or as one request of T tokens (vLLM's FlashMLA sparse backend below 32 heads per rank).
ROUTES = ("sparse-prefill", "decode-kernel", "decode-mixed")
SCALE_CONVENTIONS = tuple(c for lay in LAYOUT_TABLE.values() for c in lay.conventions)
ARCHS = ("cpu", "sm90", "sm100", "sm120")
# Case.head_padding: engine (as the engine pads), none (unpadded; a count the kernel's declared
# rule excludes is refused), raw (unpadded and unchecked: the kernel meets the heads as they
# are and its own checks, or its crash, answer), or an explicit count
HEAD_PADDINGS = ("engine", "none", "raw", "64", "128")
# The engines' failure shapes (Case.edge; dsv4bench/cases/edges.py): a prefill call of 0 query
# tokens, a batch with one request of no context, a decode batch padded to a captured CUDA
# graph's size the way vLLM or sglang pad it, that graph replayed on the next batch copied into
# its buffers in place.
EDGES = (
    "empty-chunk",
    "empty-request",
    "graph-pad-vllm",
    "graph-pad-sglang",
    "graph-refill-vllm",
    "graph-refill-sglang",
)
# How an attention case's q and cache values are drawn (Case.values; cases/values.py)
VALUES = ("normal", "outliers")


def padding_count(head_padding: str) -> int | None:
    """An explicit head_padding's head count ("64" -> 64); None for "engine", "none" and "raw",
    which each backend resolves (backends.base.resolve_heads)."""
    return int(head_padding) if head_padding.isdigit() else None


TIMER_MODES = ("events", "profiler", "both")  # Timing.timer: which passes time a call


@dataclass(frozen=True)
class Timing:
    """How a backend's timed call is measured."""

    warmup: int = 3
    iters: int = 20
    flush_l2: bool = True  # cold L2 before every timed iteration (GPU only)
    timer: str = "events"  # events | profiler | both (GPU); the CPU always uses perf_counter
    timeout_s: float = 300.0  # per (case, backend) in the worker, inputs and reference included
    graph: bool = False  # also capture the call in a CUDA graph and time its replays (GPU)
    determinism: bool = False  # run the call twice more and compare the outputs bitwise
    batch_invariance: bool = False  # run a few requests alone and compare with the batch


# FlashMLA's own test tolerances: decode 5e-6, prefill 7e-6 (docs/kernel-facts.md, FlashMLA
# sparse attention contract).
# a re-paging copies bytes, a writer writes them: exact
DEFAULT_COS_DIFF = {"prefill": 7e-6, "page_split": 0.0, "cache_write": 0.0}
DEFAULT_COS_DIFF_OTHER = 5e-6
NEVER_DROPPED = ("cos_diff", "lse_abs")  # Tolerance.to_row: the two every row carries


@dataclass(frozen=True)
class Tolerance:
    """Largest accepted differences against the oracle; past either, the row is `incorrect`.

    cos_diff None: the op's default (DEFAULT_COS_DIFF); a Case always holds a resolved one,
    and its rows carry it, so whoever reads a row judges it with the numbers the run used.
    max_logits_abs: the bound on sparse prefill's max_logits; None: lse_abs (a logit on the
    lse's scale). An FP8 kernel declares its own: one rounded logit, where the lse averages.
    exact_cos_diff, exact_lse_abs: bounds on the answer's distance to what the kernel claims
    to compute (Prepared.exact, accuracy `exact_*`; exact_lse_abs bounds its max_logits too),
    declared by a lossy backend beside its bounds against the oracle; None: that distance is
    recorded, not judged."""

    cos_diff: float | None = None
    lse_abs: float = 1e-3
    max_logits_abs: float | None = None
    exact_cos_diff: float | None = None
    exact_lse_abs: float | None = None

    def resolved(self, op: str | None) -> Tolerance:
        if self.cos_diff is not None:
            return self
        return replace(self, cos_diff=DEFAULT_COS_DIFF.get(op, DEFAULT_COS_DIFF_OTHER))

    def to_row(self) -> dict:
        """The numbers a row carries: the optional bounds only where declared (older rows and
        every backend without them keep their two numbers)."""
        return {k: v for k, v in asdict(self).items() if v is not None or k in NEVER_DROPPED}


# Case fields left out of params() at these values: cases made before them keep their ids.
WORKLOAD_DEFAULTS = {
    "context_lens": (),
    "ragged": "",
    "index_pattern": "uniform",
    "form": "",
    "edge": "",
    "graph_batch": 0,
    "values": "normal",
    "dcp_size": 1,
    "dcp_rank": 0,
    "dcp_interleave": 1,
}


@dataclass(frozen=True)
class Case:
    """One kernel problem. Sizes are per rank; `num_heads` counts useful heads only.

    decode: q (batch_size, s_q, num_heads, d_qk) over a paged FP8 cache of `context_len`
      tokens per request; `topk` indices into the main cache, `extra_topk` into an extra
      cache (V4 compressed entries; 0 = none).
    prefill: `tokens` query tokens (the chunk) ending at position `context_len`; route
      `sparse-prefill` runs the bf16 sparse prefill kernel over a dequantized workspace,
      `decode-kernel` runs the decode kernel with batch = tokens (sglang's DSv4 path),
      `decode-mixed` as one request of s_q = tokens (vLLM's mixed batch): see decode_shape.
    dequant: FP8 cache of `context_len * batch_size` tokens -> bf16 workspace.
    remap: request-local top-k of (batch_size * s_q) queries -> global slots; with tokens > 0,
      vLLM's prefill form: each request's last `tokens` queries -> rows of the sparse-prefill
      workspace (chunks of 5 x context_len rows; cases/helper_cases.py); form dcp: the
      queries' request-global top-k -> rank dcp_rank's cache slots, -1 where another of
      dcp_size ranks holds the token (groups of dcp_interleave tokens; reference/dcp.py); form
      dcp-compact: each row's own slots moved to its front, in order, -1 after.
    cache_write: each request's last s_q tokens (bf16 latent + rope) -> their records in the
      `layout` cache at their slots (cases/helper_cases.py); judged byte for byte.
    page_split: a V4 cache of `context_len * batch_size` tokens in `page_size`-token pages ->
      SPLIT_PAGE-token pages (FlashInfer's sm120 layout; every token's bytes and slot kept).
    indexer: the lightning indexer's FP8 logits + top-k (cases/indexer_case.py): paged over
      batch_size requests of s_q tokens, or ragged over a chunk of `tokens` (tokens > 0).
    topk: the indexer's top-k alone over the logits an indexer case of the same sizes leaves
      (cases/topk_case.py), returned in `form`: plain, page_table or ragged (TOPK_FORMS).
    """

    scenario: str
    op: str
    model: str
    d_qk: int
    d_v: int
    num_heads: int
    head_padding: str = "engine"  # engine | none | raw | an explicit count such as "64"
    batch_size: int = 1
    s_q: int = 1
    tokens: int = 0
    topk: int = 2048
    extra_topk: int = 0
    context_len: int = 4096
    page_size: int = 64
    layout: str = "v32"
    sink: bool = False
    scale_convention: str = ""  # "" = the layout's default (its first convention)
    route: str = "sparse-prefill"
    window: int = 0  # V4 sliding window; 0 = none
    compress_ratio: int = 0  # V4 extra cache: 4 (C4) or 128 (C128); 0 = none
    softmax_scale: float = 0.0  # 0: d_qk ** -0.5
    seed: int = 0
    # Workloads (issue 23; docs/scenarios.md). In params() only when set, so every older case
    # keeps its id and inputs. context_lens: each request's context (ragged batch; len =
    # batch_size, max <= context_len); ragged: the distribution that drew them; index_pattern:
    # how drawn top-k sets are picked (cases/patterns.py).
    context_lens: tuple[int, ...] = ()
    ragged: str = ""
    index_pattern: str = "uniform"
    form: str = (
        ""  # topk: plain | page_table | ragged; remap: "" | REMAP_FORMS. In params() when set
    )
    # remap form dcp: the ranks the cache is dealt over, this call's rank, the tokens per group
    # (vLLM's cp_kv_cache_interleave_size). In params() only when set.
    dcp_size: int = 1
    dcp_rank: int = 0
    dcp_interleave: int = 1
    # A failure shape engines produce (EDGES; cases/edges.py), "" = none; graph_batch: the
    # captured batch a graph-pad or graph-refill case is padded to (> batch_size). In params()
    # only when set.
    edge: str = ""
    graph_batch: int = 0
    # How q and the cache's latent are drawn (VALUES; cases/values.py): "normal" (as always)
    # or "outliers" (heavy-tailed channels, a larger RoPE part). In params() only when set.
    values: str = "normal"
    timing: Timing = field(default_factory=Timing)
    tolerance: Tolerance = field(default_factory=Tolerance)
    tags: tuple[str, ...] = ()  # free labels a scenario gives its cases (family names for reports)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tolerance", self.tolerance.resolved(self.op))
        object.__setattr__(self, "context_lens", tuple(self.context_lens))
        if not self.scale_convention:
            lay = LAYOUT_TABLE.get(self.layout)
            object.__setattr__(self, "scale_convention", lay.default_convention if lay else "")

    @property
    def scale(self) -> float:
        return self.softmax_scale or self.d_qk**-0.5

    @property
    def query_tokens(self) -> int:
        """Query tokens in one call: b * s_q for decode, the chunk for prefill."""
        if self.edge == "empty-chunk":  # the call gets none of the chunk's tokens
            return 0
        if self.op == "prefill":  # a ragged prefill batch: one chunk per request
            return self.tokens * (len(self.context_lens) or 1)
        if self.op in ("indexer", "topk") and self.tokens:
            return self.tokens
        if self.op == "cache_write":  # each request's last s_q tokens
            return sum(min(self.s_q, n) for n in self.request_lens)
        if self.op == "remap" and self.tokens:  # each request's last `tokens` queries
            return sum(min(self.tokens, n) for n in self.request_lens)
        return self.batch_size * self.s_q

    @property
    def decode_shape(self) -> tuple[int, int] | None:
        """(b, s_q) of the FP8 decode-kernel call this case makes; None when it makes none.

        A prefill chunk of T tokens is (T, 1) on route decode-kernel (sglang: q (T, 1, h, d))
        and (1, T) on decode-mixed (vLLM: q.unsqueeze(0) -> (1, T, h, d))."""
        if self.op == "decode":
            return self.batch_size, self.s_q
        if self.op == "prefill" and self.route == "decode-kernel":
            return self.tokens, 1
        if self.op == "prefill" and self.route == "decode-mixed":
            return 1, self.tokens
        return None

    def params(self) -> dict:
        """The problem's own fields, without timing/tolerance settings."""
        skip = {"scenario", "timing", "tolerance", "tags"}
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}
        for name, unset in WORKLOAD_DEFAULTS.items():
            if out[name] == unset:
                del out[name]
        if "context_lens" in out:
            out["context_lens"] = list(self.context_lens)  # JSON's form: the same id everywhere
        return out

    @property
    def request_lens(self) -> tuple[int, ...]:
        """Each request's context: context_lens, or batch_size times context_len."""
        return self.context_lens or (self.context_len,) * self.batch_size

    @property
    def case_id(self) -> str:
        """Stable id: readable prefix plus a hash of every problem field."""
        p = self.params()
        digest = hashlib.sha1(json.dumps(p, sort_keys=True).encode()).hexdigest()[:10]
        size = f"t{self.tokens}" if self.tokens else f"b{self.batch_size}"
        head = f"{self.op}-{self.model}-{self.layout}-h{self.num_heads}"
        return f"{head}-{size}-k{self.topk}-{digest}"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Case:
        d = dict(d)
        d["timing"] = Timing(**d.get("timing", {}))
        d["tolerance"] = Tolerance(**d.get("tolerance", {}))
        d["tags"] = tuple(d.get("tags", ()))
        return cls(**d)
