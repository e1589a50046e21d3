"""Probe, on a Hopper GPU, the two kernels the fa3 and deepgemm backends call.

1. vLLM's FA3 build (`_vllm_fa3_C`) as sparse MLA (page size 1, block table = top-k list):
   op schemas, V3.2 and V4 accuracy against fp32, the lse layout and base, an empty row, head
   counts, MTP rows, a few timings.
2. DeepGEMM: the signatures of its indexer functions, one paged and one ragged call, and
   (with `limit`) the batch sizes where get_paged_mqa_logits_metadata stops, each in a fresh
   process.
Usage: python tools/engines_probe.py [fa3] [deepgemm] [limit]
"""

import glob
import math
import subprocess
import sys

import torch

dev = "cuda"


def cosd(a, b):
    a, b = a.double(), b.double()
    return float(((a - b) ** 2).sum() / ((a * a).sum() + (b * b).sum()).clamp_min(1e-30))


def load_fa3():
    so = sorted(glob.glob(".kernels/fa3-vllm-*/_vllm_fa3_C.abi3.so"))[0]
    torch.ops.load_library(so)
    return torch.ops._vllm_fa3_C


def fa3_call(ops, q, k, v, qv, table, lens, scale, max_q=1, causal=True):
    t = table.shape[0]
    cu = torch.arange(0, (t + 1) * max_q, max_q, dtype=torch.int32, device=dev)
    res = ops.fwd(
        q, k, v, None, None, qv, None, cu, None, None, None, lens, max_q, table.shape[1],
        table, None, None, None, None, None, None, None, None, scale, causal, -1, -1, 0.0,
        True, None, 0, None, 0, None, 1, 0, None,
    )  # fmt: skip
    return res[0], res[1]


def ref(q, kv, rows, scale, dv=512):
    outs, lses = [], []
    for t, idx in enumerate(rows):
        if len(idx) == 0:
            outs.append(torch.zeros(q.shape[1], dv, device=dev))
            lses.append(torch.full((q.shape[1],), math.inf, device=dev))
            continue
        k = kv[idx].float()
        lg = q[t].float() @ k.T * scale
        outs.append(torch.softmax(lg, -1) @ k[:, :dv])
        lses.append(torch.logsumexp(lg, -1))
    return torch.stack(outs), torch.stack(lses)


def problem(t, h, d, n=5000, k=256, empty=True, seed=0):
    g = torch.Generator(device=dev).manual_seed(seed)
    kv = torch.randn(n, d, generator=g, device=dev).bfloat16()
    lens = torch.randint(1, k + 1, (t,), generator=g, device=dev)
    if empty:
        lens[3] = 0
    rows = [torch.randperm(n, generator=g, device=dev)[: int(m)] for m in lens]
    table = torch.zeros(t, k, dtype=torch.int32, device=dev)
    for i, r in enumerate(rows):
        table[i, : len(r)] = r
    q = torch.randn(t, h, d, generator=g, device=dev).bfloat16()
    return q, kv, rows, table, lens.int()


