"""Text helpers of the report: numbers, labels, sort keys."""

from __future__ import annotations

import math
import re


def is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def natural_key(v):
    """Sort key that orders numbers numerically and puts them before text."""
    return (0, v, "") if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, 0, str(v))


def natural_text_key(text: str):
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", text)]


def make_slug(*parts) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", "-".join(str(p) for p in parts if p)).strip("-").lower()


def fmt_num(v, digits: int = 4) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        return f"{v:.{digits}g}"
    return str(v)


def kilo(n) -> str:
    """8192 -> 8K, 65536 -> 64K; other values as they are."""
    if isinstance(n, int) and not isinstance(n, bool) and n >= 1024 and n % 1024 == 0:
        return f"{n // 1024}K"
    return str(n)


def route_order(route: str):
    """sparse-prefill, decode-kernel, decode-mixed, threshold:N (by N), safe, then the rest."""
    fixed = {"sparse-prefill": 0, "decode-kernel": 1, "decode-mixed": 2, "safe": 4}
    if route in fixed:
        return (fixed[route], natural_text_key(route))
    return (3 if route.startswith("threshold:") else 5, natural_text_key(route))


SHORT_ORDER = (
    "op",
    "layout",
    "route",
    "compress_ratio",
    "context_len",
    "extra_topk",
    "topk",
    "window",
    "s_q",
    "batch_size",
    "tokens",
    "num_heads",
)
DERIVED_PARAMS = ("extra_topk", "topk", "ragged")  # follow from context (lengths), ratio
# workload params a row leaves out at their default (Case.params): how a label shows that
ABSENT_PARAMS = {"context_lens": "", "ragged": "", "index_pattern": "uniform", "values": "normal"}


def short_param(name: str, v, params: dict) -> str:
    """A family param as a short plot label ("C4", "ctx 8K", "b64"); name=value otherwise."""
    if name == "compress_ratio":
        return f"C{v}" if v else ("SWA" if params.get("window") else "no extra cache")
    if name == "context_len":
        return f"ctx {kilo(v)}"
    if name == "batch_size":
        return f"b{v}"
    if name == "tokens":
        return f"{kilo(v)} tokens" if v else ""
    if name == "num_heads":
        return f"{v} heads"
    if name in ("op", "route", "layout", "model"):
        return str(v)
    if name in ("extra_topk", "topk", "window"):
        return f"{name.replace('_', ' ')} {v}"
    if name == "context_lens" and isinstance(v, list) and v:
        return f"ragged {kilo(min(v))}..{kilo(max(v))}"
    if name in ("index_pattern", "ragged", "values"):
        return str(v)
    return f"{name}={v}"


def sci(v) -> str:
    return f"{v:.2e}" if isinstance(v, (int, float)) else ""


def pct(v) -> str:
    return f"{100 * v:.1f}%" if isinstance(v, (int, float)) else ""


def code_span(text) -> str:
    return f"`{text}`" if text else ""
