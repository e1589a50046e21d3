"""Probe FlashInfer's FA3 MLA wrapper on an H100: what the sm90 backend relies on.

Prints, per variant (kpe 64 / 0, kv bf16 / e4m3): the first plan() time (JIT), a second plan()
time, accuracy against an fp32 reference over the exact values the kernel reads, the lse base,
what a row with no key gives, which head counts run, and whether strided ckv/kpe views work.
"""

import inspect  # noqa: I001
import math
import sys
import time

import torch

t0 = time.perf_counter()
import flashinfer  # noqa: E402
from flashinfer.mla import BatchMLAPagedAttentionWrapper  # noqa: E402

print("import_s", round(time.perf_counter() - t0, 2), "version", flashinfer.__version__, flush=True)
print("plan", inspect.signature(BatchMLAPagedAttentionWrapper.plan))
print("run", inspect.signature(BatchMLAPagedAttentionWrapper.run))
dev = "cuda"
ws = torch.empty(128 << 20, dtype=torch.uint8, device=dev)


def ref(qn, qp, ckv, kpe, idx_rows, scale):
    outs, lses = [], []
    for t, idx in enumerate(idx_rows):
        if len(idx) == 0:
            outs.append(torch.zeros(qn.shape[1], ckv.shape[-1], device=dev))
            lses.append(torch.full((qn.shape[1],), math.inf, device=dev))
            continue
        k = torch.cat([ckv[idx, 0].float(), kpe[idx, 0].float()], -1)
        q = torch.cat([qn[t].float(), qp[t].float()], -1)
        lg = q @ k.T * scale
        lse = torch.logsumexp(lg, -1)
        outs.append(torch.softmax(lg, -1) @ ckv[idx, 0].float())
        lses.append(lse)
    return torch.stack(outs), torch.stack(lses)


def cosd(a, b):
    a, b = a.double(), b.double()
    return float(((a - b) ** 2).sum() / ((a * a).sum() + (b * b).sum()))


def problem(h, kpe_dim, kv, T=37, N=5000, k=256, empty_row=True, strided=True):
    g = torch.Generator(device=dev).manual_seed(h * 7 + kpe_dim)
    d = 512 + kpe_dim
    rows = torch.randn(N, 1, d, generator=g, device=dev)
    lens = torch.randint(1, k + 1, (T,), generator=g, device=dev)
    if empty_row:
        lens[3] = 0
    idx_rows = [torch.randperm(N, generator=g, device=dev)[: int(n)] for n in lens]
    qn = torch.randn(T, h, 512, generator=g, device=dev).bfloat16()
    qp = torch.randn(T, h, kpe_dim, generator=g, device=dev).bfloat16()
    extra = {}
    if kv == "bf16":
        full = rows.bfloat16()
        reads = full.float()
    else:
        # ckv per-token per-128 scale (pow2), kpe per-tensor pow2 scale
        ck = rows[..., :512].view(N, 1, 4, 128)
        s = torch.exp2(torch.ceil(torch.log2(ck.abs().amax(-1) / 448)))
        ck8 = (ck / s[..., None]).to(torch.float8_e4m3fn)
        kp = rows[..., 512:]
        ks = 2.0 ** math.ceil(math.log2(float(kp.abs().max()) / 448)) if kpe_dim else 1.0
        kp8 = (kp / ks).to(torch.float8_e4m3fn)
        full = torch.cat([ck8.view(N, 1, 512), kp8], -1)
        reads = torch.cat([(ck8.float() * s[..., None]).view(N, 1, 512), kp8.float() * ks], -1)
        extra = dict(ckv_scale_arr=s.contiguous(), kpe_scale=ks)
    if strided:
        ckv, kpe = full[..., :512], full[..., 512:]
    else:
        ckv, kpe = full[..., :512].contiguous(), full[..., 512:].contiguous()
    return qn, qp, ckv, kpe, reads, idx_rows, lens, extra


