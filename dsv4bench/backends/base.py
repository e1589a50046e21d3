"""What a backend is: a kernel family that can take some cases, prepared outside the timed call."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dsv4bench.cases.case import CACHE_OPS, Case, Tolerance, padding_count
from dsv4bench.cases.output import Output
from reference.layout_table import FP8_LAYOUTS, LAYOUTS


@dataclass
class Provider:
    """Where a backend's kernels came from; recorded in every result row."""

    name: str  # e.g. "flash_mla", "vllm._flashmla_C", "library file", "reference"
    version: str = ""
    location: str = ""


@dataclass
class Prepared:
    """A backend's case, ready to run.

    `run` is the only thing timed. `finish` turns what `run` returned into an Output in the
    oracle's shapes (drops padded heads, converts layouts); it is never timed. `poison` fills
    preallocated outputs with NaN so that a kernel writing nothing is caught.
    """

    run: Callable[[], Any]
    finish: Callable[[Any], Output] = lambda raw: raw
    poison: Callable[[], None] | None = None
    info: dict = field(default_factory=dict)  # e.g. {"padded_heads": 64}: recorded in the row
    # The inputs the kernel really reads, in the oracle's form (the keys inputs.make_inputs
    # gives for the case), when prepare() re-quantized them (e.g. an e4m3 copy of the cache).
    # The worker still judges the answer against oracle(inputs), what an engine serving that
    # cache gets, and records beside it the kernel's own error against oracle(reads)
    # (info["kernel_own"]) and the conversion's (info["conversion"]): a lossy conversion fails
    # the row instead of hiding in the values it is judged on.
    reads: dict | None = None
    # What the kernel claims to compute (its own arithmetic modelled over the operands it
    # read, e.g. reference/fp8_attention.py for an FP8 kernel): the worker records the answer's
    # distance to it as accuracy `exact_*`, the kernel's own exactness beside the oracle's.
    exact: Callable[[], Output] | None = None
    # The tensors `run` reads, in an order fixed by the adapter (None where an optional one is
    # absent): a graph-refill case (run/padded.py) copies the next batch's, prepared the same
    # way, into them in place before replaying, as engines fill their static buffers. None:
    # not declared (such a case is unsupported).
    buffers: tuple | None = None
    # The indexer's FP8 logits alone (`run` without its top-k): the worker times it as it
    # times `run` and splits the row's time into logits and top-k (measure/split.py).
    logits: Callable[[], Any] | None = None


class Unsupported(Exception):
    """Raised by prepare() when a case turns out to be beyond the backend (reason = message)."""


REASON_CHARS = 300  # the most of a load failure's one-line reason (an exception's text)