def fa3_probe():
    ops = load_fa3()
    for name in ("fwd", "get_scheduler_metadata"):
        print("schema", getattr(ops, name).default._schema, flush=True)
    for h in (1, 8, 16, 20, 64, 128):
        for d in (576, 512):
            try:
                q, kv, rows, table, lens = problem(37, h, d)
                scale = d**-0.5
                cache = kv.view(-1, 1, 1, d)
                if d == 576:
                    qk, kk, qv = q[..., 512:], cache[..., 512:], q[..., :512]
                else:  # V4: 64 latent columns as q/k, the rest (zero-padded) as q_v vs v
                    qk, kk = q[..., :64], cache[..., :64]
                    qv = torch.cat([torch.zeros_like(q[..., :64]), q[..., 64:]], -1)
                out, lse = fa3_call(ops, qk, kk, cache[..., :512], qv, table, lens, scale)
                ro, rl = ref(q, kv, rows, scale)
                ok = lens > 0
                lse_t = lse.transpose(0, 1) if lse.shape[0] == h else lse
                print(
                    f"h={h} d={d} out={tuple(out.shape)} lse={tuple(lse.shape)} "
                    f"cos={cosd(ro[ok], out[ok].float()):.2e} "
                    f"lse_err={float((rl[ok] - lse_t[ok]).abs().max()):.2e} "
                    f"empty out={float(out[3].float().abs().max())} lse={lse_t[3, :2].tolist()}",
                    flush=True,
                )
            except Exception as e:
                print("FAIL", h, d, type(e).__name__, str(e)[:300], flush=True)
    # MTP: s_q 2 query tokens as their own rows (max_seqlen_q 1) vs one request of 2 sharing a list
    q, kv, rows, table, lens = problem(16, 64, 576, empty=False)
    cache = kv.view(-1, 1, 1, 576)
    try:
        out, _ = fa3_call(
            ops, q[..., 512:], cache[..., 512:], cache[..., :512], q[..., :512],
            table[::2].contiguous(), lens[::2].contiguous(), 576**-0.5, max_q=2, causal=False,
        )  # fmt: skip
        shared = [rows[i - i % 2] for i in range(16)]
        ro, _ = ref(q, kv, shared, 576**-0.5)
        print("max_seqlen_q=2 shared list cos", f"{cosd(ro, out.float()):.2e}", flush=True)
    except Exception as e:
        print("FAIL mtp2", type(e).__name__, str(e)[:300], flush=True)
    # FP8 refusal and s_aux refusal (the messages plan() reports)
    for what in ("fp8", "s_aux"):
        try:
            q, kv, rows, table, lens = problem(8, 16, 576, empty=False)
            cache = kv.view(-1, 1, 1, 576)
            if what == "fp8":
                c8 = cache.to(torch.float8_e4m3fn)
                q8 = q.to(torch.float8_e4m3fn)
                fa3_call(ops, q8[..., 512:], c8[..., 512:], c8[..., :512], q8[..., :512], table,
                         lens, 0.04)  # fmt: skip
            else:
                cu = torch.arange(9, dtype=torch.int32, device=dev)
                ops.fwd(q[..., 512:], cache[..., 512:], cache[..., :512], None, None,
                        q[..., :512], None, cu, None, None, None, lens, 1, 256, table, None,
                        None, None, None, None, None, None, None, 0.04, True, -1, -1, 0.0, True,
                        None, 0, None, 0, torch.zeros(16, device=dev), 1, 0, None)  # fmt: skip
            print(what, "ACCEPTED", flush=True)
        except Exception as e:
            print(what, "refused:", type(e).__name__, str(e)[:200], flush=True)
    # timings (warm L2), CUDA events, median of 20
    for t, h, k in ((62, 128, 2048), (128, 16, 2048), (4096, 128, 2048), (4096, 64, 512)):
        g = torch.Generator(device=dev).manual_seed(1)
        n = 65536
        kv = torch.randn(n, 576, generator=g, device=dev).bfloat16().view(-1, 1, 1, 576)
        q = torch.randn(t, h, 576, generator=g, device=dev).bfloat16()
        table = torch.randint(0, n, (t, k), generator=g, device=dev, dtype=torch.int32)
        lens = torch.full((t,), k, dtype=torch.int32, device=dev)

        def fn(q=q, kv=kv, table=table, lens=lens):
            return fa3_call(ops, q[..., 512:], kv[..., 512:], kv[..., :512], q[..., :512],
                            table, lens, 0.04)  # fmt: skip

        for _ in range(3):
            fn()
        ts = []
        for _ in range(20):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            ts.append(a.elapsed_time(b))
        ms = sorted(ts)[10]
        tf = 2 * t * h * k * (576 + 512) / ms / 1e9
        print(f"time t={t} h={h} topk={k}: {ms:.4f} ms {tf:.0f} TFLOP/s", flush=True)


