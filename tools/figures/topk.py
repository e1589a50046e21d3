"""Figures of the top-k study: the kernel runs (x the own Triton kernel, x torch.topk) and the
serving runs' indexer breakdown."""

from __future__ import annotations

from collections.abc import Callable

from dsv4bench.rows import timers

from .common import (
    STUDIES,
    _last_rows,
    _median,
    _pair_ratios,
    _percent_span,
    _span3,
    rows,
    span,
)

TOPK = f"{STUDIES}/topk/run"  # tree 6b04eac: FlashInfer 0.7.2.post1's rows, no torch-topk
TOPK_TT = f"{STUDIES}/topk/run-1c68753"  # torch.topk as engines call it beside the others


def _serving_points(*runs: str, where=lambda r: True) -> list[dict]:
    """The ok serving rows of the topk study's serving runs for which where(row) holds."""
    return [
        r
        for run in runs
        for r in rows(f"{STUDIES}/topk/{run}")
        if r.get("kind") == "serving" and r.get("status") == "ok" and where(r)
    ]


def _serving_split(run: str, metric: str, part: str, whole: str) -> str:
    """breakdown_ms[part] / breakdown_ms[whole] over a serving run's points of `metric`: in %
    of the indexer, else (a kernel's time against the indexer's own top-k) as a ratio."""
    values = [
        r["breakdown_ms"][part] / r["breakdown_ms"][whole]
        for r in _serving_points(run, where=lambda r: r.get("metric") == metric)
    ]
    return _percent_span(values) if whole == "indexer" else span(values)


def _topk_pairs(a: str, b: str, run: str = TOPK) -> list[tuple[dict, dict]]:
    """(a's row, b's row) of each case both ran ok in the top-k run `run`."""
    by: dict[str, dict[str, dict]] = {}
    for r in _last_rows(run):
        if r["status"] == "ok":
            by.setdefault(r["case_id"], {})[r["backend"]] = r
    return [(p[a], p[b]) for p in by.values() if a in p and b in p]


def _topk_rows_of(a: str, b: str, run: str = TOPK) -> str:
    """'N of M': the cases a and b both ran ok, of a's ok rows."""
    ok = sum(r["status"] == "ok" and r["backend"] == a for r in _last_rows(run))
    return f"{len(_topk_pairs(a, b, run))} of {ok}"


def _topk_ok_of(backend: str, run: str) -> str:
    """'N of M': a backend's ok rows of all its rows in a top-k run."""
    got = [r["status"] for r in _last_rows(run) if r["backend"] == backend]
    return f"{got.count('ok')} of {len(got)}"


def _topk_timer_flips(a: str, b: str) -> str:
    """'N of M': pairs whose faster side differs between the shared timer and the events
    median."""
    pairs = _topk_pairs(a, b)
    flips = 0
    for x, y in pairs:
        key, _ = timers.shared([x, y])
        by_shared = timers.value(x, key) < timers.value(y, key)
        flips += by_shared != (timers.events_ms(x) < timers.events_ms(y))
    return f"{flips} of {len(pairs)}"


def _topk_graph_eager(backend: str) -> str:
    """A backend's CUDA-graph replay / its own events median, over its ok top-k rows."""
    got = [
        timers.value(r, "graph_ms") / timers.events_ms(r)
        for r in _last_rows(TOPK)
        if r["backend"] == backend and r["status"] == "ok" and timers.value(r, "graph_ms")
    ]
    return span(got)


def _indexer_share_batch1() -> str:
    """indexer / the point's total at TPOT batch 1, both serving runs, in %."""
    batch1 = _serving_points(
        "serving", "serving-v32", where=lambda r: r["metric"] == "tpot" and r["batch_size"] == 1
    )
    return _percent_span([r["breakdown_ms"]["indexer"] / r["value_ms"] for r in batch1])


def _topk_incorrect(backend: str, run: str = TOPK) -> str:
    return str(sum(r["status"] == "incorrect" and r["backend"] == backend for r in _last_rows(run)))


FIGURES: dict[str, Callable[[], str]] = {
    "topk_sglang_triton_span": lambda: _span3(_pair_ratios(TOPK, "sglang-topk", "triton")),
    "topk_sglang_triton_median": lambda: _median(_pair_ratios(TOPK, "sglang-topk", "triton")),
    "topk_sglang_incorrect": lambda: _topk_incorrect("sglang-topk"),
    "topk_flashinfer_incorrect": lambda: _topk_incorrect("flashinfer"),
    "topk_flashinfer_triton_median": lambda: _median(_pair_ratios(TOPK, "flashinfer", "triton")),
    "topk_flashinfer_sglang_span": lambda: _span3(_pair_ratios(TOPK, "flashinfer", "sglang-topk")),
    "topk_flashinfer_sglang_median": lambda: _median(
        _pair_ratios(TOPK, "flashinfer", "sglang-topk")
    ),
    # x torch.topk: both sides rows of run-1c68753, the first timer both hold (graph replay)
    "topk_tt_rows": lambda: _topk_ok_of("torch-topk", TOPK_TT),
    "topk_oracle_tt_span": lambda: span(_pair_ratios(TOPK_TT, "torch", "torch-topk")),
    "topk_triton_tt_rows": lambda: _topk_rows_of("torch-topk", "triton", TOPK_TT),
    "topk_triton_tt_span": lambda: span(_pair_ratios(TOPK_TT, "triton", "torch-topk")),
    "topk_triton_tt_median": lambda: _median(_pair_ratios(TOPK_TT, "triton", "torch-topk")),
    "topk_sglang_tt_rows": lambda: _topk_rows_of("torch-topk", "sglang-topk", TOPK_TT),
    "topk_sglang_tt_span": lambda: span(_pair_ratios(TOPK_TT, "sglang-topk", "torch-topk")),
    "topk_sglang_tt_median": lambda: _median(_pair_ratios(TOPK_TT, "sglang-topk", "torch-topk")),
    "topk_sglang_incorrect_tt": lambda: _topk_incorrect("sglang-topk", TOPK_TT),
    # the indexer's own top-k (its call less its logits alone) / the indexer's call, in %
    "topk_share_ttft": lambda: _serving_split("serving", "ttft", "indexer_topk", "indexer"),
    "topk_share_tpot": lambda: _serving_split("serving", "tpot", "indexer_topk", "indexer"),
    "topk_share_ttft_v32": lambda: _serving_split("serving-v32", "ttft", "indexer_topk", "indexer"),
    "topk_share_tpot_v32": lambda: _serving_split("serving-v32", "tpot", "indexer_topk", "indexer"),
    # the fastest top-k kernel alone on the same rows / the indexer's own top-k
    "topk_alone_ratio": lambda: _serving_split("serving", "tpot", "topk_alone", "indexer_topk"),
    "topk_fi_sgl_flips": lambda: _topk_timer_flips("flashinfer", "sglang-topk"),
    "topk_fi_graph_eager": lambda: _topk_graph_eager("flashinfer"),
    "topk_indexer_share_b1": _indexer_share_batch1,
    "topk_alone_ratio_v32": lambda: _serving_split(
        "serving-v32", "tpot", "topk_alone", "indexer_topk"
    ),
}
