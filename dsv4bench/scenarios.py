"""Scenario files: YAML -> validated Scenario -> Cases. The schema is in docs/scenarios.md.

Everything is checked before anything runs; the first problem is raised as a ScenarioError
whose text is one line, `FILE:LINE: key.path: what was expected`.
"""

from __future__ import annotations

import contextlib
import difflib
import itertools
import math
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from dsv4bench import indexer_case
from dsv4bench.case import ARCHS, LAYOUTS, OPS, ROUTES, SCALE_CONVENTIONS, Case, Timing, Tolerance
from reference.models import MODELS, ModelConfig

DEFAULT_CONTEXT_LEN = 8192
DEFAULT_PREFILL_TOKENS = 4096
HEAD_PADDINGS = ("engine", "none", "64", "128")
COMPRESS_RATIOS = (0, 4, 128)
TIMERS = ("events", "profiler", "both")
LIMIT_AXES = ("batch_size", "s_q", "tokens", "topk", "extra_topk", "context_len")
SCALES_BY_LAYOUT = {"v32": ("pow2", "raw"), "v4": ("flashmla", "vllm", "sglang")}
LAYOUT_D_QK = {"v32": 576, "v4": 512}  # bf16 rows take any width
MAX_CASES = 100_000  # a guard against a typo that multiplies sweeps into millions
_MAX_NODES = 200_000  # YAML aliases can make a small file a huge tree

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-/]*$")


class ScenarioError(ValueError):
    """A bad scenario: `str(e)` is one line, `FILE:LINE: key.path: what was expected`."""

    def __init__(self, file: str, line: int, path: str, message: str):
        self.file, self.line, self.path = file, line, path or "(top)"
        self.message = " ".join(str(message).split())
        super().__init__(f"{file}:{line}: {self.path}: {self.message}")


# ---- results -------------------------------------------------------------------------------


@dataclass(frozen=True)
class LimitSearch:
    """Find where `backend` starts failing along `axis`: `lo` is expected to work, `hi` to fail.

    `base` is the point at `axis = lo`; every other field stays fixed during the search."""

    axis: str
    lo: int
    hi: int
    backend: str
    base: Case

    def at(self, value: int) -> Case:
        return replace(self.base, **{self.axis: value})

    @property
    def limit_id(self) -> str:
        return f"limit-{self.axis}-{self.base.case_id}"


@dataclass
class Scenario:
    """A validated scenario file with its cases already expanded (in file order)."""

    name: str
    description: str
    op: str  # the top-level op; without one, the cases' op, or "mixed"
    arch: list[str]
    backends: list[str]  # the scenario's backends; a `cases` entry may replace them
    cases: list[Case]
    limits: list[LimitSearch]
    source: str
    tags: list[str] = field(default_factory=list)
    case_backends: dict[str, tuple[str, ...]] = field(default_factory=dict)  # case_id -> backends

    def backends_for(self, case: Case) -> tuple[str, ...]:
        """The backends this case runs on: its entry's `backends`, else the scenario's."""
        return self.case_backends.get(case.case_id, tuple(self.backends))

    def jobs(self) -> list[tuple[Case, str]]:
        """Every (case, backend) pair in order."""
        return [(c, b) for c in self.cases for b in self.backends_for(c)]


# ---- located YAML tree ---------------------------------------------------------------------

_TAG = "tag:yaml.org,2002:"
_SCALAR_TAGS = {_TAG + t for t in ("str", "int", "float", "bool", "null")}


@dataclass
class _Node:
    kind: str  # "map" | "seq" | "scalar"
    value: Any  # dict[str, _Node] | list[_Node] | a Python scalar
    line: int
    path: str
    plain: bool = False  # an unquoted, untagged scalar
    key_lines: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class _Origin:
    """Where a value came from: its line and key path, and how specific the place is."""

    line: int
    path: str
    rank: int  # 1 top level, 2 defaults, 3 sweep / case / limit entry, 4 limit lo / hi


