"""Rows grouped into plot lines: which params tell lines apart, and their labels and styles.

Functions take `rep`, the report being built (dsv4bench.report.render.Report).
"""

from __future__ import annotations

import json
from collections import defaultdict

from dsv4bench.report import plots
from dsv4bench.report.fmt import (
    ABSENT_PARAMS,
    DERIVED_PARAMS,
    SHORT_ORDER,
    natural_key,
    natural_text_key,
    short_param,
)


def line_groups(rep, rows: list[dict], skip: set[str]) -> dict[tuple, list[dict]]:
    """Rows grouped by (backend[, run], every param except `skip`): one line each."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        key = tuple(
            sorted(
                (k, json.dumps(v, sort_keys=True))
                for k, v in (r.get("params") or {}).items()
                if k not in skip
            )
        )
        groups[(rep.who(r), key)].append(r)
    return dict(groups)


def line_variants(groups: dict[tuple, list[dict]]) -> dict[tuple, tuple[str, str]]:
    """Per group, the params that differ between the figure's families, in full
    ("compress_ratio=4, context_len=8192") and short ("C4 ctx 8K"); ("", "") if none.
    The short form leaves out params that follow from the others (extra_topk, topk) where
    the labels stay distinct, and is "" for every group when it would merge two."""
    keys = {key for (_, key) in groups}
    varying = sorted(
        (
            name
            for name in {k for key in keys for k, _ in key}
            if len({dict(key).get(name) for key in keys}) > 1
        ),
        key=lambda n: (SHORT_ORDER.index(n) if n in SHORT_ORDER else len(SHORT_ORDER), n),
    )
    values = {g: {k: json.loads(v) for k, v in g[1]} for g in groups}

    def full(g):
        kv = values[g]
        return ", ".join(f"{n}={kv.get(n, '-')}" for n in varying)

    def shorten(g, names):
        kv = values[g]
        bits = [
            short_param(n, kv[n], kv) if n in kv else ABSENT_PARAMS.get(n, f"{n} -") for n in names
        ]
        return " ".join(b for b in bits if b)

    def distinct(names):
        labels = [(g[0], shorten(g, names)) for g in groups]
        return len(set(labels)) == len(labels)

    names = list(varying)
    if not distinct(names):
        return {g: (full(g), "") for g in groups}
    for n in DERIVED_PARAMS:
        if n in names and distinct([m for m in names if m != n]):
            names.remove(n)
    return {g: (full(g), shorten(g, names)) for g in groups}


def line_styles(rep, groups: dict[tuple, list[dict]]) -> list[tuple[tuple, str, dict, str]]:
    """(group, label, style, full label) in a natural order: color = backend, marker and
    line style = the family variant (the params that differ). The label is short
    ("flashmla C4 ctx 8K") where one can be derived, the full one names every param."""
    variants = line_variants(groups)

    def order(g):
        key = tuple((k, natural_key(json.loads(v))) for k, v in g[1])
        return (g[0], key)

    whos = sorted({g[0] for g in groups})
    kinds = sorted({v[0] for v in variants.values()}, key=natural_text_key)
    out = []
    for g in sorted(groups, key=order):
        var, short_var = variants[g]
        i = kinds.index(var)
        style = {
            "color": plots.PALETTE[whos.index(g[0]) % len(plots.PALETTE)],
            "marker": plots.MARKERS[i % len(plots.MARKERS)],
            "linestyle": plots.LINESTYLES[i % len(plots.LINESTYLES)],
        }
        full = ", ".join(b for b in (g[0], var) if b)
        label = " ".join(b for b in (g[0], short_var) if b) if short_var else full
        out.append((g, label, style, full))
    return out
