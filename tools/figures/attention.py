"""Figures of the attention kernels against each other: sglang's Triton kernels, vLLM's bench,
the spin check and the triton-shapes classes (the own Triton kernels against FlashMLA)."""

from __future__ import annotations

import statistics
from collections.abc import Callable

from .common import STUDIES, _gap_rows, _last_rows, _median, _pair_ratios, span

SGLTRI = f"{STUDIES}/sglang-triton/compare"
VLLM = f"{STUDIES}/vllm-bench/mla-sparse-decode"
SPIN = f"{STUDIES}/sglang-triton/spin-check"
SHAPES = f"{STUDIES}/triton-shapes/run"
SHAPES_H200 = f"{STUDIES}/triton-shapes/run-h200"


def _shape_ratios(build: str, tag: str | None = None, heads=(1, 10**9), run=None) -> list[float]:
    """FlashMLA `build`'s time / the own Triton kernels' on the triton-shapes cases tagged
    `tag` (None: all) with num_heads in [heads[0], heads[1]] (> 1: ours faster), in `run`
    (default the H100's)."""

    def where(r: dict) -> bool:
        tagged = tag is None or tag in r["tags"]
        return tagged and heads[0] <= r["params"]["num_heads"] <= heads[1]

    return _pair_ratios(run or SHAPES, build, "triton", where)


def _shape_figures() -> dict[str, Callable[[], str]]:
    """shapes_<class>_{span,median}[_26]: the triton-shapes classes against FlashMLA from
    vLLM 0.33.0 (and _26: 0.26.0)."""
    classes = {"fewq": ("few-query", (1, 10**9)), "mtp64": ("mtp", (64, 64)),
               "mtp128": ("mtp", (128, 128)), "batch": ("batch", (64, 128)),
               "prefill": ("prefill", (64, 128)), "tp": ("tp", (1, 32))}  # fmt: skip
    out: dict[str, Callable[[], str]] = {}
    runs = (("", "flashmla-vllm-0.33.0", SHAPES), ("_26", "flashmla-vllm-0.26.0", SHAPES),
            ("_h200", "flashmla-vllm-0.33.0", SHAPES_H200))  # fmt: skip
    for name, (tag, heads) in classes.items():
        for suffix, build, run in runs:
            ratios = lambda tag=tag, heads=heads, build=build, run=run: _shape_ratios(
                build, tag, heads, run
            )
            out[f"shapes_{name}_span{suffix}"] = lambda r=ratios: span(r())
            out[f"shapes_{name}_median{suffix}"] = lambda r=ratios: _median(r())
    return out


FIGURES: dict[str, Callable[[], str]] = {
    "sgltri_sm120_median": lambda: (
        f"{statistics.median(_pair_ratios(SGLTRI, 'sglang-triton', 'triton')):.0f}"
    ),
    "sgltri_fused_span": lambda: span(_pair_ratios(SGLTRI, "sglang-triton-fused", "triton")),
    "sgltri_fused_median": lambda: _median(_pair_ratios(SGLTRI, "sglang-triton-fused", "triton")),
    "sgltri_dsa_decode_median": lambda: _median(
        _pair_ratios(SGLTRI, "sglang-triton-dsa", "triton")
    ),
    "sgltri_dsa_prefill_median": lambda: _median(
        _pair_ratios(SGLTRI, "sglang-triton-dsa-prefill", "triton")
    ),
    "sgltri_sm120_span": lambda: "{:.0f}-{:.0f}".format(
        min(_pair_ratios(SGLTRI, "sglang-triton", "triton")),
        max(_pair_ratios(SGLTRI, "sglang-triton", "triton")),
    ),
    "sgltri_triton_flashmla_span": lambda: span(_pair_ratios(SGLTRI, "triton", "flashmla")),
    "sgltri_triton_flashmla_median": lambda: _median(_pair_ratios(SGLTRI, "triton", "flashmla")),
    "sgltri_dsa_decode_span": lambda: span(_pair_ratios(SGLTRI, "sglang-triton-dsa", "triton")),
    "sgltri_dsa_prefill_span": lambda: span(
        _pair_ratios(SGLTRI, "sglang-triton-dsa-prefill", "triton")
    ),
    "vllm_fi_fm_span": lambda: span(_pair_ratios(VLLM, "flashinfer", "flashmla")),
    "vllm_fi_fm_median": lambda: _median(_pair_ratios(VLLM, "flashinfer", "flashmla")),
    "spin_triton_flashmla_span": lambda: span(_pair_ratios(SPIN, "triton", "flashmla")),
    "spin_gap_rows": lambda: _gap_rows(SPIN),
    "shapes_rows": lambda: str(sum(r["status"] == "ok" for r in _last_rows(SHAPES))),
    "shapes_rows_h200": lambda: str(sum(r["status"] == "ok" for r in _last_rows(SHAPES_H200))),
    "shapes_below_08_h200": lambda: str(
        sum(r < 0.8 for r in _shape_ratios("flashmla-vllm-0.33.0", run=SHAPES_H200))
    ),
    "shapes_below_08": lambda: str(sum(r < 0.8 for r in _shape_ratios("flashmla-vllm-0.33.0"))),
    "shapes_tp_at_least_1": lambda: "{} of {}".format(
        sum(r >= 1 for r in _shape_ratios("flashmla-vllm-0.33.0", "tp", (1, 32))),
        len(_shape_ratios("flashmla-vllm-0.33.0", "tp", (1, 32))),
    ),
    **_shape_figures(),
}