def _child(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _short_tag(tag: str) -> str:
    return "!!" + tag[len(_TAG) :] if tag.startswith(_TAG) else tag


def _show(n: _Node) -> str:
    """A value as the user wrote it, for `got ...`."""
    if n.kind == "map":
        return "a mapping"
    if n.kind == "seq":
        return "a list"
    v = n.value
    if v is None:
        return "null (an empty value)"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return repr(v)
    return str(v)


def _suggest(word: str, known: Collection[str]) -> str:
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    if close:
        return f"; did you mean {close[0]}?"
    return f"; expected one of: {', '.join(known)}"


class _Reader:
    """Turns composed YAML nodes into _Nodes, checking tags and duplicate keys."""

    def __init__(self, file: str):
        self.file = file
        self.count = 0
        self.scalars = yaml.constructor.SafeConstructor()

    def fail(self, line: int, path: str, message: str) -> ScenarioError:
        return ScenarioError(self.file, line, path, message)

    def read(self, node: yaml.Node, path: str) -> _Node:
        self.count += 1
        line = node.start_mark.line + 1
        if self.count > _MAX_NODES:
            raise self.fail(line, path, f"more than {_MAX_NODES} YAML nodes (aliases?)")
        if node.tag.startswith(_TAG + "python/"):
            raise self.fail(line, path, f"Python tags are not allowed, got {_short_tag(node.tag)}")
        if isinstance(node, yaml.ScalarNode):
            if node.tag not in _SCALAR_TAGS:
                raise self.fail(line, path, f"unsupported YAML tag {_short_tag(node.tag)}")
            make = getattr(self.scalars, "construct_yaml_" + node.tag[len(_TAG) :])
            plain = node.style is None and node.tag == _TAG + "str"
            return _Node("scalar", make(node), line, path, plain=plain)
        if isinstance(node, yaml.SequenceNode):
            if node.tag != _TAG + "seq":
                raise self.fail(line, path, f"unsupported YAML tag {_short_tag(node.tag)}")
            items = [self.read(item, _child(path, i)) for i, item in enumerate(node.value)]
            return _Node("seq", items, line, path)
        if node.tag != _TAG + "map":
            raise self.fail(line, path, f"unsupported YAML tag {_short_tag(node.tag)}")
        out = _Node("map", {}, line, path)
        for key_node, value_node in node.value:
            key_line = key_node.start_mark.line + 1
            if key_node.tag == _TAG + "merge":
                raise self.fail(
                    key_line, path, "YAML merge keys (<<) are not supported; use defaults"
                )
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != _TAG + "str":
                key = self.read(key_node, path)
                raise self.fail(key_line, path, f"expected a text key, got {_show(key)}")
            key = key_node.value
            if key in out.value:
                raise self.fail(
                    key_line,
                    _child(path, key),
                    f"duplicate key (first given at line {out.key_lines[key]})",
                )
            out.key_lines[key] = key_line
            out.value[key] = self.read(value_node, _child(path, key))
        return out


# ---- value parsers -------------------------------------------------------------------------


class _Parser:
    def __init__(self, file: str, known_backends: Collection[str]):
        self.file = file
        self.known_backends = sorted(known_backends)

    def fail(self, n: _Node | _Origin, message: str, path: str | None = None) -> ScenarioError:
        return ScenarioError(self.file, n.line, n.path if path is None else path, message)

    def expect_map(self, n: _Node, what: str = "a mapping") -> dict[str, _Node]:
        if n.kind != "map":
            raise self.fail(n, f"expected {what}, got {_show(n)}")
        return n.value

    def known_key(self, n: _Node, key: str, known: Collection[str]) -> None:
        if key not in known:
            raise ScenarioError(
                self.file,
                n.key_lines[key],
                _child(n.path, key),
                "unknown key" + _suggest(key, known),
            )

    def check_keys(self, n: _Node, known: Collection[str], required: Collection[str] = ()):
        for key in n.value:
            self.known_key(n, key, known)
        for key in required:
            if key not in n.value:
                raise self.fail(n, "required key missing", _child(n.path, key))

    def integer(self, n: _Node, minimum: int = 1) -> int:
        v = n.value
        if n.kind != "scalar" or not isinstance(v, int) or isinstance(v, bool) or v < minimum:
            what = {0: "a non-negative integer", 1: "a positive integer"}.get(
                minimum, f"an integer >= {minimum}"
            )
            raise self.fail(n, f"expected {what}, got {_show(n)}")
        return v

    def number(self, n: _Node, *, positive: bool) -> float:
        v = n.value
        if n.kind == "scalar" and n.plain and isinstance(v, str):
            with contextlib.suppress(ValueError):  # YAML 1.1 reads 5e-6 (no dot) as text
                v = float(v)
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        if not ok or v < 0 or (positive and v == 0):
            what = "a positive number" if positive else "a non-negative number"
            raise self.fail(n, f"expected {what}, got {_show(n)}")
        return float(v)

    def boolean(self, n: _Node) -> bool:
        if n.kind != "scalar" or not isinstance(n.value, bool):
            raise self.fail(n, f"expected true or false, got {_show(n)}")
        return n.value

    def text(self, n: _Node) -> str:
        if n.kind != "scalar" or not isinstance(n.value, str) or not n.value.strip():
            raise self.fail(n, f"expected a non-empty string, got {_show(n)}")
        return n.value

    def choice(self, n: _Node, choices: Collection[str], what: str = "") -> str:
        if n.kind != "scalar" or not isinstance(n.value, str) or n.value not in choices:
            hint = _suggest(n.value, choices) if isinstance(n.value, str) else ""
            hint = hint or f"; expected one of: {', '.join(choices)}"
            raise self.fail(n, f"unknown {what or 'value'} {_show(n)}{hint}")
        return n.value

    def names(self, n: _Node, choices: Collection[str] | None, what: str) -> list[str]:
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

    def backends(self, n: _Node) -> list[str]:
        if n.kind == "scalar" and n.value == "all":
            return list(self.known_backends)
        return self.names(n, self.known_backends, "backend")

    # ---- axes ----

    def head_padding(self, n: _Node) -> str:
        v = n.value
        if n.kind == "scalar" and isinstance(v, int) and not isinstance(v, bool):
            v = str(v)
        if n.kind != "scalar" or not isinstance(v, str) or v not in HEAD_PADDINGS:
            raise self.fail(n, f"expected one of engine, none, 64, 128, got {_show(n)}")
        return v

    def compress_ratio(self, n: _Node) -> int:
        v = n.value
        if n.kind != "scalar" or isinstance(v, bool) or v not in COMPRESS_RATIOS:
            raise self.fail(n, f"expected 0, 4 or 128, got {_show(n)}")
        return v

    def model(self, n: _Node) -> _Model:
        if n.kind == "scalar":
            name = self.choice(n, list(MODELS), "model")
            return _Model.builtin(MODELS[name])
        spec = self.expect_map(n, "a model name or a mapping of model dimensions")
        self.check_keys(n, _MODEL_KEYS, ("d_qk", "num_heads"))
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
            raise self.fail(n, "required key missing (or give a window)", _child(n.path, "topk"))
        default_layout = {576: "v32", 512: "v4"}.get(d_qk, "bf16")
        layout = self.choice(spec["layout"], LAYOUTS, "layout") if "layout" in spec else None
        layout = layout or default_layout
        need = LAYOUT_D_QK.get(layout)
        if need is not None and need != d_qk:
            where = spec.get("layout") or spec["d_qk"]
            raise self.fail(where, f"layout {layout} needs d_qk {need}, the model has {d_qk}")
        scale = spec.get("softmax_scale")
        return _Model(
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
class _Model:
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
    def builtin(cls, m: ModelConfig) -> _Model:
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


_MODEL_KEYS = (
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
class _Axis:
    parse: Callable[[_Parser, _Node], Any]
    integer: bool = False  # takes the range form {from, to, mul|step}
    minimum: int = 1


def _int_axis(minimum: int) -> _Axis:
    return _Axis(lambda p, n: p.integer(n, minimum), integer=True, minimum=minimum)


def _enum_axis(choices: Collection[str], what: str) -> _Axis:
    return _Axis(lambda p, n: p.choice(n, choices, what))


AXES: dict[str, _Axis] = {
    "op": _enum_axis(OPS, "op"),
    "model": _Axis(_Parser.model),
    "batch_size": _int_axis(1),
    "s_q": _int_axis(1),
    "tokens": _int_axis(1),
    "num_heads": _int_axis(1),
    "tp": _int_axis(1),
    "head_padding": _Axis(_Parser.head_padding),
    "topk": _int_axis(1),
    "extra_topk": _int_axis(0),
    "context_len": _int_axis(1),
    "page_size": _int_axis(1),
    "layout": _enum_axis(LAYOUTS, "layout"),
    "sink": _Axis(_Parser.boolean),
    "scale_convention": _enum_axis(SCALE_CONVENTIONS, "scale convention"),
    "route": _enum_axis(ROUTES, "route"),
    "compress_ratio": _Axis(_Parser.compress_ratio),
    "window": _int_axis(0),
}

TOP_KEYS = (
    "name",
    "description",
    "op",
    "model",
    "arch",
    "backends",
    "seed",
    "timing",
    "tolerance",
    "defaults",
    "sweep",
    "cases",
    "limit",
    "tags",
)
_ENTRY_KEYS = (*AXES, "tags", "backends")
_LIMIT_KEYS = ("axis", "lo", "hi", "backend", "tags", *AXES)
_RANGE_KEYS = ("from", "to", "mul", "step")

_Values = dict[str, list[tuple[Any, _Origin]]]  # axis -> the values it takes, with origins


@dataclass
class _Entry:
    """A `cases` or `limit` entry: its own axis values (lists sweep), tags and backends."""

    node: _Node
    values: _Values
    tags: list[str]
    backends: list[str] | None = None
    limit: tuple[str, int, int, str, _Origin, _Origin] | None = None  # axis lo hi backend


# ---- the shared value rules ----------------------------------------------------------------


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _problems(v: dict[str, Any]) -> list[tuple[str, str]] | None:
    """The first rule a case's fields break, as (field, message) candidates, each phrased for
    blaming that field; None when every rule holds."""
    if v["op"] not in OPS:
        return [("op", f"expected one of {', '.join(OPS)}, got {v['op']!r}")]
    for name in ("batch_size", "s_q", "num_heads", "topk", "context_len", "page_size"):
        if not _is_int(v[name]) or v[name] < 1:
            return [(name, f"expected a positive integer, got {v[name]!r}")]
    for name in ("d_qk", "d_v"):
        if not _is_int(v[name]) or v[name] < 1:
            return [(name, f"expected a positive integer, got {v[name]!r}"), ("model", "")]
    for name in ("tokens", "extra_topk", "window", "seed", "compress_ratio"):
        if not _is_int(v[name]) or v[name] < 0:
            return [(name, f"expected a non-negative integer, got {v[name]!r}")]
    layout = v["layout"]
    if layout not in LAYOUTS:
        return [("layout", f"expected one of {', '.join(LAYOUTS)}, got {layout!r}")]
    need = LAYOUT_D_QK.get(layout)
    if need is not None and v["d_qk"] != need:
        return [
            ("layout", f"layout {layout} needs d_qk {need}, the model has d_qk {v['d_qk']}"),
            ("model", f"model has d_qk {v['d_qk']}, layout {layout} needs {need}"),
        ]
    if v["d_v"] > v["d_qk"]:
        return [("d_v", f"expected d_v <= d_qk ({v['d_qk']}), got {v['d_v']}"), ("model", "")]
    scales = SCALES_BY_LAYOUT.get(layout, SCALE_CONVENTIONS)
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
    if pad.isdigit() and v["num_heads"] > int(pad):
        return [
            ("num_heads", f"expected at most head_padding ({pad}) heads, got {v['num_heads']}"),
            ("head_padding", f"pads to {pad} heads, fewer than num_heads ({v['num_heads']})"),
        ]
    if v["op"] == "prefill":
        if v["batch_size"] != 1:
            return [("batch_size", f"prefill takes one chunk of tokens, got {v['batch_size']}")]
        if v["s_q"] != 1:
            return [("s_q", f"prefill queries are tokens, not s_q; got {v['s_q']}")]
        if v["tokens"] < 1:
            return [("tokens", f"expected a positive integer, got {v['tokens']}")]
        if v["tokens"] > v["context_len"]:
            return _pair("tokens", "<=", "context_len", v)
        if v["route"] not in ROUTES:
            return [("route", f"expected one of {', '.join(ROUTES)}, got {v['route']!r}")]
    elif v["op"] == "indexer":
        problems = _indexer_problems(v)
        if problems:
            return problems
    else:
        if v["tokens"] != 0:
            return [("tokens", f"only prefill has tokens; this is a {v['op']} case")]
        if v["route"] != ROUTES[0]:
            return [("route", f"only prefill has a route; this is a {v['op']} case")]
    if v["topk"] > v["context_len"] and v["op"] != "indexer":  # the indexer pads with -1
        return _pair("topk", "<=", "context_len", v)
    if v["window"] and v["topk"] > v["window"]:
        return _pair("topk", "<=", "window", v, why="the main-cache indices are the window: ")
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


def _indexer_problems(v: dict[str, Any]) -> list[tuple[str, str]] | None:
    """Rules of an indexer case: a paged batch (tokens 0) or one ragged chunk of tokens."""
    if v["tokens"]:
        for key in ("batch_size", "s_q"):
            if v[key] != 1:
                return [(key, f"an indexer chunk (tokens > 0) is one request: expected {key} 1")]
        if v["tokens"] > v["context_len"]:
            return _pair("tokens", "<=", "context_len", v)
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


def validate_case(case: Case) -> str | None:
    """None if a Case built in code obeys the scenario rules, else `field: what was expected`."""
    if not isinstance(case, Case):
        return f"expected a Case, got {type(case).__name__}"
    if not isinstance(case.model, str) or not case.model:
        return f"model: expected a model name, got {case.model!r}"
    if not isinstance(case.scenario, str):
        return f"scenario: expected a string, got {case.scenario!r}"
    problems = _problems(case.params())
    if problems:
        name, message = problems[0]
        return f"{name}: {message}"
    t = case.timing
    if not _is_int(t.warmup) or t.warmup < 0:
        return f"timing.warmup: expected a non-negative integer, got {t.warmup!r}"
    if not _is_int(t.iters) or t.iters < 1:
        return f"timing.iters: expected a positive integer, got {t.iters!r}"
    if not isinstance(t.flush_l2, bool):
        return f"timing.flush_l2: expected true or false, got {t.flush_l2!r}"
    if t.timer not in TIMERS:
        return f"timing.timer: expected one of {', '.join(TIMERS)}, got {t.timer!r}"
    if not _positive_number(t.timeout_s):
        return f"timing.timeout_s: expected a positive number, got {t.timeout_s!r}"
    for name in ("cos_diff", "lse_abs"):
        x = getattr(case.tolerance, name)
        if not (_positive_number(x) or x == 0):
            return f"tolerance.{name}: expected a non-negative number, got {x!r}"
    if not all(isinstance(tag, str) and tag for tag in case.tags):
        return f"tags: expected non-empty strings, got {case.tags!r}"
    return None


def _positive_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


# ---- the scenario walk ---------------------------------------------------------------------


class _Loader(_Parser):
    def values(self, n: _Node, axis: str, rank: int) -> list[tuple[Any, _Origin]]:
        """One value, a list of values, or (for integer axes) a range form."""
        spec = AXES[axis]
        if n.kind == "seq":
            if not n.value:
                raise self.fail(n, "expected a non-empty list of values, got an empty list")
            out: list[tuple[Any, _Origin]] = []
            for item in n.value:
                value = spec.parse(self, item)
                for j, (seen, _) in enumerate(out):
                    if seen == value:
                        raise self.fail(item, f"duplicate value {_show(item)} (also at [{j}])")
                out.append((value, _Origin(item.line, item.path, rank)))
            return out
        if n.kind == "map" and spec.integer:
            return self.range_form(n, spec, rank)
        return [(spec.parse(self, n), _Origin(n.line, n.path, rank))]

    def range_form(self, n: _Node, spec: _Axis, rank: int) -> list[tuple[Any, _Origin]]:
        self.check_keys(n, _RANGE_KEYS, ("from", "to"))
        m = n.value
        if ("mul" in m) == ("step" in m):
            raise self.fail(n, "a range takes exactly one of mul or step")
        start = self.integer(m["from"], spec.minimum)
        stop = self.integer(m["to"], spec.minimum)
        if stop < start:
            raise self.fail(m["to"], f"expected to >= from ({start}), got {stop}")
        if "mul" in m:
            mul = self.integer(m["mul"], 2)
            if start < 1:
                raise self.fail(m["from"], "a range with mul needs from >= 1, got 0")
            values = []
            v = start
            while v <= stop and len(values) <= MAX_CASES:
                values.append(v)
                v *= mul
        else:
            step = self.integer(m["step"], 1)
            if (stop - start) // step >= MAX_CASES:
                raise self.fail(n, f"a range of more than {MAX_CASES} values")
            values = list(range(start, stop + 1, step))
        return [(v, _Origin(n.line, _child(n.path, i), rank)) for i, v in enumerate(values)]

    def single(self, n: _Node, axis: str, rank: int) -> tuple[Any, _Origin]:
        if n.kind == "seq" or (n.kind == "map" and AXES[axis].integer):
            raise self.fail(n, f"expected one value, got {_show(n)}; sweep values under sweep")
        return AXES[axis].parse(self, n), _Origin(n.line, n.path, rank)

    def entry(self, n: _Node, *, limit: bool) -> _Entry:
        self.expect_map(n)
        m = n.value
        found = _Entry(n, {}, [])
        for key, child in m.items():  # in file order, so the first error is the first line
            self.known_key(n, key, _LIMIT_KEYS if limit else _ENTRY_KEYS)
            if key in AXES:
                found.values[key] = self.values(child, key, 3)
            elif key == "tags":
                found.tags = self.names(child, None, "tag")
            elif key == "backends":
                found.backends = self.backends(child)
            elif key == "axis":
                self.choice(child, LIMIT_AXES, "limit axis (a size axis)")
            elif key in ("lo", "hi"):
                self.integer(child, 1)
            elif key == "backend":
                self.choice(child, self.known_backends, "backend")
        if limit:
            self.check_keys(n, _LIMIT_KEYS, ("axis", "lo", "hi", "backend"))
            axis, lo, hi = m["axis"].value, m["lo"].value, m["hi"].value
            if lo >= hi:
                raise self.fail(m["hi"], f"expected hi > lo ({lo}), got {hi}")
            if axis in found.values:
                raise ScenarioError(
                    self.file,
                    n.key_lines[axis],
                    _child(n.path, axis),
                    f"{axis} is the limit axis; the search sets it (from lo to hi)",
                )
            lo_at = _Origin(m["lo"].line, m["lo"].path, 4)
            hi_at = _Origin(m["hi"].line, m["hi"].path, 4)
            found.limit = (axis, lo, hi, m["backend"].value, lo_at, hi_at)
        return found

    def timing(self, n: _Node) -> Timing:
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
            timer=self.choice(m["timer"], TIMERS, "timer") if "timer" in m else t.timer,
            timeout_s=self.number(timeout, positive=True) if timeout else t.timeout_s,
        )

    def tolerance(self, n: _Node) -> Tolerance:
        self.expect_map(n)
        self.check_keys(n, ("cos_diff", "lse_abs"))
        m, t = n.value, Tolerance()
        return Tolerance(
            cos_diff=self.number(m["cos_diff"], positive=False) if "cos_diff" in m else t.cos_diff,
            lse_abs=self.number(m["lse_abs"], positive=False) if "lse_abs" in m else t.lse_abs,
        )

    # ---- the whole file ----

    def scenario(self, root: _Node) -> Scenario:
        top = self.expect_map(root, "a mapping of scenario keys")
        name, description, seed = "", "", 0
        arch, backends, tags = list(ARCHS), None, []
        timing, tolerance = Timing(), Tolerance()
        base: dict[str, tuple[Any, _Origin]] = {}
        defaults: dict[str, tuple[Any, _Origin]] = {}
        sweep: _Values = {}
        entries: list[_Entry] | None = None
        limits: list[_Entry] = []
        for key, n in top.items():  # file order: the first error reported is the first line's
            self.known_key(root, key, TOP_KEYS)
            if key == "name":
                name = self.text(n)
                if not _NAME_RE.match(name):
                    raise self.fail(n, f"expected letters, digits and _ . - /, got {name!r}")
            elif key == "description":
                if n.kind != "scalar" or not isinstance(n.value, str):
                    raise self.fail(n, f"expected a string, got {_show(n)}")
                description = n.value.strip()
            elif key in ("op", "model"):
                base[key] = self.single(n, key, 1)
            elif key == "arch":
                arch = self.names(n, ARCHS, "arch")
            elif key == "backends":
                backends = self.backends(n)
            elif key == "seed":
                seed = self.integer(n, 0)
            elif key == "timing":
                timing = self.timing(n)
            elif key == "tolerance":
                tolerance = self.tolerance(n)
            elif key == "tags":
                tags = self.names(n, None, "tag")
            elif key == "defaults":
                self.expect_map(n, "a mapping of axis: value")
                for k, c in n.value.items():
                    self.known_key(n, k, AXES)
                    defaults[k] = self.single(c, k, 2)
            elif key == "sweep":
                self.expect_map(n, "a mapping of axis: values")
                if not n.value:
                    raise self.fail(n, "expected at least one axis, got an empty mapping")
                for k, c in n.value.items():
                    self.known_key(n, k, AXES)
                    sweep[k] = self.values(c, k, 3)
            elif key == "cases":
                if n.kind != "seq" or not n.value:
                    raise self.fail(n, f"expected a non-empty list of mappings, got {_show(n)}")
                entries = [self.entry(c, limit=False) for c in n.value]
            elif key == "limit":
                items = n.value if n.kind == "seq" else [n]
                if not items:
                    raise self.fail(n, "expected a mapping (or a list of them), got an empty list")
                limits = [self.entry(c, limit=True) for c in items]
        if "name" not in top:
            raise self.fail(root, "required key missing", "name")
        if backends is None:
            raise self.fail(root, "required key missing (a list, or all)", "backends")

        # An axis takes its values in one place: the sweep, or each entry, not both.
        for e in [*(entries or []), *limits]:
            for axis in e.values:
                if axis in sweep:
                    line = sweep[axis][0][1].line
                    raise ScenarioError(
                        self.file,
                        e.node.key_lines[axis],
                        _child(e.node.path, axis),
                        f"{axis} is also swept (line {line}); set it in one place",
                    )
        for e in limits:
            axis = e.limit[0]
            if axis in sweep:
                raise self.fail(
                    e.node.value["axis"],
                    f"{axis} is swept (line {sweep[axis][0][1].line}); the search varies it itself",
                )

        n_sweep = math.prod(len(v) for v in sweep.values())
        total = sum(math.prod(len(v) for v in e.values.values()) for e in entries or [])
        if n_sweep * max(total, 1) > MAX_CASES:
            where = top.get("sweep") or top.get("cases")
            raise self.fail(where, f"expands to {n_sweep * max(total, 1)} cases, over {MAX_CASES}")

        common = dict(name=name, seed=seed, timing=timing, tolerance=tolerance, tags=tags)
        sweep_points = _product(sweep)
        if entries is None:  # a lone limit search runs no plain cases
            entries = [] if limits and not sweep else [_Entry(root, {}, [])]

        cases: dict[str, Case] = {}
        case_backends: dict[str, tuple[str, ...]] = {}
        for e in entries:
            for own in _product(e.values):
                for point in sweep_points:
                    merged = {**base, **defaults, **own, **point}
                    case = self.resolve(merged, e, common)
                    chosen = tuple(e.backends if e.backends is not None else backends)
                    if case.case_id in cases:  # the same point twice runs once, with both lists
                        old = cases[case.case_id]
                        case = replace(case, tags=_unique(old.tags + case.tags))
                        chosen = _unique(case_backends.get(case.case_id, ()) + chosen)
                    cases[case.case_id] = case
                    case_backends[case.case_id] = chosen

        searches: dict[tuple[str, str], LimitSearch] = {}
        for e in limits:
            axis, lo, hi, backend, lo_at, hi_at = e.limit
            for own in _product(e.values):
                for point in sweep_points:
                    merged = {**base, **defaults, **own, **point}
                    case = self.resolve({**merged, axis: (lo, lo_at)}, e, common)
                    self.resolve({**merged, axis: (hi, hi_at)}, e, common)
                    search = LimitSearch(axis, lo, hi, backend, case)
                    searches.setdefault((search.limit_id, search.backend), search)

        ops = sorted({c.op for c in cases.values()} | {s.base.op for s in searches.values()})
        op = base["op"][0] if "op" in base else (ops[0] if len(ops) == 1 else "mixed")
        return Scenario(
            name=name,
            description=description,
            op=op,
            arch=arch,
            backends=list(backends),
            cases=list(cases.values()),
            limits=list(searches.values()),
            source=self.file,
            tags=tags,
            case_backends={k: v for k, v in case_backends.items() if v != tuple(backends)},
        )

    def resolve(self, merged: dict[str, tuple[Any, _Origin]], e: _Entry, common: dict) -> Case:
        """One point: model defaults, then explicit values; then every rule, blaming the most
        specific value involved."""
        site = _Origin(e.node.line, e.node.path, 0)
        for key in ("op", "model"):
            if key not in merged:
                where = "at the top level, in defaults or in each case"
                message = f"required key missing: set {key} {where}"
                raise self.fail(site, message, _child(site.path, key))
        model: _Model = merged["model"][0]
        model_at = merged["model"][1]
        op = merged["op"][0]
        explicit = {k: v for k, (v, _) in merged.items()}
        origins = {k: o for k, (_, o) in merged.items()}
        tags = list(common["tags"]) + e.tags

        if "tp" in merged:
            tp, tp_at = merged["tp"]
            if "num_heads" in merged:
                heads_at = merged["num_heads"][1]
                blame = tp_at if tp_at.rank >= heads_at.rank else heads_at
                other = heads_at if blame is tp_at else tp_at
                which = "tp" if blame is tp_at else "num_heads"
                message = f"give tp or num_heads, not both ({which} also at line {other.line})"
                raise self.fail(blame, message)
            if model.num_heads % tp:
                heads = f"{model.name}'s {model.num_heads} heads"
                raise self.fail(tp_at, f"tp {tp} does not divide {heads}")
            explicit["num_heads"] = model.num_heads // tp
            origins["num_heads"] = tp_at
            tags.append(f"tp{tp}")
        if op != "prefill":
            for key in ("tokens", "route") if op != "indexer" else ("route",):
                if key in merged:
                    raise self.fail(origins[key], f"only prefill has {key}; this is a {op} case")
        else:
            for key in ("batch_size", "s_q"):
                if key in merged and explicit[key] != 1:
                    got = explicit[key]
                    message = f"prefill takes one chunk of tokens: expected {key} 1, got {got}"
                    raise self.fail(origins[key], message)
        layout = explicit.get("layout", model.layout)
        if layout == "bf16" and "scale_convention" in merged:
            message = "bf16 rows have no scales; leave scale_convention unset"
            raise self.fail(origins["scale_convention"], message)

        context_len = explicit.get("context_len", DEFAULT_CONTEXT_LEN)
        window = explicit.get("window", model.window)
        ratio = explicit.get("compress_ratio", model.compress_ratio)
        if ratio == 0:
            extra = 0
        elif ratio == 4 and model.index_topk:
            extra = min(model.index_topk, context_len // ratio)
        else:  # C128, or C4 without an indexer: every visible compressed entry
            extra = context_len // ratio
        v = dict(
            op=op,
            model=model.name,
            d_qk=model.d_qk,
            d_v=model.d_v,
            softmax_scale=model.softmax_scale,
            num_heads=explicit.get("num_heads", model.num_heads),
            head_padding=explicit.get("head_padding", "engine"),
            batch_size=explicit.get("batch_size", 1),
            s_q=explicit.get("s_q", 1),
            tokens=explicit.get("tokens", DEFAULT_PREFILL_TOKENS if op == "prefill" else 0),
            topk=explicit.get("topk", min(window or model.topk, context_len)),
            extra_topk=explicit.get("extra_topk", extra),
            context_len=context_len,
            page_size=explicit.get("page_size", model.page_size),
            layout=layout,
            sink=explicit.get("sink", model.sink),
            scale_convention=explicit.get("scale_convention", _default_scale(layout)),
            route=explicit.get("route", ROUTES[0]),
            window=window,
            compress_ratio=ratio,
            seed=common["seed"],
        )
        if op == "indexer":  # the indexer's own heads, top-k and key cache, not attention's
            v.update({k: d for k, d in indexer_case.defaults(model).items() if k not in explicit})
        problems = _problems(v)
        if problems:
            ranked = [
                (origins[f].rank if f in origins else -1, -i, f, m)
                for i, (f, m) in enumerate(problems)
                if m
            ]
            _, _, name, message = max(ranked)
            where = origins.get(name) or (model_at if name == "model" else None)
            if where is None:  # a value derived from the model: blame the model
                name, message = problems[0]
                raise self.fail(model_at, f"{name} from model {model.name}: {message}")
            raise self.fail(where, message)
        return Case(
            scenario=common["name"],
            timing=common["timing"],
            tolerance=common["tolerance"],
            tags=_unique(tuple(tags)),
            **v,
        )


def _product(values: _Values) -> list[dict[str, tuple[Any, _Origin]]]:
    """Cartesian product in key order; the last axis varies fastest."""
    keys = list(values)
    combos = itertools.product(*(values[k] for k in keys))
    return [dict(zip(keys, combo, strict=True)) for combo in combos]


def _default_scale(layout: str) -> str:
    return "pow2" if layout == "v32" else "flashmla"


def _pair(a: str, rel: str, b: str, v: dict, why: str = "") -> list[tuple[str, str]]:
    """Candidates for a broken `a <= b`: phrased for blaming a, then b."""
    flip = {"<=": ">="}[rel]
    return [
        (a, f"{why}expected {a} {rel} {b} ({v[b]}), got {v[a]}"),
        (b, f"{why}expected {b} {flip} {a} ({v[a]}), got {v[b]}"),
    ]


def _unique(items: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


# ---- public API ----------------------------------------------------------------------------


def load_text(
    text: str, filename: str = "<string>", *, known_backends: Collection[str]
) -> Scenario:
    """Parse, validate and expand a scenario given as text (`filename` only labels errors)."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else 1
        problem = " ".join(p for p in (e.context, e.problem) if p)
        raise ScenarioError(filename, line, "(yaml)", f"invalid YAML: {problem}") from None
    except yaml.YAMLError as e:
        raise ScenarioError(filename, 1, "(yaml)", f"invalid YAML: {e}") from None
    if node is None:
        message = "expected a mapping of scenario keys, got an empty file"
        raise ScenarioError(filename, 1, "(top)", message)
    root = _Reader(filename).read(node, "")
    return _Loader(filename, known_backends).scenario(root)


def load(path: str | Path, *, known_backends: Collection[str]) -> Scenario:
    """Parse, validate and expand one scenario file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ScenarioError(str(path), 1, "(file)", f"cannot read: {e}") from None
    return load_text(text, str(path), known_backends=known_backends)


def expand(scenario: Scenario) -> list[Case]:
    """The scenario's cases in order (expansion and validation already happened in load)."""
    return list(scenario.cases)


def discover(root: str | Path) -> list[Path]:
    """Scenario files under a directory (recursively), sorted; a file is returned as is."""
    root = Path(root)
    if root.is_file():
        return [root]
    return sorted(p for p in root.rglob("*.yaml") if p.is_file())
