"""The indexer's time split into its FP8 logits and its top-k, within one row.

The worker times the indexer's whole call (logits + top-k) and then its logits alone
(Prepared.logits) the same way: same timer, warm-up, cold L2 and graph setting. Per timer the
row keeps logits_ms (measured alone) and topk_ms = whole - logits_ms, so the two add up to the
call's own time by construction: topk_ms is the top-k's cost inside the call (reading logits
the call just wrote), not a top-k kernel timed on its own (the `topk` op's rows are that).
"""

from __future__ import annotations

import math

# the timer keys of a measurement (timing.measure) that a split follows
TIMER_KEYS = ("median_ms", "profiler_ms", "graph_ms")
HOW = (
    "logits_ms: the indexer's logits alone (the call without its top-k), timed as the call "
    "is; topk_ms: the call's time minus it, per timer (events median_ms, profiler_ms, "
    "graph_ms): the two add up to the call's time"
)


def split(whole: dict, logits: dict) -> dict:
    """{"logits_ms": {key: ms}, "topk_ms": {key: ms}, "how": HOW} for every timer key both
    measurements hold (finite); topk_ms may come out below 0 where the top-k costs less than
    the two calls' noise."""
    keys = [k for k in TIMER_KEYS if _finite(whole.get(k)) and _finite(logits.get(k))]
    return {
        "logits_ms": {k: logits[k] for k in keys},
        "topk_ms": {k: whole[k] - logits[k] for k in keys},
        "how": HOW,
    }


def stage_ms(row: dict | None, stage: str, key: str) -> float | None:
    """A stored row's logits_ms or topk_ms (`stage`) by timer `key`, or None without a split."""
    found = (((row or {}).get("timing") or {}).get("split") or {}).get(stage) or {}
    v = found.get(key) if isinstance(found, dict) else None
    return float(v) if _finite(v) else None


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
