"""The oracle's memory bound: peak extra memory follows block_bytes, not the token count.

Each measurement runs in a fresh subprocess: it builds the inputs, warms up, resets the
peak-RSS counter (/proc/self/clear_refs), runs one call and reports VmHWM - VmRSS(before).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
MiB = 2**20
# Gather chunks, index temporaries and the allocator's slack, independent of tokens and block.
SLACK = 96 * MiB
# One thread: on a shared 2-core runner, OpenMP barriers stall whenever another process runs.
THREADS = int(os.environ.get("DSV4BENCH_MEMTEST_THREADS", "1"))

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
    tokens, h, topk, block_bytes = int(tokens), int(h), int(topk), int(block_bytes)
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
    block_bytes: int,
    device: str = "cpu",
    threads: int = THREADS,
) -> dict:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    args = [mode, tokens, h, topk, block_bytes, device, threads]
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, *map(str, args)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"{mode} tokens={tokens} h={h} topk={topk} block={block_bytes // MiB} MiB: {result}")
    return result


needs_proc = pytest.mark.skipif(
    not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc/self/clear_refs"
)


@needs_proc
@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_peak_memory_is_independent_of_token_count(mode: str) -> None:
    block = 32 * MiB
    small = measure(mode, 1024, 16, 128, block)
    large = measure(mode, 8192, 16, 128, block)
    for r in (small, large):
        assert r["extra"] - r["out_bytes"] < 1.25 * block + SLACK
    # 8x the tokens: the memory beyond the outputs stays the same.
    assert (
        abs((large["extra"] - large["out_bytes"]) - (small["extra"] - small["out_bytes"]))
        < 32 * MiB
    )


@needs_proc
def test_peak_memory_follows_block_bytes() -> None:
    small = measure("prefill", 4096, 16, 256, 16 * MiB)
    large = measure("prefill", 4096, 16, 256, 128 * MiB)
    assert small["extra"] - small["out_bytes"] < 1.25 * 16 * MiB + SLACK
    assert large["extra"] - large["out_bytes"] < 1.25 * 128 * MiB + SLACK
    assert large["extra"] > small["extra"] + 64 * MiB


@needs_proc
@pytest.mark.slow
def test_full_size_prefill_on_cpu() -> None:
    """The FlashMLA prefill benchmark shape: 32768 tokens x 64 heads x top-k 640, d 512."""
    from reference.attention import BLOCK_BYTES

    r = measure("prefill", 32768, 64, 640, BLOCK_BYTES)
    assert r["extra"] - r["out_bytes"] < 1.25 * BLOCK_BYTES + SLACK


@pytest.mark.gpu
def test_full_size_prefill_on_gpu() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from reference.attention import BLOCK_BYTES

    r = measure("prefill", 32768, 64, 640, BLOCK_BYTES, device="cuda")
    assert r["extra"] - r["out_bytes"] < 1.25 * BLOCK_BYTES + SLACK
    r = measure("decode", 8192, 128, 512, BLOCK_BYTES, device="cuda")
    assert r["extra"] - r["out_bytes"] < 1.25 * BLOCK_BYTES + SLACK
