"""Figures of the builds study: engine releases against each other, and vLLM 0.34.0's preset."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

from .common import STUDIES, _last_rows, _pair_ratios, rows

BUILDS = f"{STUDIES}/builds"


def _ratio_text(r: list[float]) -> str:
    """span, geometric mean and case count of per-case time ratios of one run."""
    mean = math.exp(sum(math.log(x) for x in r) / len(r))
    return f"{min(r):.2f}..{max(r):.2f}x (geometric mean {mean:.3f}, {len(r)} cases)"


def _statuses(run: str, backend_prefix: str = "") -> str:
    n = Counter(r["status"] for r in _last_rows(f"{BUILDS}/{run}")
                if r["backend"].startswith(backend_prefix))  # fmt: skip
    return ", ".join(f"{n[k]} {k}" for k in sorted(n, key=lambda k: (-n[k], k)))


def _preset_ttft() -> str:
    """vLLM 0.34.0's preset (unpadded small-head prefill) TTFT / the padded call's, per prompt."""
    got: dict[int, dict[str, float]] = {}
    for r in rows(f"{BUILDS}/presets-vllm034"):
        if r.get("kind") == "serving" and r.get("status") == "ok" and r["metric"] == "ttft":
            got.setdefault(r["prompt_len"], {})[r["backend"]] = r["value_ms"]
    return ", ".join(f"{n}: {d['flashmla-small-heads'] / d['flashmla']:.2f}"
                     for n, d in sorted(got.items()))  # fmt: skip


FIGURES: dict[str, Callable[[], str]] = {
    "rel_flashmla_034": lambda: _ratio_text(_pair_ratios(
        f"{BUILDS}/releases-attn", "flashmla-vllm-0.34.0", "flashmla-vllm-0.33.0")),
    "rel_fa3_034": lambda: _ratio_text(_pair_ratios(
        f"{BUILDS}/releases-attn", "fa3-vllm-0.34.0", "fa3-vllm-0.33.0")),
    "rel_attn_statuses": lambda: _statuses("releases-attn"),
    "rel_fi_statuses": lambda: _statuses("releases-flashinfer"),
    "topk_fi074_statuses": lambda: _statuses("topk-flashinfer-0.7.4"),
    "dg_statuses": lambda: _statuses("deepgemm-next-n"),
    "dg_034_033": lambda: _ratio_text(_pair_ratios(
        f"{BUILDS}/deepgemm-next-n", "dg-vllm-0.34.0", "dg-vllm-0.33.0")),
    "dg_026_033": lambda: _ratio_text(_pair_ratios(
        f"{BUILDS}/deepgemm-next-n", "dg-vllm-0.26.0", "dg-vllm-0.33.0")),
    "preset_ttft_034": _preset_ttft,
}  # fmt: skip
