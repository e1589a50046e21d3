"""Where the Gluon attention kernel's time goes, measured on a GPU: each (case, config) timed
whole, without its gather (the producer only hands the buffers over) and without its dots
(the consumers only hand them back), with the bytes per second (every query's keys read
once: metrics.attention_bytes) and the TFLOP/s of the whole run. A part's time near the
whole one is what bounds the kernel; both well under it means the hand-over between them
does.

    python3 tools/gluon_breakdown.py CASE_PREFIX=CONFIG [...]    (FlashMLA from .kernels/)
    python3 tools/gluon_breakdown.py --ncu CASE_PREFIX=CONFIG    one launch, for
        ncu --nvtx --nvtx-include "probe/" ...  (FlashMLA's with CONFIG "flashmla")

CONFIG: "default" (the shipped config_for pick), "flashmla" or a FlashMLA build instance
such as "flashmla-vllm-0.26.0" (the engine kernel; whole only), Config's fields as a Python
tuple, e.g. "(32,64,8,1,True,True,64,48,True,True,True)", or the default with fields changed,
"default+prefetch=1+chunk=64"; a "/S" suffix forces S key splits (e.g. "default/40"). With
--whole only the whole kernel is timed. Cases: --scenario (default
scenarios/sm90/triton_vs_flashmla.yaml). Times: dsv4bench.measure.timing, cold L2.
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import replace

SCENARIO = "scenarios/sm90/triton_vs_flashmla.yaml"
SKIPS = {"whole": 0, "no gather": 1, "no dots": 2}


def _case(prefix: str, path: str = SCENARIO):
    """The first case of the scenario at `path` whose id starts with prefix."""
    from dsv4bench import backends
    from dsv4bench.scenarios import load

    backends.setup([])
    scenario = load(path, known_backends=backends.catalog())
    return next(c for c in scenario.cases if c.case_id.startswith(prefix))


def _config(case, spec: str):
    from dsv4bench.backends.triton import attention as ta

    if spec.split("+")[0] == "default":
        layout = case.layout if ta.uses_decode_kernel(case) else "bf16"
        cfg = ta.config_for(case.num_heads, layout, True, case.d_qk)
        changes = dict(kv.split("=", 1) for kv in spec.split("+")[1:])
        return replace(cfg, **{k: ast.literal_eval(v) for k, v in changes.items()})
    return ta.Config(*ast.literal_eval(spec))


def _launch(case, x, cfg, splits: int | None = None):
    """The Triton/Gluon attention launch of the case's inputs x with Config cfg (and `splits`
    key splits, None: the planner's), planned."""
    from dsv4bench.backends.triton import attention as ta

    decode = ta.uses_decode_kernel(case)
    extra = {}
    if decode:
        extra = {"extra_kv": x.get("extra_k_cache"), "extra_indices": x.get("extra_indices"),
                 "extra_topk_length": x.get("extra_topk_length")}  # fmt: skip
    return ta.plan_attention(
        x["q"],
        x["k_cache"] if decode else x["kv"],
        x["indices"],
        case.scale,
        layout=case.layout if decode else "bf16",
        op="decode" if decode else "prefill",
        topk_length=x.get("topk_length"),
        attn_sink=x.get("attn_sink"),
        config=cfg,
        splits=splits,
        **extra,
    )


def _runner(case, x, spec: str, skip: int):
    """A callable that launches the case once as `spec` with the kernel's SKIP."""
    if spec.startswith("flashmla"):
        from dsv4bench import backends

        return backends.get(spec).prepare(case, x, "cuda").run
    spec, _, splits = spec.partition("/")
    plan = _launch(case, x, _config(case, spec), int(splits) if splits else None)
    if skip:
        if not plan.info["gluon"]:
            return None
        plan.meta["SKIP"] = skip
    return plan.run


def _plan_info(case, x, spec: str) -> str:
    """(head blocks x splits x key blocks a split) of the plan a spec makes."""
    spec, _, splits = spec.partition("/")
    i = _launch(case, x, _config(case, spec), int(splits) if splits else None).info
    return f" ({i['head_blocks']}x{i['splits']}x{i['key_blocks_per_split']})"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+", help="CASE_PREFIX=CONFIG")
    ap.add_argument("--ncu", action="store_true", help="one launch of each, inside probe/")
    ap.add_argument("--scenario", default=SCENARIO, help=f"the cases (default {SCENARIO})")
    ap.add_argument("--whole", action="store_true", help="time the whole kernel only")
    a = ap.parse_args()
    import torch

    if not torch.cuda.is_available():  # nothing to time: say so, never a quiet exit 0
        print("gluon_breakdown: needs a CUDA GPU; this machine has none", file=sys.stderr)
        return 2

    from dsv4bench import backends
    from dsv4bench.cases import inputs
    from dsv4bench.measure import metrics, timing

    backends.setup()
    kw = dict(device="cuda", warmup=3, iters=20, flush_l2=True, timer="events")
    for run in a.runs:
        prefix, spec = run.split("=", 1)
        case = _case(prefix, a.scenario)
        x = inputs.make_inputs(case, "cuda")
        if a.ncu:
            fn = _runner(case, x, spec, 0)
            fn()
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push("probe")
            fn()
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()
            print(f"{case.case_id} {spec}: profiled", flush=True)
            continue
        flops = metrics.attention_flops(case)
        moved = metrics.attention_bytes(case)  # every query's keys read once
        cells = []
        for name, skip in SKIPS.items():
            engine = spec.startswith("flashmla")
            fn = None if (skip and (engine or a.whole)) else _runner(case, x, spec, skip)
            if fn is None:
                continue
            ms = timing.measure(fn, **kw)["median_ms"]
            extra = ""
            if skip == 0:
                extra = f" ({moved / ms / 1e9:.2f} TB/s, {flops / ms / 1e9:.0f} TFLOP/s)"
            cells.append(f"{name} {ms:.4f} ms{extra}")
        info = "" if spec.startswith("flashmla") else _plan_info(case, x, spec)
        print(f"{case.case_id:52s} {spec}{info}: " + "; ".join(cells), flush=True)
        del x
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
