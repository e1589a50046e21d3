"""Scenario files: the workload axes (issue 23). `context_lens` (a ragged batch: an explicit
list of per-request lengths or a named distribution, cases/lengths.py), `index_pattern`
(how drawn top-k sets are picked, cases/patterns.py) and `values` (how q and the cache's
latent are drawn, cases/values.py): their parser and their rules."""

from __future__ import annotations

from typing import Any

from dsv4bench.cases import lengths
from dsv4bench.cases.case import CACHE_OPS, ROUTES, VALUES
from dsv4bench.cases.patterns import PATTERNS
from dsv4bench.scenarios.read import Node, key_path, show_value


def is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def context_lens(p, n: Node) -> lengths.Lengths:
    """`{lengths: [...]}`, `{dist: lognormal, mean, batch, sigma, seed, multiple}` or
    `{dist: one-long, long, short, batch}` (cases/lengths.py)."""
    m = p.expect_map(n, "a mapping: {lengths: [...]} or {dist: NAME, ...}")
    if "lengths" in m:
        p.check_keys(n, ("lengths",))
        items = m["lengths"]
        if items.kind != "seq" or not items.value:
            raise p.fail(items, f"expected a non-empty list of lengths, got {show_value(items)}")
        return lengths.explicit([p.integer(item) for item in items.value])
    if "dist" not in m:
        raise p.fail(n, "required key missing (or give lengths)", key_path(n.path, "dist"))
    dist = p.choice(m["dist"], lengths.DISTRIBUTIONS, "length distribution")
    if dist == "one-long":
        p.check_keys(n, ("dist", "long", "short", "batch"), ("long", "short", "batch"))
        long, short = p.integer(m["long"]), p.integer(m["short"])
        return lengths.one_long(long, short, p.integer(m["batch"]))
    keys = ("dist", "mean", "batch", "sigma", "seed", "multiple")
    p.check_keys(n, keys, ("mean", "batch"))
    mean, multiple = p.integer(m["mean"]), 1
    if "multiple" in m:
        multiple = p.integer(m["multiple"])
        if mean % multiple:
            raise p.fail(m["mean"], f"expected a multiple of {multiple}, got {mean}")
    sigma = p.number(m["sigma"], positive=False) if "sigma" in m else 1.0
    seed = p.integer(m["seed"], 0) if "seed" in m else 0
    try:
        return lengths.lognormal(mean, sigma, p.integer(m["batch"]), seed, multiple)
    except ValueError as e:
        raise p.fail(n, str(e)) from None


def workload_fields(explicit: dict[str, Any]) -> dict[str, Any]:
    """A ragged batch's Case fields from the `context_lens` value: the lengths, their label,
    and (unless given) batch_size = the number of requests, context_len = the longest."""
    given = explicit.get("context_lens")
    if given is None:
        return {}
    return {
        "context_lens": given.lengths,
        "ragged": given.label,
        "batch_size": explicit.get("batch_size", len(given.lengths)),
        "context_len": explicit.get("context_len", max(given.lengths)),
    }


def workload_problems(v: dict[str, Any]) -> list[tuple[str, str]] | None:
    """Rules of the workload axes: a ragged batch's lengths, and where an index pattern acts."""
    lens = v.get("context_lens") or ()
    if lens:
        helper = v["op"] == "cache_write" or (v["op"] in ("remap", "dequant") and v["tokens"])
        if (v["op"] not in ("decode", "prefill") and not helper) or v["route"] != ROUTES[0]:
            why = (
                "a decode batch, a sparse-prefill chunk per request, a cache_write or a "
                "remap or dequant with tokens (the prefill workspace forms)"
            )
            return [("context_lens", f"ragged lengths need {why}, this is {v['op']} {v['route']}")]
        for i, n in enumerate(lens):
            if not is_int(n) or n < 1:
                return [("context_lens", f"expected positive lengths, got {n!r} at [{i}]")]
        if len(lens) != v["batch_size"]:
            got = f"{len(lens)} lengths for batch_size {v['batch_size']}"
            return [
                ("context_lens", f"expected one length per request, got {got}"),
                ("batch_size", got),
            ]
        longest = max(lens)
        if longest > v["context_len"]:
            at = f"context_lens[{lens.index(longest)}] = {longest}"
            return [
                ("context_lens", f"{at} exceeds context_len ({v['context_len']})"),
                ("context_len", f"expected context_len >= {at}, got {v['context_len']}"),
            ]
        need, what = (v["tokens"], "tokens") if v["op"] == "prefill" else (v["s_q"], "s_q")
        if min(lens) < need:
            return [
                ("context_lens", f"a request of {min(lens)} tokens is shorter than {what} ({need})")
            ]
    pattern = v.get("index_pattern", "uniform")
    if pattern not in PATTERNS:
        return [
            (
                "index_pattern",
                f"unknown index pattern {pattern!r}; expected one of {', '.join(PATTERNS)}",
            )
        ]
    drawn = v["window"] == 0 or (v["compress_ratio"] == 4 and v["extra_topk"])
    if pattern != "uniform" and (v["op"] not in ("decode", "prefill") or not drawn):
        why = "a drawn top-k set: no window (V3.2's top-k) or a C4 extra cache with extra_topk"
        return [("index_pattern", f"pattern {pattern} needs {why}")]
    values = v.get("values", "normal")
    if values not in VALUES:
        return [("values", f"unknown value distribution {values!r}; expected one of "
                 f"{', '.join(VALUES)}")]  # fmt: skip
    if values != "normal" and v["op"] not in CACHE_OPS:
        why = f"an op with q or a KV cache ({', '.join(CACHE_OPS)})"
        return [("values", f"values {values} needs {why}, this is {v['op']}")]
    return None