def deepgemm_probe():
    import deep_gemm as dg

    print("deep_gemm", dg.__version__, dg.__file__, flush=True)
    for n in ("get_paged_mqa_logits_metadata", "fp8_paged_mqa_logits", "fp8_mqa_logits"):
        print(n, "::", (getattr(dg, n).__doc__ or "").strip()[:600], flush=True)
    b, nn, h, d, bs, ctx = 8, 1, 64, 128, 64, 4096
    q = torch.randn(b, nn, h, d, device=dev).to(torch.float8_e4m3fn)
    blocks = b * ctx // bs
    cache = torch.randint(0, 60, (blocks, bs, 1, d + 4), dtype=torch.uint8, device=dev)
    cache[..., d:] = torch.tensor([0, 0, 128, 63], dtype=torch.uint8, device=dev)  # 1.0 f32
    w = torch.randn(b * nn, h, device=dev)
    lens = torch.full((b,), ctx, dtype=torch.int32, device=dev)
    table = torch.arange(blocks, dtype=torch.int32, device=dev).view(b, -1)
    for args in ((lens, bs, dg.get_num_sms()), (lens, dg.get_num_sms())):
        try:
            meta = dg.get_paged_mqa_logits_metadata(*args)
            print("metadata", len(args), "args ok", tuple(meta.shape), meta.dtype, flush=True)
            out = dg.fp8_paged_mqa_logits(q, cache, w, lens, table, meta, ctx)  # every key visible
            torch.cuda.synchronize()
            print("paged ok", tuple(out.shape), out.dtype, flush=True)
        except Exception as e:
            print("paged FAIL", len(args), type(e).__name__, str(e)[:300], flush=True)


def limit_one(batch: int, ctx: int = 256):
    """Metadata and one paged call at `batch` requests of ctx tokens; a few rows vs the oracle."""
    import deep_gemm as dg

    from reference import indexer

    h, d, bs = 64, 128, 64
    per = ctx // bs
    g = torch.Generator(device=dev).manual_seed(0)
    cache = indexer.quantize_key_cache(torch.randn(batch * ctx, d, generator=g, device=dev), bs)
    table = torch.randperm(batch * per, generator=g, device=dev).int().view(batch, per)
    q = torch.randn(batch, 1, h, d, generator=g, device=dev).to(torch.float8_e4m3fn)
    w = torch.randn(batch, h, generator=g, device=dev)
    lens = torch.full((batch, 1), ctx, dtype=torch.int32, device=dev)  # 2.5.0: 2-D only
    meta = dg.get_paged_mqa_logits_metadata(lens, bs, dg.get_num_sms())
    torch.cuda.synchronize()
    print(f"batch {batch}: metadata {tuple(meta.shape)}", flush=True)
    out = dg.fp8_paged_mqa_logits(q, cache, w, lens, table, meta, ctx)  # every key visible
    torch.cuda.synchronize()
    pick = torch.unique(torch.linspace(0, batch - 1, 64, device=dev).long())
    want = indexer.paged_mqa_logits(
        q[pick], cache, w[pick], lens[pick], table[pick].contiguous(), ctx
    )
    got = out[pick].float()
    print(
        f"batch {batch}: logits cos_diff {cosd(want, got):.2e} "
        f"nonfinite {int((~torch.isfinite(got)).sum())}",
        flush=True,
    )


if __name__ == "__main__":
    args = sys.argv[1:]
    if args and args[0] == "limit-one":
        limit_one(int(args[1]))
        sys.exit(0)
    if "fa3" in args:
        fa3_probe()
    if "deepgemm" in args:
        deepgemm_probe()
    if "limit" in args:  # bisection to 32 requests, each probe in a fresh process

        def works(batch: int) -> bool:
            r = subprocess.run(
                [sys.executable, __file__, "limit-one", str(batch)],
                capture_output=True,
                text=True,
                timeout=120,
            )
            tail = (r.stdout + r.stderr).strip().splitlines()[-1:] or [""]
            print(f"probe batch {batch}: rc {r.returncode} {tail[0][:300]}", flush=True)
            return r.returncode == 0

        lo, hi = 1024, 131072
        if works(lo) and not works(hi):
            while hi - lo > 32:
                mid = (lo + hi) // 2 // 32 * 32
                lo, hi = (mid, hi) if works(mid) else (lo, mid)
            print(f"DeepGEMM paged limit: last ok {lo}, first fail {hi}", flush=True)
