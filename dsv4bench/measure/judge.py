"""The one verdict on an answer, for every op: the accuracy numbers against the row's tolerance
(metrics.beyond_tolerance) and, where the answer is a top-k selection (the indexer), the picks
(topk.topk_problem). The worker decides a row's status with it; report and compare re-read
stored rows with it, so a row is never judged by two rules."""

from __future__ import annotations

from dsv4bench.cases.case import Tolerance
from dsv4bench.measure.metrics import beyond_tolerance
from dsv4bench.measure.topk import topk_problem


def problem(acc: dict, tolerance: Tolerance | dict) -> str | None:
    """Why an answer with these accuracy numbers is not correct (one line), or None."""
    found = beyond_tolerance(acc, tolerance)
    if found:
        return found[0][1]
    return topk_problem(acc)  # only top-k answers carry topk_* numbers


def verdict(acc: dict, tolerance: Tolerance | dict) -> tuple[str, str]:
    """(status, message): ("ok", "") or ("incorrect", the reason)."""
    why = problem(acc, tolerance)
    return ("incorrect", why) if why else ("ok", "")
