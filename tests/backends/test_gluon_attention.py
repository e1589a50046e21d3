"""The Gluon producer/consumer attention kernel (backends/triton/kernels/gluon_attention.py)
without a GPU: Triton compiles it for sm90 here (ptxas included), so the launch contract the
host builds (descriptors, constexprs, register split, shared memory) is checked on every
layout; its numerics run only on a GPU
(tests/backends/test_triton_attention.py::test_decode_on_cuda_both_kernels and the gpu-marked
suite tests, which take it by default there)."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

triton = pytest.importorskip("triton", reason="needs triton (pip install triton)")

from dsv4bench.backends.base import Unsupported  # noqa: E402
from dsv4bench.backends.triton import attention as ta  # noqa: E402
from dsv4bench.backends.triton import jit as triton_jit  # noqa: E402
from dsv4bench.backends.triton import tuning  # noqa: E402
from tools import triton_compile_probe as probe  # noqa: E402

needs_gluon = pytest.mark.skipif(not triton_jit.has_gluon(), reason="this Triton has no Gluon")


@pytest.fixture(autouse=True)
def fresh_triton_cache(tmp_path, monkeypatch):
    """Compile for real every time: a cached kernel is not traced, and tracing is what an
    earlier interpreted launch could have broken (triton_jit.interpreting restores it)."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))


SM90_SMEM = 232448  # bytes of shared memory a CTA may take on sm90


@needs_gluon
@pytest.mark.parametrize(
    "layout,heads,op,extra,wgmma",
    [
        # split_pv: QK 512/16 + rope 64/16, PV 64/16 for the lead's 128 columns and the
        # other's 256 and 128 (lead_cols 128)
        ("v32", 128, "decode", False, 48),
        ("v4", 64, "decode", True, 44),  # no rope tail: d_qk 512
        ("bf16-576", 128, "prefill", False, 44),
        ("bf16", 64, "prefill", False, 40),
        ("v4", 16, "decode", True, 48),  # narrow: QK 32 + PV 512/128 m-tiles x 4 k-steps
        ("v32", 8, "decode", False, 136),  # alternate: 2 consumers x (QK 36 + PV 512/64 x 4)
        ("v32", 12, "decode", True, 136),  # ... the pipelined gather over both caches
        ("v32", 32, "decode", False, 136),  # ... 32 heads a program
        ("bf16-576", 32, "prefill", False, 136),
        ("bf16-576", 16, "prefill", False, 136),
        ("bf16", 8, "prefill", False, 128),
        ("bf16", 32, "prefill", False, 128),  # alternate: 2 x (QK 32 + PV 32)
    ],
)
def test_gluon_kernel_compiles_for_sm90(layout, heads, op, extra, wgmma):
    d_qk = 512 if layout in ("v4", "bf16") else 576
    cfg = tuning.config_for(heads, "bf16" if op == "prefill" else layout, True, d_qk)
    assert cfg.gluon
    plan = probe._plan(layout, heads, tuning.Config(64, 64, 8, 1), op, extra)
    k = probe.compile_sm90(plan, cfg)
    ptx = k.asm["ptx"]
    assert k.metadata.shared <= SM90_SMEM
    assert ptx.count("wgmma.mma_async") == wgmma
    # the L2 prefetch of the next block: 4 lines a producer thread (64 keys x 8 / 128)
    assert ptx.count("prefetch.global.L2") == (4 if cfg.prefetch else 0)
    assert cfg.prefetch == (layout in ("v32", "v4") and not cfg.pipe)
    assert cfg.narrow == (heads <= 32 and cfg.block_h < 64)
    regs = probe.partition_regs(ptx)
    threads = 32 * (8 + tuning.GLUON_PRODUCER_WARPS)
    assert threads * tuning.gluon_maxnreg() <= 65536
    if cfg.alternate or cfg.split_pv:  # two consumer partitions of 4 warps, the producer
        consumers = tuning.consumer_regs(cfg.producer_regs)  # (default) the rest
        producer = 512 - 2 * consumers
        if cfg.split_pv:  # a 64 x 256 fp32 acc each, or the lead 64 x 128 and the other 384
            lead, follow = tuning.split_pv_regs(cfg)
            assert lead in regs and follow in regs and lead + follow == 2 * consumers
            assert min(lead, follow) >= (192 if cfg.lead_cols == 256 else 160)
        else:  # a 512 x NH fp32 acc (alternate)
            assert consumers in regs and consumers >= 4 * cfg.block_h + 64
        assert min(regs) <= producer  # the default partition's share, set by the compiler
    else:
        producer, consumers = cfg.producer_regs, max(r for r in regs if r < 240)
        assert producer in regs and consumers >= 192  # the consumers hold a 64 x 256 fp32 acc
        assert 256 * consumers + 128 * producer <= 65536
    spill = int(probe._ptxas(ptx)[1].split("/")[0]) if cfg.pipe or cfg.persist else 0
    # two chunks in flight: at 120 producer registers ptxas spilled 96-156 bytes
    assert not cfg.pipe or spill <= 32, "the pipelined producer spills"
    # a constant key buffer in the resident consumers' loops hoisted the dots' descriptors
    # out of them: 880-1656 bytes
    assert not cfg.persist or spill <= 64, "the resident consumers spill"


