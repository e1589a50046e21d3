"""The TP x route crossover: per (backend, model, chunk), at which heads per rank a prefill
chunk is faster through the FP8 decode kernel than through the bf16 sparse-prefill kernel.

vLLM's FlashMLA sparse backend (vllm/v1/attention/backends/mla/flashmla_sparse.py,
MIN_HEADS_FOR_BF16_PREFILL = 32) runs prefill through the decode kernel as one mixed batch
(route decode-mixed) when heads per rank < 32, and through sparse prefill otherwise. This
module measures that rule against the rows: where the decode routes win, and what vLLM's
threshold costs where it picks the slower route.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dsv4bench.report.load import case_rows, is_probe, param
from dsv4bench.rows import timers

SPARSE = "sparse-prefill"
DECODE_ROUTES = ("decode-mixed", "decode-kernel")
VLLM_MIN_HEADS_FOR_BF16_PREFILL = 32  # below it vLLM takes decode-mixed


@dataclass
class Crossover:
    """One (backend, model, chunk): route times per heads per rank, largest heads first."""

    backend: str
    model: str
    tokens: int
    heads: list[int]
    ms: dict[int, dict[str, float]] = field(default_factory=dict)  # heads -> route -> ms (ok)
    failed: dict[int, dict[str, str]] = field(default_factory=dict)  # heads -> route -> status
    timer: str = "events"  # the timer every ok row of this crossover measured (timers.PREFERENCE)

    def ratio(self, heads: int, route: str) -> float | None:
        """route's time / sparse-prefill's at this head count (< 1: the decode route wins)."""
        t, base = self.ms.get(heads, {}).get(route), self.ms.get(heads, {}).get(SPARSE)
        return t / base if t is not None and base else None

    def wins(self, route: str) -> list[int]:
        """Head counts where route is faster than sparse-prefill (both ok)."""
        return [h for h in self.heads if (self.ratio(h, route) or math.inf) < 1]

    def compared(self, route: str) -> list[int]:
        return [h for h in self.heads if self.ratio(h, route) is not None]

    def crossover(self, route: str) -> int | None:
        """The largest head count at or below which route wins at every compared count; None
        when it loses at the smallest one (or nothing was compared)."""
        best = None
        for h in sorted(self.compared(route)):  # smallest first
            if (self.ratio(h, route) or math.inf) >= 1:
                break
            best = h
        return best

    def monotone(self, route: str) -> bool:
        """The route wins at every count below its crossover and nowhere above it."""
        c = self.crossover(route)
        return set(self.wins(route)) == {h for h in self.compared(route) if c and h <= c}

    def vllm_choice(self, heads: int) -> str:
        return "decode-mixed" if heads < VLLM_MIN_HEADS_FOR_BF16_PREFILL else SPARSE

    def vllm_penalty(self) -> dict[int, float]:
        """Heads -> (time of vLLM's route / the faster of the two) where vLLM picks the slower
        of decode-mixed and sparse-prefill."""
        out = {}
        for h in self.compared("decode-mixed"):
            times = self.ms[h]
            chosen, best = times[self.vllm_choice(h)], min(times[SPARSE], times["decode-mixed"])
            if chosen > best:
                out[h] = chosen / best
        return out

    def vllm_verdict(self) -> str:
        """Whether `decode-mixed iff heads < 32` picks the faster route at every measured count."""
        compared = self.compared("decode-mixed")
        if not compared:
            return "not measured (needs sparse-prefill and decode-mixed rows)"
        penalty = self.vllm_penalty()
        if not penalty:
            return "right: it picks the faster route at every measured head count"
        wrong = ", ".join(f"h{h} ({self.vllm_choice(h)}: x{p:.2f})" for h, p in penalty.items())
        lows = [h for h in penalty if h < VLLM_MIN_HEADS_FOR_BF16_PREFILL]
        highs = [h for h in penalty if h >= VLLM_MIN_HEADS_FOR_BF16_PREFILL]
        why = []
        if highs:
            why.append(f"decode-mixed also wins at h{','.join(map(str, sorted(highs)))}")
        if lows:
            why.append(f"sparse-prefill wins at h{','.join(map(str, sorted(lows)))}")
        return f"slower route at {wrong}: {'; '.join(why)}"


def crossovers(rows: list[dict], who=lambda r: str(r.get("backend"))) -> list[Crossover]:
    """Crossovers from prefill case rows measured on sparse-prefill and at least one decode
    route at two or more head counts (other params equal: context_len, layout, padding)."""
    groups: dict[tuple, Crossover] = {}
    for r in case_rows(rows):
        if r.get("op") != "prefill" or is_probe(r):
            continue
        route, heads = param(r, "route"), param(r, "num_heads")
        if route not in (SPARSE, *DECODE_ROUTES) or not isinstance(heads, int):
            continue
        others = tuple(
            (k, str(v))
            for k, v in sorted((r.get("params") or {}).items())
            if k not in ("route", "num_heads", "tokens", "model")
        )
        key = (who(r), str(param(r, "model")), int(param(r, "tokens") or 0), others)
        c = groups.setdefault(key, Crossover(key[0], key[1], key[2], []))
        if heads not in c.heads:
            c.heads.append(heads)
        if r.get("status") == "ok" and timers.events_ms(r) is not None:
            c.ms.setdefault(heads, {})[route] = r  # a row until its group's timer is known
        else:
            c.failed.setdefault(heads, {})[route] = str(r.get("status"))
    found = []
    for c in groups.values():
        ok = [row for by_route in c.ms.values() for row in by_route.values()]
        key, c.timer = timers.shared(ok) or (timers.EVENTS, "events")
        c.ms = {h: {rt: timers.value(row, key) for rt, row in rs.items()} for h, rs in c.ms.items()}
        c.heads.sort(reverse=True)
        if len(c.heads) > 1 and any(c.compared(route) for route in DECODE_ROUTES):
            found.append(c)
    return sorted(found, key=lambda c: (c.backend, c.model, c.tokens))
