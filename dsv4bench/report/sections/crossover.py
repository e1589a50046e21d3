"""TP x route crossover: where the decode routes beat sparse prefill, and vLLM's threshold.

Functions take `rep`, the report being built (dsv4bench.report.render.Report).
"""

from __future__ import annotations

from dsv4bench.report import plots
from dsv4bench.report.fmt import kilo, make_slug
from dsv4bench.report.route_crossover import (
    DECODE_ROUTES,
    SPARSE,
    VLLM_MIN_HEADS_FOR_BF16_PREFILL,
    Crossover,
    crossovers,
)

ROUTE_STYLE = {"decode-mixed": "-", "decode-kernel": "--"}


def crossover(rep) -> None:
    found = crossovers(rep.rows, rep.who)
    if not found:
        rep.left_out.append(
            "TP x route crossover: no prefill chunk measured on sparse-prefill and a decode "
            "route at several head counts."
        )
        return
    d = rep.doc
    d.heading("TP x route crossover")
    d.para(
        "A prefill chunk through the bf16 sparse-prefill kernel (over a dequantized workspace) "
        "against the FP8 decode kernel, as one request of s_q = chunk tokens (decode-mixed, "
        "vLLM) or as chunk-many requests of one token (decode-kernel, sglang), per heads per "
        "rank (tensor parallelism divides heads; both kernels pad to 64 or 128). Ratio = "
        "decode route time / sparse-prefill time, each chunk's rows by the timer all of them "
        "measured (named per line below), kernel calls only (the sparse-prefill "
        "route's FP8 -> bf16 dequant and index remap come on top: see the serving curves), "
        "so below 1 the decode route wins outright. vLLM's FlashMLA "
        f"sparse backend takes decode-mixed below {VLLM_MIN_HEADS_FOR_BF16_PREFILL} heads per "
        "rank (MIN_HEADS_FOR_BF16_PREFILL in vllm/v1/attention/backends/mla/flashmla_sparse.py, "
        "for V3.2; its DeepSeek V4 attention does not take that route, so V4 rows are a what-if)."
    )
    for backend in sorted({c.backend for c in found}):
        mine = [c for c in found if c.backend == backend]
        _figure(rep, backend, mine)
        _table(rep, backend, mine)
        d.bullets([_sentence(c) for c in mine])


def _sentence(c: Crossover) -> str:
    parts = []
    for route in DECODE_ROUTES:
        if not c.compared(route):
            continue
        x = c.crossover(route)
        if x:
            where = f"wins at h <= {x}"
        elif c.wins(route):
            where = f"loses at the smallest head count, h{min(c.compared(route))}"
        else:
            hs = c.compared(route)
            where = f"loses at every measured head count (h{min(hs)}..h{max(hs)})"
        if not c.monotone(route):
            where += f" (wins at h{','.join(map(str, c.wins(route))) or ' none'}: not monotone)"
        parts.append(f"{route} {where}")
    verdict = c.vllm_verdict()
    return (
        f"{c.backend} {c.model} chunk {kilo(c.tokens)} ({c.timer}): {'; '.join(parts)}; "
        f"vLLM's h < {VLLM_MIN_HEADS_FOR_BF16_PREFILL}: {verdict}."
    )


def _table(rep, backend: str, found: list[Crossover]) -> None:
    heads = sorted({h for c in found for h in c.heads}, reverse=True)
    rows = []
    for c in found:
        for route in DECODE_ROUTES:
            if not any(route in c.ms.get(h, {}) or route in c.failed.get(h, {}) for h in heads):
                continue
            cells = []
            for h in heads:
                ratio, failed = c.ratio(h, route), c.failed.get(h, {})
                if ratio is not None:
                    cells.append(f"**{ratio:.2f}**" if ratio < 1 else f"{ratio:.2f}")
                elif route in failed or SPARSE in failed:
                    cells.append(failed.get(route) or f"{SPARSE} {failed[SPARSE]}")
                else:
                    cells.append("")
            x = c.crossover(route)
            rows.append([c.model, kilo(c.tokens), route, *cells, f"h <= {x}" if x else "none"])
    rep.doc.table(
        ["model", "chunk", "route", *[f"h{h}" for h in heads], "decode wins"],
        rows,
        caption=f"{backend}: decode route time / sparse-prefill time (bold: the decode route wins)",
    )


def _figure(rep, backend: str, found: list[Crossover]) -> None:
    panels = []
    for model in sorted({c.model for c in found}):
        series = []
        for c in (c for c in found if c.model == model):
            for route in DECODE_ROUTES:
                hs = [h for h in sorted(c.heads) if c.ratio(h, route) is not None]
                if not hs:
                    continue
                failed = [h for h in c.heads if route in c.failed.get(h, {})]
                series.append(
                    plots.Series(
                        f"chunk {kilo(c.tokens)}",
                        hs,
                        [c.ratio(h, route) for h in hs],
                        failed_xs=failed,
                        linestyle=ROUTE_STYLE[route],
                    )
                )
        panels.append(
            plots.Panel(
                f"{model}: decode route / sparse-prefill",
                "heads per rank",
                "time ratio (< 1: decode route wins)",
                series,
                logx=True,
                hlines=[(1.0, "equal time", "0.4")],
            )
        )
    fig = plots.line_figure(
        f"TP x route crossover, {backend} (solid: decode-mixed, dashed: decode-kernel)", panels
    )
    rep.doc.image(rep.save(fig, make_slug("crossover", backend)), "TP x route crossover")
