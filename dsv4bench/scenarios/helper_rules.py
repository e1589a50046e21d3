"""Scenario rules of the DSA path's helper ops beyond attention (cases/helper_cases.py)."""

from __future__ import annotations

from typing import Any

from dsv4bench.cases.case import ROUTES
from reference.layout_table import LAYOUTS


def cache_write_problems(v: dict[str, Any]) -> list[tuple[str, str]] | None:
    """A writer writes each request's last s_q tokens into an FP8 cache of the layout."""
    lay = LAYOUTS[v["layout"]]
    if not (lay.fp8 and lay.complete):
        return [("layout", f"cache_write writes an FP8 cache's records, got layout {lay.name}")]
    if v["tokens"] != 0:
        return [("tokens", f"cache_write writes s_q tokens per request, got tokens {v['tokens']}")]
    if v["route"] != ROUTES[0]:
        return [("route", f"only prefill has a route; this is a {v['op']} case")]
    if not 1 <= v["s_q"] <= v["context_len"]:
        return [
            ("s_q", f"expected 1 <= s_q <= context_len ({v['context_len']}), got {v['s_q']}"),
            ("context_len", f"expected context_len >= s_q ({v['s_q']}), got {v['context_len']}"),
        ]
    return None