def test_config_picks_gluon_only_where_measured_faster():
    assert tuning.config_for(8, "v32", True).gluon and tuning.config_for(8, "v4", True).gluon
    assert (
        tuning.config_for(128, "bf16", True).gluon
        and not tuning.config_for(128, "bf16", True).narrow
    )
    for h in (3, 8, 16, 24, 32):  # bf16 rows up to 32 heads: alternate, 16 or 32 heads a program
        for d_qk in (512, 576):
            c = tuning.config_for(h, "bf16", True, d_qk)
            assert c.alternate and c.block_h == (16 if h <= 16 else 32)
    for h in (3, 8, 16, 24, 32):  # V3.2 decode: alternate; up to 16 heads the pipelined gather
        c = tuning.config_for(h, "v32", True)
        assert c.alternate and c.block_h == (16 if h <= 16 else 32)
        assert (c.pipe, c.chunk) == ((2, 16) if h <= 16 else (0, 64))
    assert (
        not tuning.config_for(33, "v32", True).narrow
        and not tuning.config_for(32, "v4", True).narrow
    )
    assert (
        tuning.config_for(16, "v4", True).narrow and not tuning.config_for(16, "v4", True).alternate
    )
    assert not any(tuning.config_for(h, lay, True, d).pipe for h in (8, 16, 32, 64)
                   for lay in ("v4", "bf16") for d in (512, 576))  # fmt: skip
    picks = [tuning.config_for(h, lay, True, d) for h in (8, 16, 32, 64)
             for lay in ("v32", "v4", "bf16") for d in (512, 576)]  # fmt: skip
    assert all(c.persist == (c.alternate and c.chunk == 64 and c.idx_ahead) for c in picks)
    # the copies complete the full barrier: resident, and on the 64-head tile's bf16 rows
    assert [c.async_fill for c in picks] == [
        c.persist or (c.block_h == 64 and lay == "bf16")
        for h in (8, 16, 32, 64)
        for lay in ("v32", "v4", "bf16")
        for d in (512, 576)
        for c in [tuning.config_for(h, lay, True, d)]
    ]
    assert all(c.split_pv == (c.block_h == 64) for c in picks)  # the 64-head tile: split_pv
    assert not any(
        tuning.config_for(h, lay).gluon for h in (8, 128) for lay in ("v32", "v4", "bf16")
    )


@pytest.mark.parametrize("layout,pipe", [("v4", 1), ("v32", 3)])
def test_gluon_meta_refuses_a_pipe_it_cannot_run(layout, pipe):
    """pipe is the V3.2 gather's (1 or 2 chunks in flight); anything else is refused."""
    plan = probe._plan(layout, 8, tuning.Config(64, 64, 8, 1), "decode")
    cfg = dataclasses.replace(tuning.config_for(8, layout, True), pipe=pipe, idx_ahead=False)
    with pytest.raises(ValueError, match="pipe 1 or 2 only on V3.2"):
        tuning.gluon_meta(dict(plan.meta, EXACT=False), cfg)


@pytest.mark.parametrize("layout,op,prefetch", [("v4", "decode", 3), ("v32", "decode", 1),
                                               ("bf16", "prefill", 1)])  # fmt: skip
def test_gluon_meta_refuses_a_prefetch_it_cannot_run(layout, op, prefetch):
    """prefetch is 1 or 2 blocks ahead in the block-at-a-time producer: not with the pipelined
    V3.2 gather (8 heads) nor the resident kernel (bf16 rows, 8 heads)."""
    plan = probe._plan(layout, 8, tuning.Config(64, 64, 8, 1), op)
    cfg = tuning.config_for(8, "bf16" if op == "prefill" else layout, True, 512)
    cfg = dataclasses.replace(cfg, prefetch=prefetch)
    with pytest.raises(ValueError, match="prefetch 1 or 2 blocks ahead without pipe or persist"):
        tuning.gluon_meta(dict(plan.meta, EXACT=False), cfg)


