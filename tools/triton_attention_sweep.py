"""Launch-shape sweep of the Triton attention kernel against FlashMLA on a few cases of
scenarios/sm90/triton_vs_flashmla.yaml (GPU only; times with dsv4bench.measure.timing, cold L2).

    python3 tools/triton_attention_sweep.py [--flashmla-lib PATH] [--jobs N] [CASE_PREFIX ...]

First compiles every (case, config) in N parallel processes (Triton's on-disk cache keeps the
kernels), then times them one by one in this process. Prints one line per (case, config):
median ms and the ratio of FlashMLA's time to it (> 1: Triton is faster).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys

SCENARIO = "scenarios/sm90/triton_vs_flashmla.yaml"
DEFAULT_CASES = [
    "decode-v3.2-v32-h128-b64-",
    "decode-v4-flash-v4-h64-b64-",
    "decode-v4-pro-v4-h128-b64-",
    "decode-v4-flash-v4-h8-b64-",
    "decode-v4-flash-v4-h32-b64-",
    "decode-v3.2-v32-h16-b64-",
    "decode-v3.2-v32-h32-b64-",
    "prefill-v4-flash-v4-h64-t4096-",
    "prefill-v3.2-v32-h128-t4096-",
    "prefill-v4-flash-v4-h32-t4096-",
    "prefill-v3.2-v32-h16-t4096-",
]


def _configs(heads: int, layout: str):
    """(Config, splits or None = the planner's) pairs; the first is the shipped default."""
    from dsv4bench.backends.triton_attention import Config, config_for

    small = max(16, 1 << (heads - 1).bit_length())
    if heads >= 64:
        c = [Config(64, 64, 8, 1, False), Config(64, 64, 8, 2, False), Config(64, 32, 8, 2, True)]
    else:
        c = [Config(small, 64, 4, 2, False), Config(small, 32, 4, 2, True),
             Config(64, 64, 8, 1, False), Config(64, 64, 8, 2, False)]  # fmt: skip
        if small == 32:
            c += [Config(32, 32, 8, 2, True), Config(32, 64, 8, 2, False)]
    default = config_for(heads, layout)
    return [(default, None)] + [(x, None) for x in c if x != default]


def _layout(case) -> str:
    from dsv4bench.backends.triton_attention import uses_decode_kernel

    return case.layout if uses_decode_kernel(case) else "bf16"


def _cases(prefixes):
    from dsv4bench import backends
    from dsv4bench.scenarios import load

    scenario = load(SCENARIO, known_backends=backends.names())
    return [next(c for c in scenario.cases if c.case_id.startswith(p)) for p in prefixes]


def _launch(case, x, cfg, splits=None):
    from dsv4bench.backends import triton_attention as ta

    decode = ta.uses_decode_kernel(case)
    return ta.attention_launcher(
        x["q"],
        x["k_cache"] if decode else x["kv"],
        x["indices"],
        case.scale,
        topk_length=x.get("topk_length"),
        attn_sink=x.get("attn_sink"),
        extra_kv=x.get("extra_k_cache"),
        extra_indices=x.get("extra_indices"),
        op="decode" if decode else "prefill",
        config=cfg,
        splits=splits,
    )


def _compile(args):
    prefix, index = args
    import torch

    from dsv4bench.cases import inputs

    case = _cases([prefix])[0]
    x = inputs.make_inputs(case, "cuda")
    cfg, splits = _configs(case.num_heads, _layout(case))[index]
    try:
        _launch(case, x, cfg, splits).run()
        torch.cuda.synchronize()
        return ""
    except Exception as e:  # a shape that does not compile or fit: reported, not fatal
        return f"{case.case_id} {cfg}: {type(e).__name__}: {str(e)[:200]}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("prefixes", nargs="*", default=DEFAULT_CASES)
    ap.add_argument("--flashmla-lib")
    ap.add_argument("--jobs", type=int, default=12)
    a = ap.parse_args()
    import torch

    from dsv4bench import backends
    from dsv4bench.cases import inputs
    from dsv4bench.measure import timing

    backends.setup(flashmla_lib=a.flashmla_lib)
    cases = _cases(a.prefixes)
    work = [(p, i) for p, c in zip(a.prefixes, cases, strict=True)
            for i in range(len(_configs(c.num_heads, _layout(c))))]  # fmt: skip
    with mp.get_context("spawn").Pool(a.jobs) as pool:
        for err in pool.imap_unordered(_compile, work):
            if err:
                print("compile:", err, flush=True)
    fm = backends.get("flashmla")
    for case in cases:
        x = inputs.make_inputs(case, "cuda")
        t = case.timing
        kw = dict(device="cuda", warmup=t.warmup, iters=t.iters, flush_l2=True, timer="events")
        ref_ms = None
        try:
            ref_ms = timing.measure(fm.prepare(case, x, "cuda").run, **kw)["median_ms"]
            print(f"{case.case_id:58s} flashmla {ref_ms:8.4f} ms", flush=True)
        except Exception as e:
            print(f"{case.case_id:58s} flashmla failed: {type(e).__name__}: {e}", flush=True)
        for cfg, splits in _configs(case.num_heads, _layout(case)):
            try:
                launch = _launch(case, x, cfg, splits)
                ms = timing.measure(launch.run, **kw)["median_ms"]
            except Exception as e:
                print(f"{'':58s} {cfg}: failed {type(e).__name__}: {str(e)[:150]}", flush=True)
                continue
            ratio = f"{ref_ms / ms:6.3f}x" if ref_ms else "-"
            print(f"{'':58s} bh{cfg.block_h} bn{cfg.block_n} w{cfg.num_warps} "
                  f"s{cfg.num_stages} pf{int(cfg.prefetch)} splits{launch.info['splits']} "
                  f"{ms:8.4f} ms  flashmla/triton {ratio}", flush=True)  # fmt: skip
        del x
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
