"""Two questions about FlashInfer 0.6.18's FA3 MLA on an H100, measured:

1. How many query rows (one per request with page_size=1) one plan() can take: the planner
   reserves max_total_num_works = 16384 work items (include/flashinfer/attention/scheduler.cuh)
   without a check. Prints, per row count, how many output rows stay unwritten (NaN-filled).
2. What the FP8 path costs per scale form: bf16 vs e4m3 with a per-tensor ckv_scale vs e4m3
   with per-token ckv_scale_arr, same problem (CUDA events, median of 20, no L2 flush).
"""

import sys

import torch
from flashinfer.mla import BatchMLAPagedAttentionWrapper

dev = "cuda"
ws = torch.empty(128 << 20, dtype=torch.uint8, device=dev)
g = torch.Generator(device=dev).manual_seed(0)


def problem(t, h, k, n=65536, kpe=64):
    idx = torch.randint(0, n, (t * k,), generator=g, device=dev, dtype=torch.int32)
    lens = torch.full((t,), k, dtype=torch.int32)
    kvp = torch.arange(t + 1, dtype=torch.int32) * k
    qo = torch.arange(t + 1, dtype=torch.int32)
    q = torch.randn(t, h, 512 + kpe, generator=g, device=dev).bfloat16()
    kv = torch.randn(n, 1, 512 + kpe, generator=g, device=dev)
    return (qo, kvp, idx, lens), q, kv


# rows past 16384 can fault the context (17000 did): `scales` skips this part
for t in () if "scales" in sys.argv else (16000, 16384, 16385, 17000, 24576, 32768):
    args, q, kv = problem(t, 64, 128)
    w = BatchMLAPagedAttentionWrapper(ws, backend="fa3")
    w.plan(*args, 64, 512, 64, 1, False, 0.04, torch.bfloat16, torch.bfloat16)
    out = torch.full((t, 64, 512), float("nan"), dtype=torch.bfloat16, device=dev)
    kvb = kv.bfloat16()
    w.run(q[..., :512], q[..., 512:], kvb[..., :512], kvb[..., 512:], out=out)
    bad = (~torch.isfinite(out.float())).flatten(1).any(1)
    first = int(bad.nonzero()[0]) if bad.any() else -1
    print(f"rows {t}: unwritten/non-finite rows {int(bad.sum())}, first {first}", flush=True)


def timed(fn, iters=20):
    for _ in range(3):
        fn()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return sorted(ts)[len(ts) // 2]


for t, h, k in ((64, 128, 2048), (4096, 128, 2048), (4096, 64, 640)):
    args, q, kv = problem(t, h, k)
    qn, qp = q[..., :512], q[..., 512:]
    res = {}
    for form in ("bf16", "e4m3 ckv_scale", "e4m3 ckv_scale_arr"):
        w = BatchMLAPagedAttentionWrapper(ws, backend="fa3")
        fp8 = form != "bf16"
        dt = torch.float8_e4m3fn if fp8 else torch.bfloat16
        w.plan(*args, h, 512, 64, 1, False, 0.04, torch.bfloat16, dt)
        c = kv.to(dt)
        kw = {}
        if form == "e4m3 ckv_scale":
            kw = dict(ckv_scale=1.0, kpe_scale=1.0)
        elif fp8:
            arr = torch.ones(kv.shape[0], 1, 4, device=dev)
            kw = dict(ckv_scale_arr=arr, kpe_scale=1.0)
        ckv, kpe = c[..., :512].contiguous(), c[..., 512:].contiguous()
        res[form] = timed(lambda: w.run(qn, qp, ckv, kpe, **kw))  # noqa: B023
    print(f"t={t} h={h} topk={k}: " + ", ".join(f"{f} {v:.4f} ms" for f, v in res.items()))
