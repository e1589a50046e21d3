"""Scenario files, step 2: the value rules. Parser checks one node (an integer, a choice, a
model, a backend entry); case_problems/validate_case check a whole Case, for scenario files
and for Cases built in code alike.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from dsv4bench.cases.case import (
    EDGES,
    HEAD_PADDINGS,
    OPS,
    REMAP_FORMS,
    ROUTES,
    SCALE_CONVENTIONS,
    SPLIT_PAGE,
    TIMER_MODES,
    TOPK_FORMS,
    VALUES,
    Case,
    Timing,
    Tolerance,
    padding_count,
)
from dsv4bench.cases.patterns import PATTERNS
from dsv4bench.scenarios import batch_entry, workloads
from dsv4bench.scenarios.helper_rules import cache_write_problems, dcp_problems
from dsv4bench.scenarios.read import (
    Node,
    Origin,
    ScenarioError,
    key_path,
    show_value,
    suggestion,
)
from dsv4bench.scenarios.workloads import workload_problems
from reference.layout_table import LAYOUTS as LAYOUT_TABLE
from reference.layout_table import of_d_qk
from reference.models import MODELS, ModelConfig

DEFAULT_CONTEXT_LEN = 8192
DEFAULT_PREFILL_TOKENS = 4096
COMPRESS_RATIOS = (0, 4, 128)
LIMIT_AXES = ("batch_size", "s_q", "tokens", "topk", "extra_topk", "context_len")


# ---- value parsers -------------------------------------------------------------------------


class Parser:
    def __init__(self, file: str, known_backends: Collection[str]):
        """known_backends: names, or a mapping name -> declared options (Backend.options)."""
        self.file = file
        self.known_backends = sorted(known_backends)
        self.known_options = dict(known_backends) if isinstance(known_backends, Mapping) else {}
        self.instances: dict[str, dict] = {}

    def fail(self, n: Node | Origin, message: str, path: str | None = None) -> ScenarioError:
        return ScenarioError(self.file, n.line, n.path if path is None else path, message)

    def expect_map(self, n: Node, what: str = "a mapping") -> dict[str, Node]:
        if n.kind != "map":
            raise self.fail(n, f"expected {what}, got {show_value(n)}")
        return n.value

    def known_key(self, n: Node, key: str, known: Collection[str]) -> None:
        if key not in known:
            raise ScenarioError(
                self.file,
                n.key_lines[key],
                key_path(n.path, key),
                "unknown key" + suggestion(key, known),
            )

    def check_keys(self, n: Node, known: Collection[str], required: Collection[str] = ()):
        for key in n.value:
            self.known_key(n, key, known)
        for key in required:
            if key not in n.value:
                raise self.fail(n, "required key missing", key_path(n.path, key))

    def integer(self, n: Node, minimum: int = 1) -> int:
        v = n.value
        if n.kind != "scalar" or not isinstance(v, int) or isinstance(v, bool) or v < minimum:
            what = {0: "a non-negative integer", 1: "a positive integer"}.get(
                minimum, f"an integer >= {minimum}"
            )
            raise self.fail(n, f"expected {what}, got {show_value(n)}")
        return v

    def number(self, n: Node, *, positive: bool) -> float:
        v = n.value
        if n.kind == "scalar" and n.plain and isinstance(v, str):
            with contextlib.suppress(ValueError):  # YAML 1.1 reads 5e-6 (no dot) as text
                v = float(v)
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        if not ok or v < 0 or (positive and v == 0):
            what = "a positive number" if positive else "a non-negative number"
            raise self.fail(n, f"expected {what}, got {show_value(n)}")
        return float(v)

    def boolean(self, n: Node) -> bool:
        if n.kind != "scalar" or not isinstance(n.value, bool):
            raise self.fail(n, f"expected true or false, got {show_value(n)}")
        return n.value

    def text(self, n: Node) -> str:
        if n.kind != "scalar" or not isinstance(n.value, str) or not n.value.strip():
            raise self.fail(n, f"expected a non-empty string, got {show_value(n)}")
        return n.value

    def choice(self, n: Node, choices: Collection[str], what: str = "") -> str:
        if n.kind != "scalar" or not isinstance(n.value, str) or n.value not in choices:
            hint = suggestion(n.value, choices) if isinstance(n.value, str) else ""
            hint = hint or f"; expected one of: {', '.join(choices)}"
            raise self.fail(n, f"unknown {what or 'value'} {show_value(n)}{hint}")
        return n.value

    def names(self, n: Node, choices: Collection[str] | None, what: str) -> list[str]:
        """A non-empty list of distinct names (a single name is a list of one)."""
        items = n.value if n.kind == "seq" else [n]
        if not items:
            raise self.fail(n, f"expected a non-empty list of {what}s, got an empty list")
        out: list[str] = []
        for item in items:
            name = self.choice(item, choices, what) if choices is not None else self.text(item)
            if name in out:
                raise self.fail(item, f"{what} {name!r} listed twice")
            out.append(name)
        return out

    def backends(self, n: Node) -> list[str]:
        """Backend names, or `{name: NAME, as: INSTANCE, OPTION: VALUE}` instance entries."""
        if n.kind == "scalar" and n.value == "all":
            return list(self.known_backends)
        items = n.value if n.kind == "seq" else [n]
        if not items:
            raise self.fail(n, "expected a non-empty list of backends, got an empty list")
        out: list[str] = []
        for item in items:
            if item.kind == "map":
                name = self.instance(item)
            else:
                name = self.choice(item, [*self.known_backends, *self.instances], "backend")
            if name in out:
                raise self.fail(item, f"backend {name!r} listed twice")
            out.append(name)
        return out

    def instance(self, n: Node) -> str:
        m = n.value
        if "name" not in m:
            raise self.fail(n, "required key missing", key_path(n.path, "name"))
        base = self.choice(m["name"], self.known_backends, "backend")
        declared = self.known_options.get(base, {})
        self.check_keys(n, ("name", "as", *declared))
        options = {}
        for key in declared:
            if key in m:
                if m[key].kind != "scalar":
                    raise self.fail(m[key], f"expected a single value, got {show_value(m[key])}")
                options[key] = m[key].value
        given = ",".join(f"{k}={v}" for k, v in options.items())
        name = self.text(m["as"]) if "as" in m else (f"{base}[{given}]" if given else base)
        if name == base and options:
            raise self.fail(m["as"], f"{name!r} is the backend itself; choose another name")
        entry = {"name": name, "base": base, "options": options, "origin": f"{self.file}:{n.line}"}
        old = self.instances.setdefault(name, entry)
        if (old["base"], old["options"]) != (base, options):
            raise self.fail(n, f"backend {name!r} is defined twice with other options")
        return name

    def timing(self, n: Node) -> Timing:
        self.expect_map(n)
        checks = ("graph", "determinism", "batch_invariance")
        self.check_keys(n, ("warmup", "iters", "flush_l2", "timer", "timeout_s", *checks))
        m, t = n.value, Timing()
        timeout = m.get("timeout_s")
        return Timing(
            **{k: self.boolean(m[k]) for k in checks if k in m},
            warmup=self.integer(m["warmup"], 0) if "warmup" in m else t.warmup,
            iters=self.integer(m["iters"], 1) if "iters" in m else t.iters,
            flush_l2=self.boolean(m["flush_l2"]) if "flush_l2" in m else t.flush_l2,
            timer=self.choice(m["timer"], TIMER_MODES, "timer") if "timer" in m else t.timer,
            timeout_s=self.number(timeout, positive=True) if timeout else t.timeout_s,
        )

    def tolerance(self, n: Node) -> Tolerance:
        self.expect_map(n)
        self.check_keys(n, ("cos_diff", "lse_abs"))
        m, t = n.value, Tolerance()
        return Tolerance(
            cos_diff=self.number(m["cos_diff"], positive=False) if "cos_diff" in m else t.cos_diff,
            lse_abs=self.number(m["lse_abs"], positive=False) if "lse_abs" in m else t.lse_abs,
        )

    # ---- axes ----

    def head_padding(self, n: Node) -> str:
        v = n.value
        if n.kind == "scalar" and isinstance(v, int) and not isinstance(v, bool):
            v = str(v)
        if n.kind != "scalar" or not isinstance(v, str) or v not in HEAD_PADDINGS:
            raise self.fail(n, f"expected one of {', '.join(HEAD_PADDINGS)}, got {show_value(n)}")
        return v

    def compress_ratio(self, n: Node) -> int:
        v = n.value
        if n.kind != "scalar" or isinstance(v, bool) or v not in COMPRESS_RATIOS:
            raise self.fail(n, f"expected 0, 4 or 128, got {show_value(n)}")
        return v

    def model(self, n: Node) -> ModelSpec:
        if n.kind == "scalar":
            name = self.choice(n, list(MODELS), "model")
            return ModelSpec.builtin(MODELS[name])
        spec = self.expect_map(n, "a model name or a mapping of model dimensions")
        self.check_keys(n, MODEL_KEYS, ("d_qk", "num_heads"))
        name = self.text(spec["name"]) if "name" in spec else "custom"
        if name in MODELS:
            raise self.fail(spec["name"], f"{name} is a built-in model; give another name")
        d_qk = self.integer(spec["d_qk"])
        d_v = self.integer(spec["d_v"]) if "d_v" in spec else min(512, d_qk)
        if d_v > d_qk:
            raise self.fail(spec.get("d_v", n), f"expected d_v <= d_qk ({d_qk}), got {d_v}")
        window = self.integer(spec["window"], 0) if "window" in spec else 0
        if "topk" in spec:
            topk = self.integer(spec["topk"])
        elif window:
            topk = window
        else:
            raise self.fail(n, "required key missing (or give a window)", key_path(n.path, "topk"))
        layout = (
            self.choice(spec["layout"], LAYOUT_TABLE.keys(), "layout") if "layout" in spec else None
        )
        layout = layout or of_d_qk(d_qk)
        need = LAYOUT_TABLE[layout].d_qk  # None: bf16 rows take any width
        if need is not None and need != d_qk:
            where = spec.get("layout") or spec["d_qk"]
            raise self.fail(where, f"layout {layout} needs d_qk {need}, the model has {d_qk}")
        scale = spec.get("softmax_scale")
        return ModelSpec(
            name=name,
            d_qk=d_qk,
            d_v=d_v,
            num_heads=self.integer(spec["num_heads"]),
            topk=topk,
            window=window,
            softmax_scale=self.number(scale, positive=True) if scale else d_qk**-0.5,
            layout=layout,
            page_size=self.integer(spec["page_size"]) if "page_size" in spec else 64,
            index_topk=self.integer(spec["index_topk"], 0) if "index_topk" in spec else 0,
        )


@dataclass(frozen=True)
class ModelSpec:
    """What a model contributes to a case: fixed dimensions and axis defaults."""

    name: str
    d_qk: int
    d_v: int
    num_heads: int
    topk: int  # main-cache indices: V3.2 the indexer top-k, V4 the window
    window: int
    softmax_scale: float
    layout: str
    page_size: int
    index_topk: int = 0  # C4 top-k over compressed entries (0: all of them)
    compress_ratio: int = 0
    sink: bool = False

    @classmethod
    def builtin(cls, m: ModelConfig) -> ModelSpec:
        ratio = 4 if 4 in m.compress_ratios else 0
        return cls(
            name=m.name,
            d_qk=m.d_qk,
            d_v=m.d_v,
            num_heads=m.num_heads,
            topk=m.window or m.index_topk,
            window=m.window,
            softmax_scale=m.softmax_scale,
            layout=m.cache_layout,
            page_size=m.page_size,
            index_topk=m.index_topk if ratio else 0,
            compress_ratio=ratio,
            sink=m.has_sink,
        )


MODEL_KEYS = (
    "name",
    "d_qk",
    "d_v",
    "num_heads",
    "topk",
    "window",
    "softmax_scale",
    "layout",
    "page_size",
    "index_topk",
)


@dataclass(frozen=True)
class Axis:
    parse: Callable[[Parser, Node], Any]
    integer: bool = False  # takes the range form {from, to, mul|step}
    minimum: int = 1


def int_axis(minimum: int) -> Axis:
    return Axis(lambda p, n: p.integer(n, minimum), integer=True, minimum=minimum)


def enum_axis(choices: Collection[str], what: str) -> Axis:
    return Axis(lambda p, n: p.choice(n, choices, what))


AXES: dict[str, Axis] = {
    "op": enum_axis(OPS, "op"),
    "model": Axis(Parser.model),
    "batch_size": int_axis(1),
    "s_q": int_axis(1),
    "tokens": int_axis(1),
    "num_heads": int_axis(1),
    "tp": int_axis(1),
    "head_padding": Axis(Parser.head_padding),
    "topk": int_axis(1),
    "extra_topk": int_axis(0),
    "context_len": int_axis(1),
    "page_size": int_axis(1),
    "layout": enum_axis(LAYOUT_TABLE.keys(), "layout"),  # live: a layout added to the table
    "sink": Axis(Parser.boolean),
    "scale_convention": enum_axis(SCALE_CONVENTIONS, "scale convention"),
    "route": enum_axis(ROUTES, "route"),
    "compress_ratio": Axis(Parser.compress_ratio),
    "window": int_axis(0),
    "context_lens": Axis(workloads.context_lens),
    "index_pattern": enum_axis(PATTERNS, "index pattern"),
    "form": enum_axis(TOPK_FORMS + REMAP_FORMS, "form (top-k or remap)"),
    "dcp_size": int_axis(1),
    "dcp_rank": int_axis(0),
    "dcp_interleave": int_axis(1),
    "edge": enum_axis(EDGES, "failure shape"),
    "graph_batch": int_axis(1),
    "values": enum_axis(VALUES, "value distribution"),
    "batch_spec": Axis(batch_entry.parse_value),  # vLLM's grammar: expands to several cases
}


# ---- the shared value rules ----------------------------------------------------------------


def is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def case_problems(v: dict[str, Any]) -> list[tuple[str, str]] | None:
    """The first rule a case's fields break, as (field, message) candidates, each phrased for
    blaming that field; None when every rule holds."""
    if v["op"] not in OPS:
        return [("op", f"expected one of {', '.join(OPS)}, got {v['op']!r}")]
    for name in ("batch_size", "s_q", "num_heads", "topk", "context_len", "page_size"):
        if not is_int(v[name]) or v[name] < 1:
            return [(name, f"expected a positive integer, got {v[name]!r}")]
    for name in ("d_qk", "d_v"):
        if not is_int(v[name]) or v[name] < 1:
            return [(name, f"expected a positive integer, got {v[name]!r}"), ("model", "")]
    for name in ("tokens", "extra_topk", "window", "seed", "compress_ratio"):
        if not is_int(v[name]) or v[name] < 0:
            return [(name, f"expected a non-negative integer, got {v[name]!r}")]
    layout = v["layout"]
    if layout not in LAYOUT_TABLE:
        return [("layout", f"expected one of {', '.join(LAYOUT_TABLE)}, got {layout!r}")]
    need = LAYOUT_TABLE[layout].d_qk  # None: bf16 rows take any width
    if need is not None and v["d_qk"] != need:
        return [
            ("layout", f"layout {layout} needs d_qk {need}, the model has d_qk {v['d_qk']}"),
            ("model", f"model has d_qk {v['d_qk']}, layout {layout} needs {need}"),
        ]
    if v["d_v"] > v["d_qk"]:
        return [("d_v", f"expected d_v <= d_qk ({v['d_qk']}), got {v['d_v']}"), ("model", "")]
    scales = LAYOUT_TABLE[layout].conventions or ("", *SCALE_CONVENTIONS)  # bf16: none
    if v["scale_convention"] not in scales:
        return [
            (
                "scale_convention",
                f"layout {layout} takes {' or '.join(scales)}, got {v['scale_convention']!r}",
            ),
            ("layout", f"layout {layout} takes no scale convention {v['scale_convention']!r}"),
        ]
    pad = v["head_padding"]
    if pad not in HEAD_PADDINGS:
        return [("head_padding", f"expected one of {', '.join(HEAD_PADDINGS)}, got {pad!r}")]
    if padding_count(pad) is not None and v["num_heads"] > padding_count(pad):
        return [
            ("num_heads", f"expected at most head_padding ({pad}) heads, got {v['num_heads']}"),
            ("head_padding", f"pads to {pad} heads, fewer than num_heads ({v['num_heads']})"),
        ]
    problems = workload_problems(v) or edge_problems(v)
    if problems:
        return problems
    if v["op"] == "prefill":
        if v["batch_size"] != 1 and not v.get("context_lens"):
            return [("batch_size", f"prefill takes one chunk of tokens, got {v['batch_size']}")]
        if v["s_q"] != 1:
            return [("s_q", f"prefill queries are tokens, not s_q; got {v['s_q']}")]
        if v["tokens"] < 1:
            return [("tokens", f"expected a positive integer, got {v['tokens']}")]
        if v["tokens"] > v["context_len"]:
            return pair_rule("tokens", "<=", "context_len", v)
        if v["route"] not in ROUTES:
            return [("route", f"expected one of {', '.join(ROUTES)}, got {v['route']!r}")]
    elif v["op"] in ("indexer", "topk"):  # topk: the top-k of an indexer case's logits
        problems = indexer_problems(v) or form_problems(v)
        if problems:
            return problems
    elif v["op"] == "cache_write":
        problems = cache_write_problems(v)
        if problems:
            return problems
    else:
        if v["tokens"] != 0 and v["op"] not in ("remap", "dequant"):
            why = "only prefill has tokens (and remap, dequant: vLLM's prefill workspace forms)"
            return [("tokens", f"{why}; this is a {v['op']} case")]
        if v["route"] != ROUTES[0]:
            return [("route", f"only prefill has a route; this is a {v['op']} case")]
    if v["op"] not in ("topk", "remap") and v.get("form"):
        return [("form", f"only topk and remap have a form; this is a {v['op']} case")]
    problems = dcp_problems(v)
    if problems:
        return problems
    if v["op"] == "page_split":
        problems = page_split_problems(v)
        if problems:
            return problems
    if v["topk"] > v["context_len"] and v["op"] not in ("indexer", "topk", "cache_write"):
        return pair_rule("topk", "<=", "context_len", v)
    if v["window"] and v["topk"] > v["window"]:
        return pair_rule("topk", "<=", "window", v, why="the main-cache indices are the window: ")
    ratio = v["compress_ratio"]
    if ratio not in COMPRESS_RATIOS:
        return [("compress_ratio", f"expected 0, 4 or 128, got {ratio!r}")]
    if ratio == 0 and v["extra_topk"]:
        return [
            ("extra_topk", "an extra cache needs compress_ratio 4 or 128, got compress_ratio 0"),
            ("compress_ratio", f"extra_topk {v['extra_topk']} needs compress_ratio 4 or 128"),
        ]
    if ratio and v["extra_topk"] > v["context_len"] // ratio:
        entries = v["context_len"] // ratio
        have = f"context_len // compress_ratio = {v['context_len']} // {ratio} = {entries}"
        few = f"{have} compressed entries, fewer than extra_topk {v['extra_topk']}"
        return [
            ("extra_topk", f"expected extra_topk <= {have}, got {v['extra_topk']}"),
            ("context_len", few),
            ("compress_ratio", few),
        ]
    if not isinstance(v["sink"], bool):
        return [("sink", f"expected true or false, got {v['sink']!r}")]
    scale = v["softmax_scale"]
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale >= 0:
        return [("softmax_scale", f"expected a non-negative number, got {scale!r}"), ("model", "")]
    if not math.isfinite(scale):
        return [("softmax_scale", f"expected a finite number, got {scale!r}"), ("model", "")]
    known = MODELS.get(v["model"])
    if known is not None and (v["d_qk"], v["d_v"]) != (known.d_qk, known.d_v):
        return [("model", f"{known.name} has d_qk {known.d_qk} and d_v {known.d_v}")]
    return None


def page_split_problems(v: dict[str, Any]) -> list[tuple[str, str]] | None:
    """A page split re-pages a V4 cache into SPLIT_PAGE-token pages: larger whole pages only."""
    if v["layout"] != "v4":
        return [("layout", f"page_split re-pages a v4 cache, got layout {v['layout']}")]
    if v["page_size"] <= SPLIT_PAGE or v["page_size"] % SPLIT_PAGE:
        return [
            (
                "page_size",
                f"page_split splits pages into {SPLIT_PAGE}-token pages: expected a multiple of "
                f"{SPLIT_PAGE} above {SPLIT_PAGE}, got {v['page_size']}",
            )
        ]
    return None


def indexer_problems(v: dict[str, Any]) -> list[tuple[str, str]] | None:
    """Rules of an indexer case: a paged batch (tokens 0) or one ragged chunk of tokens."""
    if v["tokens"]:
        for key in ("batch_size", "s_q"):
            if v[key] != 1:
                return [(key, f"an indexer chunk (tokens > 0) is one request: expected {key} 1")]
        if v["tokens"] > v["context_len"]:
            return pair_rule("tokens", "<=", "context_len", v)
    if v["route"] != ROUTES[0]:
        return [("route", "only prefill has a route; this is an indexer case")]
    if v["compress_ratio"] not in (0, 4):
        return [("compress_ratio", "the indexer runs over all tokens (0) or C4 entries (4)")]
    for key in ("extra_topk", "window"):
        if v[key]:
            return [(key, f"an indexer case has no {key}; got {v[key]}")]
    if v["sink"]:
        return [("sink", "an indexer case has no attention sink")]
    if v["context_len"] // (v["compress_ratio"] or 1) < 1:
        return [("context_len", "the context must hold at least one key entry")]
    if v["page_size"] < 16 or v["page_size"] & (v["page_size"] - 1):
        return [("page_size", f"expected a power of two >= 16, got {v['page_size']}")]
    return None


def form_problems(v: dict[str, Any]) -> list[tuple[str, str]] | None:
    """A topk case returns its picks in one of TOPK_FORMS."""
    if v["op"] == "topk" and v.get("form") not in TOPK_FORMS:
        return [("form", f"expected one of {', '.join(TOPK_FORMS)}, got {v.get('form')!r}")]
    return None


def validate_case(case: Case) -> str | None:
    """None if a Case built in code obeys the scenario rules, else `field: what was expected`."""
    if not isinstance(case, Case):
        return f"expected a Case, got {type(case).__name__}"
    if not isinstance(case.model, str) or not case.model:
        return f"model: expected a model name, got {case.model!r}"
    if not isinstance(case.scenario, str):
        return f"scenario: expected a string, got {case.scenario!r}"
    problems = case_problems(case.params())
    if problems:
        name, message = problems[0]
        return f"{name}: {message}"
    t = case.timing
    if not is_int(t.warmup) or t.warmup < 0:
        return f"timing.warmup: expected a non-negative integer, got {t.warmup!r}"
    if not is_int(t.iters) or t.iters < 1:
        return f"timing.iters: expected a positive integer, got {t.iters!r}"
    if not isinstance(t.flush_l2, bool):
        return f"timing.flush_l2: expected true or false, got {t.flush_l2!r}"
    if t.timer not in TIMER_MODES:
        return f"timing.timer: expected one of {', '.join(TIMER_MODES)}, got {t.timer!r}"
    if not positive_number(t.timeout_s):
        return f"timing.timeout_s: expected a positive number, got {t.timeout_s!r}"
    for name in ("cos_diff", "lse_abs"):
        x = getattr(case.tolerance, name)
        if not (positive_number(x) or x == 0):
            return f"tolerance.{name}: expected a non-negative number, got {x!r}"
    if not all(isinstance(tag, str) and tag for tag in case.tags):
        return f"tags: expected non-empty strings, got {case.tags!r}"
    return None


def positive_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


# ---- the scenario walk ---------------------------------------------------------------------


def pair_rule(a: str, rel: str, b: str, v: dict, why: str = "") -> list[tuple[str, str]]:
    """Candidates for a broken `a <= b`: phrased for blaming a, then b."""
    flip = {"<=": ">="}[rel]
    return [
        (a, f"{why}expected {a} {rel} {b} ({v[b]}), got {v[a]}"),
        (b, f"{why}expected {b} {flip} {a} ({v[a]}), got {v[b]}"),
    ]


def edge_problems(v: dict[str, Any]) -> list[tuple[str, str]] | None:
    """A failure shape (cases/edges.py) fits its op: a 0-token prefill call through the kernel
    that takes the chunk's rows first; a decode batch with a request inside it to empty; a
    decode batch padded to a larger captured one (and refilled with the next batch)."""
    edge, graph_batch = v.get("edge", ""), v.get("graph_batch", 0)
    if edge and edge not in EDGES:
        return [("edge", f"expected one of {', '.join(EDGES)}, got {edge!r}")]
    padding = edge.startswith(("graph-pad", "graph-refill"))
    if graph_batch and not padding:
        return [
            ("graph_batch", "graph_batch is the captured batch of a graph-pad or graph-refill edge")
        ]
    if edge == "empty-chunk":
        if v["op"] != "prefill" or v.get("context_lens"):
            return [("edge", "empty-chunk is a prefill call of one chunk (no context_lens)")]
        if v["route"] == "decode-mixed":
            return [("route", "empty-chunk empties the rows of q: route decode-mixed has one")]
    elif edge == "empty-request" and (v["op"] != "decode" or v["batch_size"] < 2):
        return [("edge", "empty-request empties a request inside a decode batch of 2 or more")]
    elif padding:
        if v["op"] != "decode":
            return [("edge", f"{edge} pads a decode batch, this is a {v['op']} case")]
        if graph_batch <= v["batch_size"]:
            got = f"graph_batch {graph_batch}, batch_size {v['batch_size']}"
            return [("graph_batch", f"{edge} needs graph_batch > batch_size, got {got}")]
    return None