def one(h, kpe_dim, kv, **kw):
    qn, qp, ckv, kpe, reads, idx_rows, lens, extra = problem(h, kpe_dim, kv, **kw)
    T = qn.shape[0]
    scale = (512 + (64 if kpe_dim else 0)) ** -0.5
    w = BatchMLAPagedAttentionWrapper(ws, backend="fa3")
    qo = torch.arange(T + 1, dtype=torch.int32)
    kvp = torch.zeros(T + 1, dtype=torch.int32)
    kvp[1:] = torch.cumsum(lens.cpu(), 0)
    ind = (
        torch.cat(idx_rows).int() if int(kvp[-1]) else torch.zeros(1, dtype=torch.int32, device=dev)
    )
    kvdt = torch.bfloat16 if kv == "bf16" else torch.float8_e4m3fn
    times = []
    for _ in range(2):
        torch.cuda.synchronize()
        t = time.perf_counter()
        w.plan(
            qo, kvp, ind, lens.int().cpu(), h, 512, kpe_dim, 1, False, scale, torch.bfloat16, kvdt
        )
        times.append(time.perf_counter() - t)
    if "ckv_scale_arr" in extra and ckv.shape[:-1] != extra["ckv_scale_arr"].shape[:-1]:
        pass
    out, lse = w.run(qn, qp, ckv, kpe, return_lse=True, return_lse_base_on_e=True, **extra)
    out2, lse2 = w.run(qn, qp, ckv, kpe, return_lse=True, **extra)
    torch.cuda.synchronize()
    ro, rl = ref(qn, qp, reads[..., :512], reads[..., 512:], idx_rows, scale)
    ok = lens > 0
    print(
        f"h={h} kpe={kpe_dim} kv={kv} {kw} plan_s={times[0]:.2f},{times[1] * 1e3:.2f}ms "
        f"cos={cosd(ro[ok], out[ok].float()):.2e} "
        f"lse_e={float((rl[ok] - lse[ok]).abs().max()):.2e} "
        f"lse_base2_ratio={float((lse2[ok] / lse[ok]).mean()):.4f} "
        f"empty_row out_abs={float(out[3].float().abs().max()) if not ok[3] else 'n/a'} "
        f"lse={lse[3, :2].tolist() if not ok[3] else 'n/a'}",
        flush=True,
    )


for kpe_dim in (64, 0):
    for kv in ("bf16", "e4m3"):
        try:
            one(128, kpe_dim, kv)
        except Exception as e:
            print("FAIL", 128, kpe_dim, kv, type(e).__name__, str(e)[:300], flush=True)
for h in (1, 4, 8, 16, 20, 32, 64, 96, 128, 256):
    for kv in ("bf16", "e4m3"):
        try:
            one(h, 64, kv, empty_row=False)
        except Exception as e:
            print("FAIL h", h, kv, type(e).__name__, str(e)[:200], flush=True)
for kv in ("bf16", "e4m3"):
    try:
        one(64, 0, kv, strided=False)
    except Exception as e:
        print("FAIL contiguous", kv, type(e).__name__, str(e)[:200], flush=True)
# the V3.2 cache bytes read in place: ckv = e4m3 view of the 656-byte records (stride 656)
try:
    N, T, h = 4096, 16, 64
    rec = torch.randint(0, 255, (N, 1, 656), dtype=torch.uint8, device=dev)
    rec[..., :512] = torch.randn(N, 1, 512, device=dev).to(torch.float8_e4m3fn).view(torch.uint8)
    ckv = rec.view(torch.float8_e4m3fn)[..., :512]
    kpe = torch.randn(N, 1, 64, device=dev).to(torch.float8_e4m3fn)
    sarr = torch.ones(N, 1, 4, device=dev)
    w = BatchMLAPagedAttentionWrapper(ws, backend="fa3")
    lens = torch.full((T,), 512, dtype=torch.int32)
    kvp = torch.arange(T + 1, dtype=torch.int32) * 512
    ind = torch.randint(0, N, (T * 512,), dtype=torch.int32, device=dev)
    w.plan(
        torch.arange(T + 1, dtype=torch.int32),
        kvp,
        ind,
        lens,
        h,
        512,
        64,
        1,
        False,
        0.04,
        torch.bfloat16,
        torch.float8_e4m3fn,
    )
    qn = torch.randn(T, h, 512, device=dev).bfloat16()
    qp = torch.randn(T, h, 64, device=dev).bfloat16()
    o = w.run(qn, qp, ckv, kpe, ckv_scale_arr=sarr, kpe_scale=1.0)
    o2 = w.run(qn, qp, ckv.contiguous(), kpe, ckv_scale_arr=sarr, kpe_scale=1.0)
    torch.cuda.synchronize()
    print("stride656 e4m3 vs contiguous cos", cosd(o.float(), o2.float()), flush=True)
except Exception as e:
    print("FAIL stride656", type(e).__name__, str(e)[:300], flush=True)
print("done", file=sys.stderr)
