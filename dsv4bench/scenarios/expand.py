"""Scenario files, step 3: a validated tree -> Scenario: defaults, sweeps, case and limit
entries expanded into Cases (each checked by the rules, blaming the most specific value).
"""

from __future__ import annotations

import glob
import itertools
import math
import re
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dsv4bench.cases import indexer_case
from dsv4bench.cases.case import (
    ARCHS,
    ROUTES,
    WORKLOAD_DEFAULTS,
    Case,
    Timing,
    Tolerance,
)
from dsv4bench.scenarios import batch_entry
from dsv4bench.scenarios.read import (
    Node,
    Origin,
    ScenarioError,
    key_path,
    parse,
    read_text,
    show_value,
)
from dsv4bench.scenarios.rules import (
    AXES,
    DEFAULT_CONTEXT_LEN,
    DEFAULT_PREFILL_TOKENS,
    LIMIT_AXES,
    Axis,
    ModelSpec,
    Parser,
    case_problems,
)
from dsv4bench.scenarios.scenario import LimitSearch, Scenario
from dsv4bench.scenarios.sizes import size_problems
from dsv4bench.scenarios.workloads import workload_fields
from reference.layout_table import LAYOUTS as LAYOUT_TABLE

MAX_CASES = 100_000  # a guard against a typo that multiplies sweeps into millions
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-/]*$")


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
    "include",
)
ENTRY_KEYS = (*AXES, "tags", "backends")
LIMIT_KEYS = ("axis", "lo", "hi", "step", "probe", "backend", "tags", *AXES)
RANGE_KEYS = ("from", "to", "mul", "step")

Values = dict[str, list[tuple[Any, Origin]]]  # axis -> the values it takes, with origins


@dataclass
class Entry:
    """A `cases` or `limit` entry: its own axis values (lists sweep), tags and backends."""

    node: Node
    values: Values
    tags: list[str]
    backends: list[str] | None = None
    limit: tuple[str, int, int, str, Origin, Origin] | None = None  # axis lo hi backend
    step: int = 1  # a limit entry's resolution
    probe: tuple[int, ...] = ()  # a limit entry's values probed inside (lo, hi)


@dataclass
class TopLevel:
    """A scenario file's top-level keys, checked (see docs/scenarios.md)."""

    nodes: dict[str, Node]
    name: str = ""
    description: str = ""
    seed: int = 0
    arch: list[str] = field(default_factory=lambda: list(ARCHS))
    backends: list[str] | None = None
    timing: Timing = field(default_factory=Timing)
    tolerance: Tolerance = field(default_factory=Tolerance)
    tags: list[str] = field(default_factory=list)
    base: dict[str, tuple[Any, Origin]] = field(default_factory=dict)  # top-level op, model
    defaults: dict[str, tuple[Any, Origin]] = field(default_factory=dict)
    sweep: Values = field(default_factory=dict)
    entries: list[Entry] | None = None
    limits: list[Entry] = field(default_factory=list)
    include: list[Scenario] = field(default_factory=list)  # files whose cases this one runs


