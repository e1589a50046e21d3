"""Scenario rules of the DSA path's helper ops beyond attention (cases/helper_cases.py)."""

from __future__ import annotations

from typing import Any

from dsv4bench.cases.case import DCP_FORMS, REMAP_FORMS, ROUTES
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


DCP_UNSET = {"dcp_size": 1, "dcp_rank": 0, "dcp_interleave": 1}  # and each field's least value


def dcp_problems(v: dict[str, Any]) -> list[tuple[str, str]] | None:
    """A remap's forms (REMAP_FORMS); the DCP fields belong to form dcp, as the engine allows
    them: rank below size, an interleave group within a page (VllmConfig's rule)."""
    form = v.get("form", "")
    if v["op"] == "remap" and form and form not in REMAP_FORMS:
        return [("form", f"a remap's form is one of {', '.join(REMAP_FORMS)}, got {form!r}")]
    got = {key: v.get(key, unset) for key, unset in DCP_UNSET.items()}
    if form not in DCP_FORMS or v["op"] != "remap":
        for key, unset in DCP_UNSET.items():
            if got[key] != unset:
                why = f"only remap's forms {' and '.join(DCP_FORMS)} have {key}"
                return [(key, f"{why}; this case has form {form!r}")]
        return None
    if v["tokens"]:
        return [("tokens", f"form {form} is the decode path's remap: expected tokens 0")]
    for key, least in DCP_UNSET.items():
        if not isinstance(got[key], int) or isinstance(got[key], bool) or got[key] < least:
            return [(key, f"expected an integer >= {least}, got {got[key]!r}")]
    size, rank, group = got.values()
    if rank >= size:
        return [
            ("dcp_rank", f"expected dcp_rank < dcp_size ({size}), got {rank}"),
            ("dcp_size", f"expected dcp_size > dcp_rank ({rank}), got {size}"),
        ]
    if v["page_size"] % group:
        return [
            ("dcp_interleave", f"expected a divisor of page_size ({v['page_size']}), got {group}"),
            ("page_size", f"expected a multiple of dcp_interleave ({group}), got {v['page_size']}"),
        ]
    return None
