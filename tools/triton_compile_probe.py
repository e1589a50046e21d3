"""Compile the attention kernels (Triton, and the Gluon producer/consumer kernel) for sm90 on a
machine without a GPU and print what the compiler reports (registers, spills, shared memory,
whether the key loop's loads became async copies, the registers each Gluon partition is
given), for launch shapes worth timing. Costs no device time:

    python3 tools/triton_compile_probe.py [--keep DIR]
"""

from __future__ import annotations

import argparse
import re
import sys

import torch

from dsv4bench.backends.triton import attention as ta
from reference import layouts

PTR = {torch.bfloat16: "*bf16", torch.uint8: "*u8", torch.int16: "*i16", torch.float32: "*fp32",
       torch.int32: "*i32", torch.int64: "*i64"}  # fmt: skip


def _plan(layout: str, heads: int, cfg, op: str = "decode", extra: bool = False):
    d = 576 if layout == "v32" else 512
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, 256, (2, 1, 128), dtype=torch.int32, generator=g)
    if op == "decode":
        kv = torch.randn(256, d, generator=g).to(torch.bfloat16)
        cache = layouts.quantize_v32(kv, 64) if layout == "v32" else layouts.quantize_v4(kv, 64)
        q = torch.randn(2, 1, heads, d, generator=g).to(torch.bfloat16)
        kw = {}
        if extra:
            kw = dict(extra_kv=cache, extra_indices=idx, attn_sink=torch.zeros(heads))
        return ta.plan_attention(q, cache, idx, 0.04, layout=layout, config=cfg, splits=1, **kw)
    d = 576 if layout == "bf16-576" else 512
    kv = torch.randn(256, 1, d, generator=g).to(torch.bfloat16)
    q = torch.randn(2, heads, d, generator=g).to(torch.bfloat16)
    return ta.plan_attention(q, kv, idx, 0.04, layout="bf16", op="prefill", config=cfg, splits=1)


def _attrs(a, path: tuple, out: dict) -> dict:
    """Divisibility of pointers and ints by 16, as the launcher's specialization finds it."""
    if isinstance(a, tuple):
        for j, f in enumerate(a):
            _attrs(f, (*path, j), out)
    elif isinstance(a, torch.Tensor) or (isinstance(a, int) and a and a % 16 == 0):
        out[path] = [["tt.divisibility", 16]]
    return out


def _sig(a):
    """Triton's signature string of one argument (a NamedTuple of them for a descriptor)."""
    if isinstance(a, tuple):
        return type(a)(*(_sig(f) for f in a))
    if isinstance(a, torch.Tensor):
        return PTR[a.dtype]
    return "fp32" if isinstance(a, float) else "i32"


def _ptxas(ptx: str) -> tuple[str, str]:
    """(registers, spill stores+loads) from Triton's own ptxas run on the PTX."""
    import os
    import subprocess
    import tempfile

    import triton

    exe = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
    with tempfile.TemporaryDirectory() as d:
        with open(f"{d}/k.ptx", "w") as f:
            f.write(ptx)
        r = subprocess.run([exe, "-arch=sm_90a", "-v", f"{d}/k.ptx", "-o", f"{d}/k.cubin"],
                           capture_output=True, text=True)  # fmt: skip
    text = r.stderr + r.stdout
    regs = re.search(r"Used (\d+) registers", text)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    return (regs.group(1) if regs else "?", f"{spill.group(1)}/{spill.group(2)}" if spill else "?")


def compile_sm90(plan, gluon=None):
    """The plan's attention kernel compiled for sm90 (no GPU needed): Triton's CompiledKernel.
    With gluon (a Config with gluon=True) the Gluon kernel at that config, else the plan's."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    meta = dict(plan.meta, EXACT=False)
    opts = {"num_warps": plan.info["num_warps"], "num_stages": plan.info["num_stages"]}
    if gluon is not None:
        from triton.experimental.gluon._runtime import GluonASTSource

        from dsv4bench.backends.triton.kernels import gluon_attention

        fn, make = gluon_attention.KERNELS["attn"], GluonASTSource
        meta = ta.gluon_meta(meta, gluon)
        opts = ta.gluon_options(gluon)
    else:
        from dsv4bench.backends.triton.kernels import attention

        fn, make = JITFunction(attention.KERNELS["attn"]), ASTSource
    args = plan.args
    if gluon is not None and not plan.info["gluon"]:  # the Gluon kernel's items
        args += (plan.grid[0] * plan.grid[2],)
    sig = {name: _sig(a) for name, a in zip(fn.arg_names, args, strict=False)}
    sig |= {name: "constexpr" for name in meta}
    attrs: dict = {}
    for i, a in enumerate(args):
        _attrs(a, (i,), attrs)
    src = make(fn, sig, constexprs=meta, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)


def partition_regs(ptx: str) -> list[int]:
    """The register counts a warp-specialized kernel's partitions set (setmaxnreg), in order."""
    return [int(n) for n in re.findall(r"setmaxnreg\.(?:inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx)]


def compile_report(plan, keep: str | None = None, gluon=None) -> str:
    """Compile the plan's attention kernel for sm90 (no GPU needed) and summarize it."""
    k = compile_sm90(plan, gluon)
    info = plan.info
    ttgir, ptx = k.asm["ttgir"], k.asm["ptx"]
    asyncs = len(re.findall(r"async_copy_global_to_local", ttgir))
    wgmma = len(re.findall(r"wgmma.mma_async", ptx))
    regs, spills = _ptxas(ptx)
    if keep:
        tag = (
            f"{keep}/h{info['block_h']}n{info['block_n']}w{info['num_warps']}s{info['num_stages']}"
        )
        with open(tag + ".ttgir", "w") as f:
            f.write(ttgir)
    ws = f" partitions' regs {sorted(set(partition_regs(ptx)))}" if gluon is not None else ""
    return (f"regs {regs} spill {spills} shared {k.metadata.shared} "
            f"async_copies {asyncs} wgmma {wgmma}{ws}")  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep")
    a = ap.parse_args()
    C = ta.Config
    shapes = [
        ("v32", 128, "decode", False, [C(64, 64, 8, 1), C(64, 64, 8, 2), C(64, 32, 8, 2)]),
        ("v4", 128, "decode", True, [C(64, 64, 8, 2), C(64, 64, 8, 1), C(64, 32, 8, 2)]),
        ("v4", 16, "decode", True, [C(16, 64, 4, 2)]),
        ("bf16-576", 128, "prefill", False, [C(64, 64, 8, 2), C(64, 32, 8, 3)]),
        ("bf16", 32, "prefill", False, [C(32, 64, 4, 2)]),
    ]
    for layout, heads, op, extra, cfgs in shapes:
        d_qk = 512 if layout in ("v4", "bf16") else 576
        gluon = ta.config_for(heads, "bf16" if op == "prefill" else layout, True, d_qk)
        for cfg in cfgs + ([gluon] if gluon.gluon else []):
            try:
                base = ta.Config(64, 64, 8, 1) if cfg.gluon else cfg
                plan = _plan(layout, heads, base, op, extra)
                rep = compile_report(plan, a.keep, cfg if cfg.gluon else None)
            except Exception as e:
                rep = f"failed {type(e).__name__}: {str(e)[:300]}"
            print(f"{op} {layout} h{heads} {cfg}: {rep}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
