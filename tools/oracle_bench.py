"""Time and peak extra memory of one oracle call (reference/attention.py), each in a fresh process.

    python tools/oracle_bench.py --device cuda prefill:32768:64:640 decode:8192:128:512
    python tools/oracle_bench.py --block-mib 32 decode:8192:16:128

A shape is MODE:TOKENS:HEADS:TOPK, d_qk 512 (V4), over 32768 kv tokens. prefill is the bf16
sparse prefill; decode reads a V4 FP8 cache with an extra cache of TOPK/2 and sinks. Each shape
runs in its own process: build the inputs, warm up, reset the peak counter, run one call and
report `extra` (peak memory beyond what was allocated before the call: outputs included),
`out_bytes`, and `seconds`. On the GPU the peak is torch's allocator peak; on the CPU it is
VmHWM after /proc/self/clear_refs (Linux). tests/reference/test_memory.py asserts on these numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MiB = 2**20

SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    import torch
    from reference.attention import sparse_mla_decode, sparse_mla_prefill
    from reference.layouts import quantize_v4

    def status(key):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
        raise KeyError(key)

    mode, tokens, h, topk, block_bytes, device, threads = sys.argv[1:8]
    tokens, h, topk = int(tokens), int(h), int(topk)
    block_bytes = None if block_bytes == "default" else int(block_bytes)
    device = torch.device(device)
    torch.set_num_threads(int(threads))
    gen = torch.Generator().manual_seed(0)
    s_kv = 32768
    if mode == "prefill":
        q = torch.randn(tokens, h, 512, generator=gen).to(torch.bfloat16)
        kv = torch.randn(s_kv, 1, 512, generator=gen).to(torch.bfloat16)
        idx = torch.randint(-1, s_kv, (tokens, 1, topk), generator=gen, dtype=torch.int32)
        q, kv, idx = (t.to(device) for t in (q, kv, idx))
        run = lambda n: sparse_mla_prefill(q[:n], kv, idx[:n], 512**-0.5, block_bytes=block_bytes)
        out_bytes = tokens * h * (512 + 2) * 4
    else:
        cache = quantize_v4(torch.randn(s_kv, 512, generator=gen), 256)
        q = torch.randn(tokens, 1, h, 512, generator=gen).to(torch.bfloat16)
        idx = torch.randint(-1, s_kv, (tokens, 1, topk), generator=gen, dtype=torch.int32)
        extra = torch.randint(-1, s_kv, (tokens, 1, topk // 2), generator=gen, dtype=torch.int32)
        sink = torch.zeros(h)
        cache, q, idx, extra, sink = (t.to(device) for t in (cache, q, idx, extra, sink))
        run = lambda n: sparse_mla_decode(
            q[:n], cache, idx[:n], 512**-0.5, attn_sink=sink, extra_k_cache=cache,
            extra_indices=extra[:n], block_bytes=block_bytes,
        )
        out_bytes = tokens * h * (512 + 1) * 4
    run(64)  # warm-up: libraries, thread pools
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = status("VmRSS")
    start = time.perf_counter()
    result = run(tokens)
    if device.type == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = status("VmHWM")
    seconds = time.perf_counter() - start
    del result
    print(json.dumps({"extra": peak - before, "out_bytes": out_bytes, "seconds": seconds}))
    """
)


def measure(
    mode: str,
    tokens: int,
    h: int,
    topk: int,
    block_bytes: int | None,
    device: str = "cpu",
    threads: int = 1,
) -> dict:
    """One call's numbers (see the module docstring); block_bytes None: the device default."""
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    block = "default" if block_bytes is None else block_bytes
    args = [mode, tokens, h, topk, block, device, threads]
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, *map(str, args)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"oracle_bench {mode}:{tokens}:{h}:{topk} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _shape(text: str) -> tuple[str, int, int, int]:
    parts = text.split(":")
    if (
        len(parts) != 4
        or parts[0] not in ("prefill", "decode")
        or not all(p.isdigit() for p in parts[1:])
    ):
        raise argparse.ArgumentTypeError(f"expected MODE:TOKENS:HEADS:TOPK, got {text!r}")
    return parts[0], int(parts[1]), int(parts[2]), int(parts[3])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("shape", nargs="+", type=_shape, help="MODE:TOKENS:HEADS:TOPK")
    p.add_argument("--device", default="cpu")
    p.add_argument("--block-mib", type=int, help="block budget (default: the device's)")
    p.add_argument("--threads", type=int, default=1, help="CPU threads")
    args = p.parse_args()
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            p.error(f"--device {args.device}: this machine has no CUDA GPU")
    block = None if args.block_mib is None else args.block_mib * MiB
    for mode, tokens, h, topk in args.shape:
        r = measure(mode, tokens, h, topk, block, args.device, args.threads)
        scratch = r["extra"] - r["out_bytes"]
        line = {"mode": mode, "tokens": tokens, "heads": h, "topk": topk, "device": args.device}
        line |= {"block_mib": args.block_mib, **r, "scratch_gib": round(scratch / 2**30, 3)}
        print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