@needs_gluon
def test_key_bias_moves_the_lead_warpgroups_index_loads_to_the_producer():
    """With key_bias the lead's index loads a block (its 16 score columns, 8 loads of 2) are
    gone; the producer takes the mask's indices from idx_s (idx_ahead loaded them): 39
    global loads in the PTX, not 47."""
    plan = probe._plan("v32", 128, tuning.Config(64, 64, 8, 1), "decode")
    cfg = tuning.config_for(128, "v32", True)
    assert cfg.key_bias and cfg.split_pv
    loads = {}
    for key_bias in (True, False):
        k = probe.compile_sm90(plan, dataclasses.replace(cfg, key_bias=key_bias))
        loads[key_bias] = len(re.findall(r"ld\.global", k.asm["ptx"]))
        assert k.metadata.shared <= SM90_SMEM
    assert loads[True] <= loads[False] - 4, loads


@pytest.mark.parametrize("change", [dict(split_pv=False), dict(split_pv=False, key_bias=False),
                                    dict(lead_cols=64), dict(pipe=2, idx_ahead=False)])  # fmt: skip
def test_gluon_meta_refuses_a_lead_warpgroup_option_without_split_pv(change):
    """key_bias (the key mask for split_pv's lead) and lead_cols (its PV columns, 128 or 256)
    mean nothing without split_pv's lead warpgroup; the pipelined V3.2 gather writes no mask."""
    plan = probe._plan("v32", 128, tuning.Config(64, 64, 8, 1), "decode")
    cfg = tuning.config_for(128, "v32", True)
    assert cfg.key_bias and cfg.lead_cols == 128
    with pytest.raises(ValueError, match=r"key_bias \(not with pipe\) and lead_cols 128 with"):
        tuning.gluon_meta(dict(plan.meta, EXACT=False), dataclasses.replace(cfg, **change))


@pytest.mark.parametrize("change", [dict(alternate=False, narrow=False, block_h=64),
                                    dict(async_fill=False), dict(split=True)])  # fmt: skip
def test_gluon_meta_refuses_a_resident_kernel_it_cannot_run(change):
    """persist takes whole tokens on the alternate consumers over bf16 rows, one split."""
    plan = probe._plan("bf16", 8, tuning.Config(64, 64, 8, 1), "prefill")
    meta = dict(plan.meta, EXACT=False, SPLIT=change.pop("split", False))
    cfg = dataclasses.replace(tuning.config_for(8, "bf16", True, 512), **change)
    assert cfg.persist
    with pytest.raises(ValueError, match="persist only alternate and async_fill"):
        tuning.gluon_meta(meta, cfg)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_resident_grid_is_one_program_an_sm():
    q = torch.randn(500, 24, 576, device="cuda").to(torch.bfloat16)
    kv = torch.randn(300, 1, 576, device="cuda").to(torch.bfloat16)
    idx = torch.randint(0, 300, (500, 1, 128), dtype=torch.int32, device="cuda")
    plan = ta.plan_attention(q, kv, idx, 0.04, layout="bf16", op="prefill",
                             config=tuning.config_for(24, "bf16", True, 576))  # fmt: skip
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert plan.grid == (min(sms, 500), 1, 1) and plan.args[-1] == 500


def test_cpu_never_takes_the_gluon_kernel():
    q = torch.randn(1, 1, 4, 576).to(torch.bfloat16)
    from reference import layouts

    cache = layouts.quantize_v32(torch.randn(64, 576).to(torch.bfloat16), 64)
    idx = torch.arange(64, dtype=torch.int32).view(1, 1, 64)
    plan = ta.plan_attention(q, cache, idx, 0.04, layout="v32")
    assert plan.info["gluon"] is False
    with pytest.raises(ValueError, match="Gluon kernel runs on a GPU"):
        ta.plan_attention(
            q, cache, idx, 0.04, layout="v32", config=tuning.config_for(4, "v32", True)
        )
    if triton_jit.has_gluon():
        with pytest.raises(Unsupported, match="needs an sm90 GPU"):
            triton_jit.kernel("gluon_attention", "attn", torch.device("cpu"))
