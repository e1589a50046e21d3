"""Figures of the q8kv8 study: its sparse prefill kernel's cases and the serving presets' TTFT."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

from dsv4bench.rows import timers

from .common import STUDIES, _last_rows, _pair_ratios, rows

Q8_PREFILL = f"{STUDIES}/q8kv8/prefill"
Q8_SERVING = f"{STUDIES}/q8kv8/serving"


def _q8_cases() -> str:
    """q8kv8's cases in the prefill study (a re-judged case by its last row)."""
    n = Counter(r["status"] for r in _last_rows(Q8_PREFILL) if r["backend"] == "q8kv8")
    return f"{sum(n.values())} cases: {n['ok']} ok, {n['incorrect']} incorrect"


def _q8_against(other: str) -> str:
    """other's time / q8kv8's per case both ran ok (the first timer both measured):
    span, geometric mean, cases."""
    r = _pair_ratios(Q8_PREFILL, other, "q8kv8")
    mean = math.exp(sum(math.log(x) for x in r) / len(r))
    return f"{min(r):.2f}..{max(r):.2f}x (geometric mean {mean:.2f}, {len(r)} cases)"


def _q8_claim_shape() -> str:
    """FlashMLA / q8kv8 at the authors' shape (V3.2, 4096 tokens, 128 heads, top-2048) on
    normal values, per context the study ran it at."""
    shape = dict(model="v3.2", tokens=4096, num_heads=128, topk=2048, values=None)
    by: dict[int, dict[str, dict]] = {}
    for r in _last_rows(Q8_PREFILL):
        if r["status"] == "ok" and all(r["params"].get(k) == v for k, v in shape.items()):
            by.setdefault(r["params"]["context_len"], {})[r["backend"]] = r
    out = []
    for context, pair in sorted(by.items()):
        key, _ = timers.shared([pair["flashmla"], pair["q8kv8"]])
        a, b = (timers.value(pair[x], key) for x in ("flashmla", "q8kv8"))
        out.append(f"{a:.3f} against {b:.3f} ms ({a / b:.2f}x) at context {context}")
    return ", ".join(out)


def _q8_error(key: str, values: str | None) -> str:
    """The span of accuracy[key] over q8kv8's cases on `values` (None: the normal ones)."""
    got = [
        r["accuracy"][key]
        for r in _last_rows(Q8_PREFILL)
        if r["backend"] == "q8kv8" and r["params"].get("values") == values
    ]
    form = ".2g" if min(got) > 1e-3 else ".1e"
    return f"{min(got):{form}}..{max(got):{form}}"


def _q8_ttft(model: str) -> dict:
    """Per candidate label, its TTFT per point of the q8kv8 serving run (serving/presets.py's
    phase: a bf16-cache candidate pays no dequant)."""
    from dsv4bench.serving import presets as pz

    ph = pz.phase(rows(Q8_SERVING), model, 1, "ttft")
    return {c.label(): v for c, v in ph.values.items()}


def _q8_v32_ttft_gain() -> str:
    """sglang's bf16 default (FlashMLA sparse prefill, bf16 KV) / the q8 preset, summed over
    the points both ran."""
    v = _q8_ttft("v3.2")
    q8, bf16 = v["q8kv8 sparse-prefill (fp8 KV)"], v["flashmla sparse-prefill (bf16 KV)"]
    both = [p for p in q8 if p in bf16]
    return f"{sum(bf16[p] for p in both) / sum(q8[p] for p in both):.2f}x over {len(both)} points"


def _q8_ttft_at(model: str, q8: str, other: str, point: tuple) -> str:
    v = _q8_ttft(model)
    return f"{v[q8][point]:.1f} against {v[other][point]:.1f} ms"


def _q8_v4_slower() -> str:
    """Points where q8kv8 with its q cast is slower than FlashMLA (fp8 KV), of those it ran."""
    v = _q8_ttft("v4-flash")
    q8, fm = v["q8kv8-qcast sparse-prefill (fp8 KV)"], v["flashmla sparse-prefill (fp8 KV)"]
    both = [p for p in q8 if p in fm]
    return f"{sum(q8[p] > fm[p] for p in both)} of the {len(both)}"


FIGURES: dict[str, Callable[[], str]] = {
    "q8_cases": _q8_cases,
    "q8_flashmla": lambda: _q8_against("flashmla"),
    "q8_fa3": lambda: _q8_against("fa3"),
    "q8_triton": lambda: _q8_against("triton"),
    "q8_claim_shape": _q8_claim_shape,
    "q8_cos_bf16": lambda: _q8_error("cos_diff", None),
    "q8_cos_exact": lambda: _q8_error("exact_cos_diff", None),
    "q8_cos_outliers": lambda: _q8_error("cos_diff", "outliers"),
    "q8_v32_ttft_gain": _q8_v32_ttft_gain,
    "q8_v32_ttft_4k": lambda: _q8_ttft_at(
        "v3.2", "q8kv8 sparse-prefill (fp8 KV)", "flashmla sparse-prefill (bf16 KV)", (4096, 4096)
    ),
    "q8_v4_slower": _q8_v4_slower,
    "q8_v4_ttft_4k": lambda: _q8_ttft_at(
        "v4-flash",
        "q8kv8-qcast sparse-prefill (fp8 KV)",
        "flashmla sparse-prefill (fp8 KV)",
        (4096, 4096),
    ),  # fmt: skip
}
