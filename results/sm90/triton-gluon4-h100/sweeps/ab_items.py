"""Resident or a program a token, by the number of tokens: sparse prefill at 32 heads (one
head block a token, so tokens = items), d_qk 576 and 512, topk 2048 over 8192 bf16 rows,
both configs forced (plan_attention's own choice bypassed by replacing it after planning).
Run from the repository root after `source tools/gpu/setup.sh`:

    python3 results/sm90/triton-gluon4-h100/sweeps/ab_items.py
"""

import dataclasses

import torch

from dsv4bench.backends import triton_attention as ta
from dsv4bench.measure import timing

KW = dict(device="cuda", warmup=3, iters=20, flush_l2=True, timer="events")
SMS = torch.cuda.get_device_properties(0).multi_processor_count


def plan(tokens, d_qk, persist):
    g = torch.Generator(device="cuda").manual_seed(tokens)
    kv = torch.randn(8192, 1, d_qk, device="cuda", generator=g).to(torch.bfloat16)
    q = torch.randn(tokens, 32, d_qk, device="cuda", generator=g).to(torch.bfloat16)
    idx = torch.randint(0, 8192, (tokens, 1, 2048), device="cuda", generator=g,
                        dtype=torch.int32)  # fmt: skip
    cfg = dataclasses.replace(ta.config_for(32, "bf16", True, d_qk), persist=persist)
    p = ta.plan_attention(q, kv, idx, 0.04, layout="bf16", op="prefill", config=cfg, splits=1)
    if persist and not p.info["persist"]:  # below two items an SM: forced resident anyway
        p.meta["PERSIST"] = True
        p.info["persist"] = True
        p = dataclasses.replace(p, grid=(min(SMS, tokens), 1, 1))
    return p


for d_qk in (576, 512):
    for tokens in (SMS, SMS + 60, 2 * SMS, 2 * SMS + 60, 3 * SMS, 8 * SMS):
        ms = {}
        for persist in (False, True):
            p = plan(tokens, d_qk, persist)
            ms[persist] = min(timing.measure(p.run, **KW)["median_ms"] for _ in range(2))
        print(f"d_qk {d_qk} tokens {tokens:5d} ({tokens / SMS:.2f} an SM): a program a token "
              f"{ms[False]:.4f} ms, resident {ms[True]:.4f} ms", flush=True)  # fmt: skip