class Backend:
    """Subclass, set the class attributes, implement supports() and prepare_case() (with
    prepare_reason(): what prepare() checks first).

    Adding a kernel means adding one such class and registering it (see registry).

    Declarations: `archs`, `ops` and `layouts` say what the backend can read; the base
    supports() checks them first (with a reason), so a subclass's supports() calls it before
    its own rules, and a layout added to reference/layout_table.py reaches only the backends
    that list it.

    Options: a backend's own settings (a library path, a cache dtype) are keyword arguments of
    its constructor with defaults, stored as attributes of the same name, and declared in the
    class attribute `options` (name -> default). `--backend-opt NAME.OPTION=VALUE` and a
    scenario's `backends: [{name: NAME, as: INSTANCE, OPTION: VALUE}]` build instances from
    them (see registry.configure); nothing else in the suite knows a backend's options.
    """

    name: str = ""  # the instance name rows carry; the class's own `name` is the base name
    description: str = ""
    archs: tuple[str, ...] = ()  # "cpu", "sm90", "sm100", "sm120"
    ops: tuple[str, ...] = ()
    # KV cache layouts (reference/layout_table.py names) its CACHE_OPS read; None: any layout
    # the table can write and read (only the oracle, which reads through the table itself)
    layouts: tuple[str, ...] | None = ("v32", "v4")
    # Its answers are the oracle's own: its rows are reference rows (a timing baseline), and
    # an accuracy of the oracle against itself would check nothing.
    is_oracle: bool = False
    # Its dequant takes vLLM's chunked prefill form (a dequant case with tokens > 0: each
    # chunk's requests gathered into that chunk's workspace); without, it gathers every slot
    # in order and the base supports() declines the form.
    chunked_gather: bool = False

    options: dict[str, Any] = {}  # option name -> default (a constructor keyword, an attribute)
    # What no probe case finds, as short text (report/capabilities.py DECLARED: "lse out",
    # "CUDA graphs", "batch invariance"), each read from the adapter's code or the kernel's
    # API; a test fails for a registered backend that leaves one out.
    capabilities: dict[str, str] = {}
    # What the serving presets read (serving/presets.py kv_options): its kernels read a bf16
    # cache only (a bf16 candidate only), or its prefill gathers and casts the cache to an
    # e4m3 workspace on every call (an FP8 candidate only: the dequant part is its own).
    bf16_kv: bool = False
    cast_every_call: bool = False

    @property
    def base(self) -> str:
        """The backend this instance was built from ("flashmla" for "flashmla-0.33")."""
        return type(self).name or self.name

    def option_values(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in type(self).options}

    def provider(self) -> Provider:
        """Find the kernel library (lazily, on first call); raise Unsupported if it is absent."""
        return Provider(self.name)

    def supports(self, case: Case, arch: str) -> str | None:
        """None if the case can run on arch, else the reason it cannot (one line)."""
        if arch not in self.archs:
            return f"{self.name} runs on {', '.join(self.archs)}, not {arch}"
        if case.op not in self.ops:
            return f"{self.name} has no {case.op} kernel (has: {', '.join(self.ops)})"
        if case.op == "dequant" and case.tokens and not self.chunked_gather:
            return (
                f"{self.name}'s dequant gathers every slot in order, not vLLM's chunked prefill "
                "form (dequant with tokens > 0)"
            )
        return self.layout_reason(case)

    def layout_reason(self, case: Case) -> str | None:
        """Why this backend cannot read the case's cache layout; None if it can (or the op
        reads no cache)."""
        if case.op not in CACHE_OPS:
            return None
        entry = LAYOUTS.get(case.layout)
        if entry is None:
            return f"unknown layout {case.layout!r} (known: {', '.join(LAYOUTS)})"
        if self.layouts is not None and case.layout not in self.layouts:
            kinds = " or ".join(self.layouts) or "no"
            return f"{self.name} kernels read a {kinds} FP8 cache, not layout {case.layout}"
        if not entry.complete:
            return f"layout {case.layout} has no writer and reader in the layout table yet"
        return None

    def v32_scale_reading(self, arch: str) -> str | None:
        """How this backend reads a V3.2 fp32 scale on arch: None (exact), "bf16",
        "bf16-product" or "e8m0" (reference.layouts scale_rounding)."""
        return None

    def limit_guess(self, case: Case, axis: str, arch: str) -> int | None:
        """Where this backend is expected to start failing along `axis` from `case` (the last
        size that works), if known: a limit search probes it and the next size first."""
        return None

    def declared_tolerance(self, case: Case) -> tuple[Tolerance, str] | None:
        """A lossy kernel's own tolerance against the oracle (an FP8 compute path) and why;
        its rows are judged with it instead of the case's, and carry it. None: the case's."""
        return None

    def build_reason(self) -> str | None:
        """Why this instance's pinned build will not run, known without loading it (None: no
        reason known before its worker loads it)."""
        return None

    def process_key(self) -> str:
        """Backends with the same key share a worker process. An instance whose options load
        process-wide state (a kernel library registering fixed torch op names: two builds of
        one library cannot live in one process) returns a key of its own."""
        return ""

    def prepare(self, case: Case, inputs: dict, device: str) -> Prepared:
        """The case made ready on `device`: Unsupported with prepare_reason()'s reason, if it
        gives one, else prepare_case() (a subclass may override prepare() whole instead)."""
        reason = self.prepare_reason(case, device)
        if reason:
            raise Unsupported(reason)
        return self.prepare_case(case, inputs, device)

    def prepare_reason(self, case: Case, device: str) -> str | None:
        """Why the case cannot run on `device`, checked first by prepare(); None: it can."""
        return None

    def prepare_case(self, case: Case, inputs: dict, device: str) -> Prepared:
        """The case made ready, its reasons checked (prepare_reason)."""
        raise NotImplementedError