class ScenarioLoader(Parser):
    def values(self, n: Node, axis: str, rank: int) -> list[tuple[Any, Origin]]:
        """One value, a list of values, or (for integer axes) a range form."""
        spec = AXES[axis]
        if n.kind == "seq":
            if not n.value:
                raise self.fail(n, "expected a non-empty list of values, got an empty list")
            out: list[tuple[Any, Origin]] = []
            for item in n.value:
                value = spec.parse(self, item)
                for j, (seen, _) in enumerate(out):
                    if seen == value:
                        raise self.fail(item, f"duplicate value {show_value(item)} (also at [{j}])")
                out.append((value, Origin(item.line, item.path, rank)))
            return out
        if n.kind == "map" and spec.integer:
            return self.range_form(n, spec, rank)
        return [(spec.parse(self, n), Origin(n.line, n.path, rank))]

    def range_form(self, n: Node, spec: Axis, rank: int) -> list[tuple[Any, Origin]]:
        self.check_keys(n, RANGE_KEYS, ("from", "to"))
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
        return [(v, Origin(n.line, key_path(n.path, i), rank)) for i, v in enumerate(values)]

    def single(self, n: Node, axis: str, rank: int) -> tuple[Any, Origin]:
        if n.kind == "seq" or (n.kind == "map" and AXES[axis].integer):
            raise self.fail(n, f"expected one value, got {show_value(n)}; sweep values under sweep")
        return AXES[axis].parse(self, n), Origin(n.line, n.path, rank)

    def entry(self, n: Node, *, limit: bool) -> Entry:
        self.expect_map(n)
        m = n.value
        found = Entry(n, {}, [])
        for key, child in m.items():  # in file order, so the first error is the first line
            self.known_key(n, key, LIMIT_KEYS if limit else ENTRY_KEYS)
            if key in AXES:
                found.values[key] = self.values(child, key, 3)
            elif key == "tags":
                found.tags = self.names(child, None, "tag")
            elif key == "backends":
                found.backends = self.backends(child)
            elif key == "axis":
                self.choice(child, LIMIT_AXES, "limit axis (a size axis)")
            elif key in ("lo", "hi", "step"):
                self.integer(child, 1)
            elif key == "backend":  # a name, or an instance of its own ({name, as, OPTION})
                if child.kind == "map":
                    backend = self.instance(child)
                else:
                    backend = self.choice(child, [*self.known_backends, *self.instances], "backend")
        if limit:
            self.check_keys(n, LIMIT_KEYS, ("axis", "lo", "hi", "backend"))
            axis, lo, hi = m["axis"].value, m["lo"].value, m["hi"].value
            if lo >= hi:
                raise self.fail(m["hi"], f"expected hi > lo ({lo}), got {hi}")
            if axis in found.values:
                raise ScenarioError(
                    self.file,
                    n.key_lines[axis],
                    key_path(n.path, axis),
                    f"{axis} is the limit axis; the search sets it (from lo to hi)",
                )
            lo_at = Origin(m["lo"].line, m["lo"].path, 4)
            hi_at = Origin(m["hi"].line, m["hi"].path, 4)
            found.limit = (axis, lo, hi, backend, lo_at, hi_at)
            found.step = m["step"].value if "step" in m else 1
            if "step" in m and found.step >= hi - lo:  # hi = lo + 1 needs no step
                raise self.fail(m["step"], f"expected step < hi - lo ({hi - lo}), got {found.step}")
            if "probe" in m:
                found.probe = self.inside(m["probe"], lo, hi)
        return found

    def inside(self, n: Node, lo: int, hi: int) -> tuple[int, ...]:
        """A limit entry's `probe`: one integer or a list, each strictly between lo and hi."""
        items = n.value if n.kind == "seq" else [n]
        if not items:
            raise self.fail(
                n, f"expected a value or a list of values between lo ({lo}) and hi ({hi})"
            )
        values = []
        for item in items:
            v = self.integer(item, 1)
            if not lo < v < hi:
                raise self.fail(item, f"expected a probe between lo ({lo}) and hi ({hi}), got {v}")
            values.append(v)
        return tuple(sorted(set(values)))

    # ---- the whole file ----

    def scenario(self, root: Node) -> Scenario:
        top = self.top_level(root)
        self.check_axes_set_once(top)
        common = dict(
            name=top.name, seed=top.seed, timing=top.timing, tolerance=top.tolerance, tags=top.tags
        )
        sweep_points = product_of(top.sweep)
        entries = top.entries
        if entries is None:  # a lone limit search (or include) runs no plain cases of its own
            alone = (top.limits or top.include) and not top.sweep
            entries = [] if alone else [Entry(root, {}, [])]
        cases, case_backends = self.expand_cases(top, entries, sweep_points, common)
        self.add_included(top, cases, case_backends)
        searches = self.expand_limits(top, sweep_points, common)
        ops = sorted({c.op for c in cases.values()} | {s.base.op for s in searches.values()})
        op = top.base["op"][0] if "op" in top.base else (ops[0] if len(ops) == 1 else "mixed")
        return Scenario(
            name=top.name,
            description=top.description,
            op=op,
            arch=top.arch,
            backends=list(top.backends),
            cases=list(cases.values()),
            limits=list(searches.values()),
            source=self.file,
            tags=top.tags,
            case_backends={k: v for k, v in case_backends.items() if v != tuple(top.backends)},
            instances=[e for e in self.instances.values() if e["name"] != e["base"]],
            included=[sc.source for sc in top.include],
        )

    def top_level(self, root: Node) -> TopLevel:
        """The top-level keys, each checked, in file order (the first error is the first line's)."""
        top = TopLevel(self.expect_map(root, "a mapping of scenario keys"))
        for key, n in top.nodes.items():
            self.known_key(root, key, TOP_KEYS)
            if key == "name":
                top.name = self.text(n)
                if not NAME_RE.match(top.name):
                    raise self.fail(n, f"expected letters, digits and _ . - /, got {top.name!r}")
            elif key == "description":
                if n.kind != "scalar" or not isinstance(n.value, str):
                    raise self.fail(n, f"expected a string, got {show_value(n)}")
                top.description = n.value.strip()
            elif key in ("op", "model"):
                top.base[key] = self.single(n, key, 1)
            elif key == "arch":
                top.arch = self.names(n, ARCHS, "arch")
            elif key == "backends":
                top.backends = self.backends(n)
            elif key == "seed":
                top.seed = self.integer(n, 0)
            elif key == "timing":
                top.timing = self.timing(n)
            elif key == "tolerance":
                top.tolerance = self.tolerance(n)
            elif key == "tags":
                top.tags = self.names(n, None, "tag")
            elif key in ("defaults", "sweep"):
                self.axis_map(n, key, top)
            elif key == "cases":
                if n.kind != "seq" or not n.value:
                    what = f"expected a non-empty list of mappings, got {show_value(n)}"
                    raise self.fail(n, what)
                top.entries = [self.entry(c, limit=False) for c in n.value]
            elif key == "include":
                top.include = self.included(n)
            elif key == "limit":
                items = n.value if n.kind == "seq" else [n]
                if not items:
                    raise self.fail(n, "expected a mapping (or a list of them), got an empty list")
                top.limits = [self.entry(c, limit=True) for c in items]
        if "name" not in top.nodes:
            raise self.fail(root, "required key missing", "name")
        if top.backends is None:
            raise self.fail(root, "required key missing (a list, or all)", "backends")
        return top

    def included(self, n: Node) -> list[Scenario]:
        """`include`: scenario files (paths or globs relative to this file's folder), loaded
        and checked on their own; their cases run here (see add_included)."""
        here = Path(self.file).resolve().parent
        found: list[Scenario] = []
        seen: set[Path] = set()
        for item, pattern in zip(
            n.value if n.kind == "seq" else [n], self.names(n, None, "file"), strict=True
        ):
            paths = sorted(here.glob(pattern)) if glob.has_magic(pattern) else [here / pattern]
            paths = [p for p in paths if p.is_file()]
            if not paths:
                raise self.fail(item, f"{pattern!r} names no file under {here}")
            for path in (p.resolve() for p in paths):
                if path == Path(self.file).resolve():
                    raise self.fail(item, f"{pattern!r} names this file itself")
                if path in seen:
                    continue
                seen.add(path)
                known = self.known_options or self.known_backends
                sc = load(path, known_backends=known)  # its own errors name its own lines
                if sc.included:
                    raise self.fail(item, f"{path.name} includes files too; includes do not nest")
                found.append(sc)
        return found

    def add_included(self, top: TopLevel, cases: dict, case_backends: dict) -> None:
        """The included files' cases as their files define them (sizes, timing, tolerance,
        seed, tags, plus their scenario's name as a tag), after this file's own, on this file's
        backends; their limit searches and per-entry backends are not taken."""
        for sc in top.include:
            for case in sc.cases:
                tags = unique((*case.tags, sc.name, *top.tags))
                case = replace(case, scenario=top.name, tags=tags)
                chosen = tuple(top.backends)
                if case.case_id in cases:  # in two files, or also an own point: it runs once
                    case = replace(case, tags=unique(cases[case.case_id].tags + case.tags))
                    chosen = unique(case_backends[case.case_id] + chosen)
                cases[case.case_id] = case
                case_backends[case.case_id] = chosen

    def axis_map(self, n: Node, key: str, top: TopLevel) -> None:
        """`defaults` (axis: one value) or `sweep` (axis: values)."""
        if key == "defaults":
            self.expect_map(n, "a mapping of axis: value")
        else:
            self.expect_map(n, "a mapping of axis: values")
            if not n.value:
                raise self.fail(n, "expected at least one axis, got an empty mapping")
        for k, c in n.value.items():
            self.known_key(n, k, AXES)
            if key == "defaults":
                top.defaults[k] = self.single(c, k, 2)
            else:
                top.sweep[k] = self.values(c, k, 3)

    def check_axes_set_once(self, top: TopLevel) -> None:
        """An axis takes its values in one place: the sweep, or each entry, not both; and the
        expansion stays under MAX_CASES."""
        sweep = top.sweep
        for e in [*(top.entries or []), *top.limits]:
            for axis in e.values:
                if axis in sweep:
                    line = sweep[axis][0][1].line
                    raise ScenarioError(
                        self.file,
                        e.node.key_lines[axis],
                        key_path(e.node.path, axis),
                        f"{axis} is also swept (line {line}); set it in one place",
                    )
        for e in top.limits:
            axis = e.limit[0]
            if axis in sweep:
                raise self.fail(
                    e.node.value["axis"],
                    f"{axis} is swept (line {sweep[axis][0][1].line}); the search varies it itself",
                )
        n_sweep = math.prod(len(v) for v in sweep.values())
        total = sum(math.prod(len(v) for v in e.values.values()) for e in top.entries or [])
        if n_sweep * max(total, 1) > MAX_CASES:
            where = top.nodes.get("sweep") or top.nodes.get("cases")
            raise self.fail(where, f"expands to {n_sweep * max(total, 1)} cases, over {MAX_CASES}")

    def expand_cases(self, top: TopLevel, entries: list[Entry], sweep_points, common: dict):
        """case_id -> Case, and case_id -> its backends, in file order."""
        cases: dict[str, Case] = {}
        case_backends: dict[str, tuple[str, ...]] = {}
        for e in entries:
            for own in product_of(e.values):
                for point in sweep_points:
                    merged = {**top.base, **top.defaults, **own, **point}
                    for part, tags in batch_entry.expand(self, merged):
                        case = self.resolve(part, replace(e, tags=[*e.tags, *tags]), common)
                        chosen = tuple(e.backends if e.backends is not None else top.backends)
                        if case.case_id in cases:  # the same point twice runs once, both lists
                            old = cases[case.case_id]
                            case = replace(case, tags=unique(old.tags + case.tags))
                            chosen = unique(case_backends.get(case.case_id, ()) + chosen)
                        cases[case.case_id] = case
                        case_backends[case.case_id] = chosen
        return cases, case_backends

    def expand_limits(self, top: TopLevel, sweep_points, common: dict) -> dict:
        """(limit_id, backend) -> LimitSearch."""
        searches: dict[tuple[str, str], LimitSearch] = {}
        for e in top.limits:
            axis, lo, hi, backend, lo_at, hi_at = e.limit
            for own in product_of(e.values):
                for point in sweep_points:
                    merged = {**top.base, **top.defaults, **own, **point}
                    if "batch_spec" in merged:
                        why = "a limit search varies one case; batch_spec names a whole batch"
                        raise self.fail(merged["batch_spec"][1], why)
                    case = self.resolve({**merged, axis: (lo, lo_at)}, e, common)
                    # hi is expected to fail: it may exceed any GPU (no size check)
                    self.resolve({**merged, axis: (hi, hi_at)}, e, common, sized=False)
                    search = LimitSearch(axis, lo, hi, backend, case, e.step, e.probe)
                    searches.setdefault((search.limit_id, search.backend), search)
        return searches

    def heads_per_rank(self, merged: dict[str, tuple[Any, Origin]], model: ModelSpec) -> int:
        """num_heads from `tp`: the model's heads split over tp ranks (never both given)."""
        tp, tp_at = merged["tp"]
        if "num_heads" in merged:
            heads_at = merged["num_heads"][1]
            blame = tp_at if tp_at.rank >= heads_at.rank else heads_at
            other = heads_at if blame is tp_at else tp_at
            which = "num_heads" if blame is tp_at else "tp"  # the key of the other line
            message = f"give tp or num_heads, not both ({which} also at line {other.line})"
            raise self.fail(blame, message)
        if model.num_heads % tp:
            heads = f"{model.name}'s {model.num_heads} heads"
            raise self.fail(tp_at, f"tp {tp} does not divide {heads}")
        return model.num_heads // tp

    def check_op_keys(self, op: str, merged: dict[str, tuple[Any, Origin]]) -> None:
        """Only prefill has tokens and a route; prefill has one chunk (batch_size, s_q 1)."""
        if op != "prefill":
            # indexer, topk: a ragged chunk; remap, dequant: vLLM's prefill workspace forms
            tokened = ("indexer", "topk", "remap", "dequant")
            keys = ("route",) if op in tokened else ("tokens", "route")
            for key in keys:
                if key in merged:
                    forms = " (and remap, dequant: vLLM's prefill workspace forms)"
                    also = forms if key == "tokens" else ""
                    message = f"only prefill has {key}{also}; this is a {op} case"
                    raise self.fail(merged[key][1], message)
            return
        for key in ("batch_size", "s_q"):
            if key in merged and merged[key][0] != 1:
                got = merged[key][0]
                message = f"prefill takes one chunk of tokens: expected {key} 1, got {got}"
                raise self.fail(merged[key][1], message)

    def resolve(
        self, merged: dict[str, tuple[Any, Origin]], e: Entry, common: dict, *, sized: bool = True
    ) -> Case:
        """One point: model defaults, then explicit values; then every rule, blaming the most
        specific value involved (`sized`: also that it fits in a GPU, scenarios.sizes)."""
        site = Origin(e.node.line, e.node.path, 0)
        for key in ("op", "model"):
            if key not in merged:
                where = "at the top level, in defaults or in each case"
                message = f"required key missing: set {key} {where}"
                raise self.fail(site, message, key_path(site.path, key))
        model: ModelSpec = merged["model"][0]
        model_at = merged["model"][1]
        op = merged["op"][0]
        explicit = {k: v for k, (v, _) in merged.items()}
        origins = {k: o for k, (_, o) in merged.items()}
        tags = list(common["tags"]) + e.tags

        if "tp" in merged:
            tp, tp_at = merged["tp"]
            explicit["num_heads"] = self.heads_per_rank(merged, model)
            origins["num_heads"] = tp_at
            tags.append(f"tp{tp}")
        self.check_op_keys(op, merged)
        layout = explicit.get("layout", model.layout)
        if not LAYOUT_TABLE[layout].conventions and "scale_convention" in merged:
            message = f"{layout} rows have no scales; leave scale_convention unset"
            raise self.fail(origins["scale_convention"], message)

        explicit.update(workload_fields(explicit))  # a ragged batch sets b and context_len
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
            scale_convention=explicit.get(
                "scale_convention", LAYOUT_TABLE[layout].default_convention
            ),
            route=explicit.get("route", ROUTES[0]),
            window=window,
            compress_ratio=ratio,
            seed=common["seed"],
        )
        v.update({k: explicit[k] for k in WORKLOAD_DEFAULTS if k in explicit})
        if op in ("indexer", "topk"):  # the indexer's own heads, top-k and key cache
            v.update({k: d for k, d in indexer_case.defaults(model).items() if k not in explicit})
        if op == "topk":
            v["form"] = explicit.get("form", "plain")
        problems = case_problems(v) or (size_problems(v) if sized else None)
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
            tags=unique(tuple(tags)),
            **v,
        )


def product_of(values: Values) -> list[dict[str, tuple[Any, Origin]]]:
    """Cartesian product in key order; the last axis varies fastest."""
    keys = list(values)
    combos = itertools.product(*(values[k] for k in keys))
    return [dict(zip(keys, combo, strict=True)) for combo in combos]


def unique(items: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


# ---- public API ----------------------------------------------------------------------------


def load_text(
    text: str, filename: str = "<string>", *, known_backends: Collection[str]
) -> Scenario:
    """Parse, validate and expand a scenario given as text (`filename` only labels errors)."""
    root = parse(text, filename)
    return ScenarioLoader(filename, known_backends).scenario(root)


def load(path: str | Path, *, known_backends: Collection[str]) -> Scenario:
    """Parse, validate and expand one (kernel) scenario file."""
    return load_text(read_text(path), str(path), known_backends=known_backends)
