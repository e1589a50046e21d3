"""Compile the Triton attention kernel for sm90 on a machine without a GPU and print what the
compiler reports (registers, spills, shared memory, whether the key loop's loads became async
copies), for launch shapes worth timing. Costs no device time:

    python3 tools/triton_compile_probe.py [--keep DIR]
"""

from __future__ import annotations

import argparse
import re
import sys

import torch

from dsv4bench.backends import triton_attention as ta
from reference import layouts

PTR = {torch.bfloat16: "*bf16", torch.uint8: "*u8", torch.int16: "*i16", torch.float32: "*fp32",
       torch.int32: "*i32", torch.int64: "*i64"}  # fmt: skip


def _launch(layout: str, heads: int, cfg, op: str = "decode", extra: bool = False):
    d = 576 if layout in ("v32", "bf16576") else 512
    g = torch.Generator().manual_seed(0)
    if op == "decode":
        kv = torch.randn(256, d, generator=g).to(torch.bfloat16)
        cache = layouts.quantize_v32(kv, 64) if layout == "v32" else layouts.quantize_v4(kv, 64)
        q = torch.randn(2, 1, heads, d, generator=g).to(torch.bfloat16)
        idx = torch.randint(0, 256, (2, 1, 128), dtype=torch.int32, generator=g)
        kw = {}
        if extra:
            kw = dict(extra_kv=cache, extra_indices=idx, attn_sink=torch.zeros(heads))
        return ta.attention_launcher(q, cache, idx, 0.04, config=cfg, splits=1, **kw)
    kv = torch.randn(256, 1, d, generator=g).to(torch.bfloat16)
    q = torch.randn(2, heads, d, generator=g).to(torch.bfloat16)
    idx = torch.randint(0, 256, (2, 1, 128), dtype=torch.int32, generator=g)
    return ta.attention_launcher(q, kv, idx, 0.04, op="prefill", config=cfg, splits=1)


def _ptxas(ptx: str) -> tuple[str, str]:
    """(registers, spill stores+loads) from Triton's own ptxas run on the PTX."""
    import os
    import subprocess
    import tempfile

    import triton

    exe = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
    with tempfile.TemporaryDirectory() as d:
        open(f"{d}/k.ptx", "w").write(ptx)
        r = subprocess.run([exe, "-arch=sm_90a", "-v", f"{d}/k.ptx", "-o", f"{d}/k.cubin"],
                           capture_output=True, text=True)  # fmt: skip
    text = r.stderr + r.stdout
    regs = re.search(r"Used (\d+) registers", text)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    return (regs.group(1) if regs else "?", f"{spill.group(1)}/{spill.group(2)}" if spill else "?")


def compile_report(launch, keep: str | None = None) -> str:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    grid, args, meta, _ = launch.attn_call
    cfg = launch.info
    meta = dict(meta, EXACT=False)
    fn = JITFunction(ta._SOURCES["attn"])
    ta._load()
    sig, attrs = {}, {}
    names = fn.arg_names
    for i, (name, a) in enumerate(zip(names, args, strict=False)):
        if isinstance(a, torch.Tensor):
            sig[name] = PTR[a.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(a, float):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
            if a % 16 == 0 and a:
                attrs[(i,)] = [["tt.divisibility", 16]]
    for name, v in meta.items():
        sig[name] = "constexpr"
    src = ASTSource(fn, sig, constexprs=meta, attrs=attrs)
    opts = {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]}
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
    ttgir = k.asm["ttgir"]
    ptx = k.asm["ptx"]
    asyncs = len(re.findall(r"async_copy_global_to_local", ttgir))
    wgmma = len(re.findall(r"wgmma.mma_async", ptx))
    regs, spills = _ptxas(ptx)
    if keep:
        tag = f"{keep}/h{cfg['block_h']}n{cfg['block_n']}w{cfg['num_warps']}s{cfg['num_stages']}"
        open(tag + ".ttgir", "w").write(ttgir)
    return (f"regs {regs} spill {spills} shared {k.metadata.shared} "
            f"async_copies {asyncs} wgmma {wgmma}")  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep")
    a = ap.parse_args()
    C = ta.Config
    shapes = [
        ("v32", 128, "decode", False, [C(64, 64, 8, 1, False), C(64, 64, 8, 1, False, 2),
                                       C(64, 32, 8, 1, False, 3), C(64, 32, 8, 1, False, 2)]),
        ("v4", 128, "decode", True, [C(64, 64, 8, 2, False), C(64, 64, 8, 1, False, 2),
                                     C(64, 64, 8, 1, False, 3), C(64, 32, 8, 1, False, 3)]),
        ("bf16", 128, "prefill", False, [C(64, 64, 8, 2, False), C(64, 32, 8, 3, False),
                                         C(64, 32, 8, 1, False, 3)]),
    ]  # fmt: skip
    for layout, heads, op, extra, cfgs in shapes:
        for cfg in cfgs:
            try:
                rep = compile_report(_launch(layout, heads, cfg, op, extra), a.keep)
            except Exception as e:
                rep = f"failed {type(e).__name__}: {str(e)[:300]}"
            print(f"{op} {layout} h{heads} {cfg}: {rep}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