@dataclass(frozen=True)
class HeadRule:
    """How a kernel takes query heads for one case: the counts it accepts (None: any) and the
    multiple they must be of (1: any), the count an engine pads to (head_padding "engine"), and
    the kernel's name for reasons."""

    kernel: str
    counts: tuple[int, ...] | None
    engine: int
    multiple: int = 1


def resolve_heads(case: Case, rule: HeadRule) -> tuple[int, str | None]:
    """The one reading of Case.head_padding ("engine" | "none" | "raw" | N): the query heads
    handed to the kernel, or 0 and the reason none fits. "raw" hands the kernel the case's
    heads whatever its rule says: the kernel's own checks (or its crash) answer."""
    h, mode = case.num_heads, case.head_padding
    if mode == "raw":
        return h, None
    if mode == "engine":
        target = rule.engine
    elif mode == "none":
        target = h
    elif padding_count(mode) is not None:
        target = padding_count(mode)
    else:
        return 0, f"unknown head_padding {mode!r} (engine, none, raw or a head count)"
    if rule.counts is not None and target not in rule.counts:
        allowed = "/".join(map(str, rule.counts))
        return 0, f"{rule.kernel} takes {allowed} query heads; head_padding {mode} gives {target}"
    if target % rule.multiple:
        return 0, (
            f"{rule.kernel} takes query heads in multiples of {rule.multiple}, not {target} "
            f"(head_padding {mode})"
        )
    if h > target:
        most = max(rule.counts) if rule.counts else None
        tail = f"; {rule.kernel} kernels take at most {most}" if most and h > most else ""
        return 0, f"{h} heads exceed head_padding {mode} ({target}){tail}"
    return target, None


def fp8_cache_reason(case: Case, kernel: str) -> str | None:
    """Why `kernel`, which reads the FP8 caches, cannot take the case's layout; None if it can."""
    lay = LAYOUTS.get(case.layout)
    if lay is None or not lay.fp8:
        return f"{kernel} read a {' or '.join(FP8_LAYOUTS)} FP8 cache, not layout {case.layout}"
    if lay.d_qk != case.d_qk:
        return f"{kernel} read the {case.layout} cache with d_qk {lay.d_qk}, not {case.d_qk}"
    return None


def check_cache_width(case: Case, name: str, cache) -> None:
    """A cache tensor's last dim must be the bytes per token of the case's layout."""
    width = LAYOUTS[case.layout].token_bytes
    if cache.shape[-1] != width:
        raise ValueError(f"{name} rows are {cache.shape[-1]} B, layout {case.layout} needs {width}")


def pad_heads(x, heads: int, dim: int):
    """x with `heads` entries along dim: zero queries on the padded heads (outputs dropped)."""
    if x.shape[dim] == heads:
        return x.contiguous()
    shape = list(x.shape)
    shape[dim] = heads
    y = x.new_zeros(shape)
    y.narrow(dim, 0, x.shape[dim]).copy_(x)
    return y


def pad_sink(sink, heads: int):
    """fp32 sink of `heads` entries; -inf (no sink) on the padded heads."""
    if sink is None:
        return None
    y = sink.float().new_full((heads,), float("-inf"))
    y[: sink.shape[0]] = sink
    return y
