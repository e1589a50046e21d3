"""FlashInfer backend on a CPU: support rules, provider discovery, the layout conversions, and
the prepare/run/finish path around fake kernels.

The fakes take exactly the arguments the adapter hands FlashInfer's four entry points, check the
documented shapes, dtypes and limits, and compute the documented answer from the *converted*
inputs with reference.layouts / reference.attention (plain rows read as a flat kv, 64-token
pages read by the oracle itself, the sm120 lse written in base 2 with the sink merged). That the
result matches the oracle on the *original* inputs shows the conversions keep the problem.

NOT run here: the real kernels (flashinfer.decode.trtllm_batch_decode_with_kv_cache_mla,
flashinfer.mla.trtllm_batch_decode_sparse_mla_dsv4, sparse_mla_sm120_decode_dsv4 / _dsv3_2).
flashinfer is not installed and no sm100/sm120 GPU is here, so these tests do not show that an
installed build has these names and argument names, what it really accepts (heads, topk; the
head sets per build and the sm120 page stride are from FlashInfer's source, emulated here), its
numbers, its lse convention, or its speed.
"""

from __future__ import annotations

import math
import sys
import types

import pytest
import torch

from dsv4bench.backends.base import Provider, Unsupported
from dsv4bench.backends.flashinfer import backend as fi
from dsv4bench.backends.flashinfer import convert, sm120
from dsv4bench.backends.flashinfer.backend import FlashInfer, KernelOps
from dsv4bench.cases.case import Case
from dsv4bench.cases.inputs import make_inputs
from dsv4bench.measure import metrics
from reference import attention, layouts

V32 = dict(model="v3.2", d_qk=576, layout="v32", num_heads=128, topk=2048, page_size=64)
V4 = dict(
    model="v4-flash",
    d_qk=512,
    layout="v4",
    num_heads=64,
    topk=128,
    window=128,
    extra_topk=512,
    compress_ratio=4,
    page_size=256,
    sink=True,
)


def make_case(*bases: dict, **kw) -> Case:
    fields = dict(scenario="t", op="decode", model="m", d_qk=512, d_v=512, num_heads=64)
    for b in bases:
        fields.update(b)
    return Case(**{**fields, **kw})


# ---- fake kernels -----------------------------------------------------------------------


class FakeFlashInfer:
    """The four FlashInfer entry points as documented, computed with the reference code."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []
        self.write = True

    def ops(self) -> KernelOps:
        return KernelOps(
            Provider("fake-flashinfer", "0"),
            trtllm_mla=self.trtllm_mla,
            trtllm_dsv4=self.trtllm_dsv4,
            sm120_dsv4=self.sm120_dsv4,
            sm120_dsv32=self.sm120_dsv32,
        )

    @staticmethod
    def _flat(rows: torch.Tensor) -> torch.Tensor:
        """Plain rows [pages, 1, P, d] (HND) -> fp32 [pages*P, d] in slot order."""
        assert rows.dim() == 4 and rows.shape[1] == 1
        return rows.float().reshape(-1, rows.shape[-1])

    @staticmethod
    def _attend(query, kv, idx, bmm1, bmm2, sink, out):
        """out = bmm2 * softmax(bmm1 * q.k) v over the rows idx (-1 skipped) of a flat kv."""
        t = query.shape[0]
        o, _, _ = attention.sparse_mla_prefill(
            query.float()[:, 0], kv[:, None], idx, float(bmm1), d_v=512, attn_sink=sink
        )
        out.copy_((o * bmm2).view(t, 1, *o.shape[1:]).to(out.dtype))

    def trtllm_mla(
        self,
        *,
        query,
        kv_cache,
        workspace_buffer,
        qk_nope_head_dim,
        kv_lora_rank,
        qk_rope_head_dim,
        block_tables,
        seq_lens,
        max_seq_len,
        sparse_mla_top_k,
        out,
        bmm1_scale,
        bmm2_scale,
        sinks,
        backend,
    ):
        self.calls.append(("trtllm_mla", locals()))
        t, q_len, h, d = query.shape
        assert (qk_nope_head_dim, kv_lora_rank, qk_rope_head_dim, backend) == (
            128,
            512,
            64,
            "trtllm-gen",
        )
        assert q_len == 1 and d == 576 and h in fi.HEADS
        assert kv_cache.shape[1] == 1 and kv_cache.shape[-1] == 576
        assert kv_cache.dtype == query.dtype and workspace_buffer.sum() == 0
        k = sparse_mla_top_k
        assert k >= 128 and k % 4 == 0 and max_seq_len == k
        assert block_tables.shape == (t, 1, k) and block_tables.dtype == torch.int32
        assert seq_lens.shape == (t,) and seq_lens.dtype == torch.int32
        assert out.shape == (t, 1, h, 512) and out.dtype == torch.bfloat16
        idx = block_tables[:, 0]
        kv = self._flat(kv_cache)
        valid = torch.arange(k) < seq_lens[:, None]  # seq_lens = the row's length
        assert ((idx >= 0) & (idx < kv.shape[0]))[valid].all(), "a counted index is not a slot"
        sel = torch.where(valid, idx, -1)
        sink = sinks[0] if sinks is not None else None
        if self.write:
            self._attend(query, kv, sel, bmm1_scale, bmm2_scale, sink, out)
        return out

    def trtllm_dsv4(
        self,
        *,
        query,
        swa_kv_cache,
        workspace_buffer,
        sparse_indices,
        compressed_kv_cache,
        sparse_topk_lens,
        seq_lens,
        out,
        bmm1_scale,
        bmm2_scale,
        sinks,
        kv_layout,
    ):
        self.calls.append(("trtllm_dsv4", locals()))
        t, q_len, h, d = query.shape
        assert q_len == 1 and d == 512 and h in fi.HEADS and kv_layout == "HND"
        for pool in (swa_kv_cache, compressed_kv_cache):
            assert pool.shape[1] == 1 and pool.shape[-1] == 512 and pool.dtype == query.dtype
        w = sparse_indices.shape[-1]
        assert sparse_indices.shape == (t, w) and sparse_indices.dtype == torch.int32
        assert w >= 128 and w % 4 == 0
        assert sparse_topk_lens.shape == (t,) and seq_lens.shape == (t,)
        assert int(sparse_topk_lens.min()) >= 128 and int(sparse_topk_lens.max()) <= w
        assert sinks is None or (sinks.shape == (h,) and sinks.dtype == torch.float32)
        # the SWA tile's valid prefix: min(seq_lens - q_len + q_idx + 1, 128), q_idx = 0
        swa_len = (seq_lens - q_len + 1).clamp(max=128)
        swa, comp = self._flat(swa_kv_cache), self._flat(compressed_kv_cache)
        cols = torch.arange(w)
        valid_swa = cols[:128] < swa_len[:, None]
        valid_comp = cols[128:] < sparse_topk_lens[:, None]  # lens count the 128 SWA columns
        i_swa, i_comp = sparse_indices[:, :128], sparse_indices[:, 128:]
        assert ((i_swa >= 0) & (i_swa < swa.shape[0]))[valid_swa].all()
        assert ((i_comp >= 0) & (i_comp < comp.shape[0]))[valid_comp].all()
        sel = torch.cat(
            [
                torch.where(valid_swa, i_swa, -1),
                torch.where(valid_comp, i_comp + swa.shape[0], -1),
            ],
            dim=-1,
        )
        if self.write:
            kv = torch.cat([swa, comp])
            self._attend(query, kv, sel, bmm1_scale, bmm2_scale, sinks, out)
        return out

    def _sm120(self, name, q, kv_cache, indices, mid_out, mid_lse, output, out_lse, sm_scale, kw):
        self.calls.append((name, {"q": q, "kv_cache": kv_cache, "indices": indices, **kw}))
        t, h, d = q.shape
        k = indices.shape[-1]
        assert t <= 64 and h in fi.HEADS and q.dtype == torch.bfloat16
        assert kv_cache.dim() == 4 and kv_cache.shape[1] == 64 and kv_cache.dtype == torch.uint8
        assert indices.shape == (t, k) and indices.dtype == torch.int32
        assert k in sm120.SM120_TOPKS["v4" if d == 512 else "v32"]
        ekv, eidx = kw.get("extra_kv_cache"), kw.get("extra_indices")
        ke = 0 if eidx is None else eidx.shape[-1]
        if ekv is not None:
            assert ekv.shape[1] == 64 and eidx.shape == (t, ke) and ke % 64 == 0
        splits = -(-k // 64) + -(-ke // 64)
        assert mid_out.shape == (t, h, splits, 512) and mid_out.dtype == torch.bfloat16
        assert mid_lse.shape == (t, h, splits) and mid_lse.dtype == torch.float32
        assert output.shape == (t, h, 512) and out_lse.shape == (t, h)
        sink = kw.get("attn_sink")
        o, lse = attention.sparse_mla_decode(
            q.view(t, 1, h, d),
            kv_cache,
            indices.view(t, 1, k),
            sm_scale,
            attn_sink=sink,
            extra_k_cache=ekv,
            extra_indices=None if eidx is None else eidx.view(t, 1, ke),
        )
        lse = lse[:, :, 0]  # (t, h), natural log, +inf without a key
        lse = torch.where(torch.isinf(lse), -math.inf, lse)  # FlashInfer's reference: -inf
        if sink is not None:
            lse = torch.logaddexp(lse, sink)  # the kernel merges the sink into its lse
        if self.write:
            output.copy_(o[:, 0].to(output.dtype))
            out_lse.copy_(lse / math.log(2.0))  # base 2
        return output

    def sm120_dsv4(self, q, kv_cache, indices, mid_out, mid_lse, output, out_lse, sm_scale, **kw):
        assert q.shape[-1] == 512 and kv_cache.shape[-1] == 584
        return self._sm120("sm120_dsv4", q, kv_cache, indices, mid_out, mid_lse, output, out_lse,
                           sm_scale, kw)  # fmt: skip

    def sm120_dsv32(self, q, kv_cache, indices, mid_out, mid_lse, output, out_lse, sm_scale, **kw):
        assert q.shape[-1] == 576 and kv_cache.shape[-1] == 656
        assert set(kw) <= {"topk_length", "attn_sink", "model_type", "chunks_per_block"}
        return self._sm120("sm120_dsv32", q, kv_cache, indices, mid_out, mid_lse, output,
                           out_lse, sm_scale, kw)  # fmt: skip


@pytest.fixture
def fake():
    return FakeFlashInfer()


def backend(fake: FakeFlashInfer, arch: str, **kw) -> FlashInfer:
    return FlashInfer(ops=fake.ops, arch=arch, workspace_bytes=4096, **kw)


# ---- supports() -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw, arch",
    [
        (V32, "sm100"),
        (V4, "sm100"),
        ({**V4, "num_heads": 8}, "sm100"),
        ({**V4, "num_heads": 12}, "sm100"),  # engine padding to 16
        ({**V4, "extra_topk": 30, "compress_ratio": 128}, "sm100"),  # width padded to 4
        ({**V4, "topk": 100, "window": 100}, "sm100"),  # window padded to 128
        ({**V32, "topk": 130, "sink": True}, "sm100"),
        ({**V32, "batch_size": 64}, "sm120"),
        ({**V4, "batch_size": 16, "s_q": 4}, "sm120"),
        ({**V4, "page_size": 64}, "sm120"),
        ({**V32, "page_size": 32, "topk": 100}, "sm120"),
        ({**V4, "batch_size": 4096}, "sm100"),  # trtllm-gen has no token limit here
    ],
)
def test_supported(kw, arch):
    assert FlashInfer().supports(make_case(**kw), arch) is None


@pytest.mark.parametrize(
    "kw, arch, words",
    [
        (V32, "sm80", "kernels run on sm90 (FA3 MLA), sm100 and sm120 only, not sm80"),
        (V4, "cpu", "sm100 and sm120 only, not cpu"),
        ({**V4, "op": "prefill", "tokens": 64}, "sm100", "sm100 are decode kernels (no prefill)"),
        ({**V4, "op": "dequant"}, "sm120", "no dequant kernel"),
        ({**V4, "layout": "bf16"}, "sm100", "read a v32 or v4 FP8 cache, not layout bf16"),
        ({**V4, "layout": "v32"}, "sm100", "v32 cache with d_qk 576, not 512"),
        ({**V32, "d_qk": 512}, "sm120", "v32 cache with d_qk 576, not 512"),
        ({**V4, "d_v": 448}, "sm100", "d_v 512, not 448"),
        ({**V4, "topk": 0, "window": 0}, "sm100", "topk > 0"),
        ({**V32, "extra_topk": 64, "compress_ratio": 4}, "sm100", "V3.2 (d_qk 576)"),
        ({**V32, "num_heads": 256}, "sm100", "take at most 128"),
        ({**V4, "num_heads": 12, "head_padding": "none"}, "sm100", "head_padding none gives 12"),
        ({**V4, "head_padding": "32"}, "sm120", "64 heads exceed head_padding 32"),
        ({**V4, "num_heads": 8, "head_padding": "24"}, "sm100", "head_padding 24 gives 24"),
        ({**V4, "head_padding": "lots"}, "sm100", "unknown head_padding 'lots'"),
        ({**V32, "topk": 64}, "sm100", "trtllm-gen sparse MLA needs topk >= 128, got 64"),
        ({**V4, "topk": 256, "window": 256}, "sm100", "128-slot window"),
        ({**V32, "batch_size": 33, "s_q": 2}, "sm120", "at most 64 query tokens (b*s_q), got 66"),
        ({**V4, "topk": 2048, "window": 0}, "sm120", "takes topk 128, 512, 1024; got 2048"),
        ({**V32, "topk": 4096}, "sm120", "got 4096"),
        ({**V4, "page_size": 32}, "sm120", "page_size 32 does not split"),
    ],
)
def test_unsupported_reasons(kw, arch, words):
    reason = FlashInfer().supports(make_case(**kw), arch)
    assert reason is not None and words in reason, reason
    assert "\n" not in reason


def test_v32_scale_reading():
    b = FlashInfer()
    assert b.v32_scale_reading("sm100") is None  # plain rows dequantized exactly
    assert b.v32_scale_reading("sm120") == "e8m0"


def test_bad_kv_dtype():
    with pytest.raises(ValueError, match="kv_dtype"):
        FlashInfer(kv_dtype="fp16")


# ---- provider discovery -----------------------------------------------------------------


def test_provider_absent(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # import flashinfer -> not found
    b = FlashInfer()
    with pytest.raises(Unsupported) as e:
        b.provider()
    assert str(e.value) == fi.NOT_FOUND
    assert str(e.value) == (
        "FlashInfer not found: pip install flashinfer-python (sparse MLA: sm90, sm100, sm120)"
    )
    with pytest.raises(Unsupported, match="FlashInfer not found"):  # remembered
        b.prepare(make_case(**V4), {}, "cpu")


def test_provider_broken_import(monkeypatch):
    def boom(name, *a, **k):
        if name == "flashinfer":
            raise OSError("libcudart.so.13: cannot open shared object file")
        return real(name, *a, **k)

    real = fi.importlib.import_module
    monkeypatch.setattr(fi.importlib, "import_module", boom)
    with pytest.raises(Unsupported, match="cannot import flashinfer: OSError: libcudart"):
        FlashInfer().provider()


def _module(monkeypatch, name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    for k, v in attrs.items():
        setattr(mod, k, v)
    monkeypatch.setitem(sys.modules, name, mod)
    return mod


def test_discovery_finds_each_entry_point(monkeypatch):
    def f1(**kw):
        pass

    def f2(**kw):
        pass

    def f3(*a, **kw):
        pass

    _module(monkeypatch, "flashinfer", __version__="0.6.14", __file__="/x/flashinfer/__init__.py")
    _module(monkeypatch, "flashinfer.decode", trtllm_batch_decode_with_kv_cache_mla=f1)
    _module(monkeypatch, "flashinfer.mla", trtllm_batch_decode_sparse_mla_dsv4=f2)
    monkeypatch.setitem(sys.modules, "flashinfer.mla._sparse_mla_sm120", None)  # absent
    _module(monkeypatch, "flashinfer.sparse_mla_sm120", sparse_mla_sm120_decode_dsv4=f3)
    b = FlashInfer()
    assert b.provider() == Provider("flashinfer", "0.6.14", "/x/flashinfer/__init__.py")
    ops = b.kernel_ops()
    assert ops.trtllm_mla is f1 and ops.trtllm_dsv4 is f2 and ops.sm120_dsv4 is f3
    assert ops.sm120_dsv32 is None
    assert ops.names["sm120_dsv4"] == "flashinfer.sparse_mla_sm120.sparse_mla_sm120_decode_dsv4"
    case = make_case(**V32, batch_size=2)
    with pytest.raises(Unsupported, match="has no sparse_mla_sm120_decode_dsv3_2"):
        FlashInfer(arch="sm120").prepare(case, {}, "cpu")


def test_provider_from_injected_ops(fake):
    assert FlashInfer(ops=fake.ops()).provider() == Provider("fake-flashinfer", "0")


# ---- conversions ------------------------------------------------------------------------


def test_split_pages_keep_every_tokens_bytes_and_slot():
    kv = torch.randn(600, 512).to(torch.bfloat16)
    cache = layouts.quantize_v4(kv, 256)  # 3 pages of 256 (the last one part empty)
    split = convert.repage_v4(cache)
    assert split.shape == (12, 64, 1, 584) and split.stride(0) == layouts.v4_page_stride(64)
    slots = torch.arange(3 * 256)
    assert torch.equal(layouts.gather_tokens(split, slots), layouts.gather_tokens(cache, slots))
    # raw bytes of every token: 576 data bytes and 8 scale bytes, at the same slot
    for s in (0, 63, 64, 255, 256, 599, 767):
        p, o = divmod(s, 256)
        q, r = divmod(s, 64)
        old = cache.view(torch.uint8).as_strided((3 * 149760,), (1,), 0)
        new = split.view(torch.uint8).as_strided((12 * 37440,), (1,), 0)
        assert torch.equal(
            old[p * 149760 + o * 576 : p * 149760 + (o + 1) * 576],
            new[q * 37440 + r * 576 : q * 37440 + (r + 1) * 576],
        )
        assert torch.equal(
            old[p * 149760 + 256 * 576 + o * 8 :][:8], new[q * 37440 + 64 * 576 + r * 8 :][:8]
        )
    assert convert.repage_v4(split) is split  # already 64-token pages


def test_v32_repage_is_a_view_with_the_same_slots():
    kv = torch.randn(96, 576).to(torch.bfloat16)
    cache = layouts.quantize_v32(kv, 32)  # 3 pages of 32
    pages = convert.repage_v32(cache)
    assert pages.shape == (2, 64, 1, 656)  # padded with zero records to whole pages
    slots = torch.arange(96)
    assert torch.equal(layouts.gather_tokens(pages, slots), layouts.gather_tokens(cache, slots))
    assert not pages.view(-1, 656)[96:].any()
    big = layouts.quantize_v32(kv[:64], 16)
    assert convert.repage_v32(big).data_ptr() == big.data_ptr()  # whole pages: a view, no copy


def test_plain_rows_v4_bf16_are_the_cache_values_exactly():
    cache = layouts.quantize_v4(torch.randn(300, 512).to(torch.bfloat16), 64)
    rows, scale = convert.plain_rows(cache, chunk=100)
    assert scale is None and rows.shape == (5, 1, 64, 512) and rows.dtype == torch.bfloat16
    assert torch.equal(rows.float().reshape(-1, 512), layouts.dequantize_v4(cache))
    ref, _ = layouts.to_plain_rows(cache)
    assert torch.equal(rows, ref)


def test_plain_rows_v4_e4m3_within_its_error():
    cache = layouts.quantize_v4(torch.randn(200, 512).to(torch.bfloat16), 64)
    rows, scale = convert.plain_rows(cache, dtype="e4m3", chunk=77)
    ref_rows, ref_scale = layouts.to_plain_rows(cache, dtype="e4m3")
    assert rows.dtype == torch.float8_e4m3fn and torch.equal(scale, ref_scale)
    assert torch.equal(rows.view(torch.uint8), ref_rows.view(torch.uint8))
    x = layouts.dequantize_v4(cache)
    back = rows.float().reshape(-1, 512) * scale
    # e4m3: 3 mantissa bits (relative error <= 2^-4), subnormal spacing 2^-9 (half of it)
    assert ((back - x).abs() <= x.abs() * 2**-4 + float(scale) * 2**-10).all()
    assert float(scale) == pytest.approx(float(x.abs().max()) / 448)


def test_plain_rows_v32_keep_all_576_columns():
    kv = torch.randn(128, 576).to(torch.bfloat16)
    cache = layouts.quantize_v32(kv, 64)  # pow2 scales: exact in bf16
    rows, _ = convert.plain_rows(cache)
    assert rows.shape == (2, 1, 64, 576)
    assert torch.equal(rows.float().reshape(-1, 576), layouts.dequantize_v32(cache))
    # the shared helper keeps the 512 latent columns only: V4's width, not V3.2's K
    assert layouts.to_plain_rows(cache)[0].shape[-1] == 512


def test_index_padding_to_a_multiple_of_4_keeps_minus_one():
    idx = torch.tensor([[5, -1, 7, 9, -1], [-1, -1, -1, -1, -1]], dtype=torch.int32)
    out = convert.pad_indices(idx, convert.round_up(idx.shape[-1], 4))
    assert out.shape == (2, 8) and out.dtype == torch.int32
    assert torch.equal(out[:, :5], idx) and (out[:, 5:] == -1).all()
    first, count = convert.valid_first(idx)
    assert first.tolist() == [[5, 7, 9, -1, -1], [-1] * 5] and count.tolist() == [3, 0]
    with pytest.raises(ValueError):
        convert.pad_indices(idx, 4)


def test_trtllm_dsv4_index_table():
    window = torch.tensor([[3, 4, -1], [8, -1, -1]], dtype=torch.int32)
    extra = torch.tensor([[-1, 11, 12, 13, 14], [20, 21, -1, -1, -1]], dtype=torch.int32)
    table, topk_lens, seq_lens = convert.trtllm_dsv4_indices(window, extra)
    assert table.shape == (2, 136)  # 128 window columns + 5 extra, padded to 4
    assert table[0, :3].tolist() == [3, 4, -1] and (table[:, 2:128] == -1).all()
    assert table[0, 128:133].tolist() == [11, 12, 13, 14, -1]
    assert table[1, 128:130].tolist() == [20, 21] and (table[:, 133:] == -1).all()
    assert topk_lens.tolist() == [132, 130] and seq_lens.tolist() == [2, 1]
    only, lens, _ = convert.trtllm_dsv4_indices(window)
    assert only.shape == (2, 128) and lens.tolist() == [128, 128]


def test_sm120_lse_conversion():
    lse = torch.tensor([[2.0, -1.0, math.inf]])  # natural, keys only (+inf: no key)
    sink = torch.tensor([0.5, 3.0, 1.0])
    merged = torch.logaddexp(torch.where(torch.isinf(lse), -math.inf, lse), sink)
    back = convert.sm120_lse_to_natural(merged / math.log(2.0), sink)
    torch.testing.assert_close(back[0, :2], lse[0, :2], atol=1e-5, rtol=0)
    assert back[0, 2] == math.inf
    plain = convert.sm120_lse_to_natural(torch.tensor([[1.0, -math.inf]]), None)
    assert plain[0, 0] == pytest.approx(math.log(2.0)) and plain[0, 1] == math.inf


# ---- prepare / run / finish against the oracle ------------------------------------------


def oracle(case: Case, x: dict):
    return attention.sparse_mla_decode(
        x["q"],
        x["k_cache"],
        x["indices"],
        case.scale,
        attn_sink=x.get("attn_sink"),
        extra_k_cache=x.get("extra_k_cache"),
        extra_indices=x.get("extra_indices"),
    )


def check(case: Case, arch: str, fake: FakeFlashInfer, **kw):
    x = make_inputs(case, "cpu")
    p = backend(fake, arch, **kw).prepare(case, x, "cpu")
    if p.poison is not None:
        p.poison()
    got = p.finish(p.run())
    out, lse = oracle(case, x)
    b, s_q, h = case.batch_size, case.s_q, case.num_heads
    assert got.out.shape == (b, s_q, h, 512)
    acc = metrics.compare_tensors(out, got.out.float())
    assert acc["nonfinite"] == 0 and acc["cos_diff"] < 5e-6, acc  # bf16 output rounding only
    torch.testing.assert_close(got.out.float(), out, atol=2e-2, rtol=1e-2)
    if arch == "sm120":
        assert got.lse.shape == (b, h, s_q)
        torch.testing.assert_close(got.lse, lse, atol=1e-4, rtol=0)
    else:
        assert got.lse is None  # trtllm-gen returns no lse
    return p, x


V4_SMALL = dict(V4, num_heads=12, batch_size=2, s_q=2, context_len=1024, extra_topk=64)
V32_SMALL = dict(V32, num_heads=16, batch_size=2, s_q=2, context_len=512, topk=200)


@pytest.mark.parametrize("arch", ["sm100", "sm120"])
def test_v4_window_and_extra_match_the_oracle(fake, arch):
    case = make_case(**V4_SMALL)
    p, x = check(case, arch, fake)
    name, call = fake.calls[-1]
    assert p.info["padded_heads"] == 16
    if arch == "sm100":
        assert name == "trtllm_dsv4" and p.info["index_width"] == 192  # 128 + 64
        assert call["swa_kv_cache"].shape[1:] == (1, 256, 512)  # HND, page size kept
        assert call["compressed_kv_cache"] is not call["swa_kv_cache"]
        assert call["bmm1_scale"] == pytest.approx(case.scale)
    else:
        assert name == "sm120_dsv4" and p.info["num_splits"] == 3  # 128/64 + 64/64
        assert call["kv_cache"].shape[1] == 64 and call["extra_kv_cache"].shape[1] == 64
        assert torch.equal(call["indices"], x["indices"].reshape(4, -1))  # slots unchanged
        assert torch.equal(call["extra_indices"], x["extra_indices"].reshape(4, -1))
    assert torch.isneginf(call["sinks" if arch == "sm100" else "attn_sink"][12:]).all()


@pytest.mark.parametrize("arch", ["sm100", "sm120"])
def test_v4_c128_short_extra_matches_the_oracle(fake, arch):
    # C128: every visible compressed entry, 3840 // 128 = 30 of them
    case = make_case(**{**V4_SMALL, "compress_ratio": 128, "context_len": 3840, "extra_topk": 30})
    p, _ = check(case, arch, fake)
    assert p.info.get("index_width") == (160 if arch == "sm100" else 128)  # 158 -> 160


@pytest.mark.parametrize("arch", ["sm100", "sm120"])
def test_v4_window_only_matches_the_oracle(fake, arch):
    case = make_case(**{**V4_SMALL, "extra_topk": 0, "compress_ratio": 0, "sink": False})
    check(case, arch, fake)
    if arch == "sm100":  # no extra cache: the window pool stands in as the compressed pool
        call = fake.calls[-1][1]
        assert call["compressed_kv_cache"] is call["swa_kv_cache"]
        assert call["sinks"] is None


@pytest.mark.parametrize("arch", ["sm100", "sm120"])
@pytest.mark.parametrize("page_size", [64, 32])
def test_v32_matches_the_oracle(fake, arch, page_size):
    case = make_case(V32_SMALL, page_size=page_size)
    p, x = check(case, arch, fake)
    name, call = fake.calls[-1]
    if arch == "sm100":
        assert name == "trtllm_mla" and p.info["index_width"] == 200
        assert call["kv_cache"].shape[-1] == 576 and call["kv_cache"].shape[2] == page_size
        valid = (x["indices"] >= 0).sum(-1).reshape(-1)
        assert torch.equal(call["seq_lens"], valid.to(torch.int32))
    else:
        assert name == "sm120_dsv32" and p.info["index_width"] == 512  # 200 -> dispatch 512
        assert call["kv_cache"].shape[1] == 64


def test_v32_sink_on_sm100(fake):
    case = make_case(V32_SMALL, sink=True)
    check(case, "sm100", fake)
    sinks = fake.calls[-1][1]["sinks"]
    assert isinstance(sinks, list) and sinks[0].shape == (16,)


@pytest.mark.parametrize("layout", ["v4", "v32"])
def test_e4m3_rows_stay_within_fp8_error(fake, layout):
    base = V4_SMALL if layout == "v4" else V32_SMALL
    case = make_case(**base)
    x = make_inputs(case, "cpu")
    p = backend(fake, "sm100", kv_dtype="e4m3").prepare(case, x, "cpu")
    got = p.finish(p.run())
    call = fake.calls[-1][1]
    assert call["query"].dtype == torch.float8_e4m3fn
    pools = [v for k, v in call.items() if k in ("kv_cache", "swa_kv_cache")]
    assert pools[0].dtype == torch.float8_e4m3fn
    assert call["bmm1_scale"] != pytest.approx(case.scale)  # q and kv scales folded in
    out, _ = oracle(case, x)
    acc = metrics.compare_tensors(out, got.out.float())
    assert acc["nonfinite"] == 0 and acc["cos_diff"] < 5e-3, acc  # per-tensor fp8 requantized
    assert p.info["kv_dtype"] == "e4m3"


def test_topk_length_is_honoured(fake):
    case = make_case(**V32_SMALL)
    x = make_inputs(case, "cpu")
    x["topk_length"] = torch.tensor([150, 120], dtype=torch.int32)
    for arch in ("sm100", "sm120"):
        p = backend(fake, arch).prepare(case, x, "cpu")
        got = p.finish(p.run())
        out, _ = attention.sparse_mla_decode(
            x["q"], x["k_cache"], x["indices"], case.scale, topk_length=x["topk_length"]
        )
        assert metrics.compare_tensors(out, got.out.float())["cos_diff"] < 5e-6


def test_poison_catches_a_kernel_that_writes_nothing(fake):
    for arch in ("sm100", "sm120"):
        case = make_case(**V4_SMALL)
        p = backend(fake, arch).prepare(case, make_inputs(case, "cpu"), "cpu")
        fake.write = False
        p.poison()
        got = p.finish(p.run())
        assert torch.isnan(got.out).all()
        fake.write = True


def test_empty_window_is_refused_on_sm100(fake):
    case = make_case(**V4_SMALL)
    x = make_inputs(case, "cpu")
    x["indices"] = x["indices"].clone()
    x["indices"][0, 0] = -1
    with pytest.raises(Unsupported, match="empty window"):
        backend(fake, "sm100").prepare(case, x, "cpu")


def test_prepare_rechecks_support_and_cache_width(fake):
    case = make_case(**V32_SMALL)
    x = make_inputs(case, "cpu")
    with pytest.raises(Unsupported, match="sm100 and sm120 only"):
        FlashInfer(ops=fake.ops()).prepare(case, x, "cpu")  # arch from the device: cpu
    bad = dict(x, k_cache=layouts.quantize_v4(torch.randn(64, 512), 64))
    with pytest.raises(ValueError, match="k_cache rows are 584 B, layout v32 needs 656"):
        backend(fake, "sm120").prepare(case, bad, "cpu")


def test_timed_call_reuses_prepared_tensors(fake):
    case = make_case(**V4_SMALL)
    p = backend(fake, "sm120").prepare(case, make_inputs(case, "cpu"), "cpu")
    p.run()
    p.run()
    a, b = fake.calls[-2][1], fake.calls[-1][1]
    assert a["kv_cache"] is b["kv_cache"] and a["indices"] is b["indices"]  # no conversion


# ---- engine facts: head counts per build, the sm120 page stride -----------------------------


def test_versions_and_head_sets():
    assert fi.version_tuple("0.6.18rc7") == (0, 6, 18) and fi.version_tuple("0.6") == (0, 6, 0)
    assert fi.version_tuple("unknown") is None and fi.version_tuple("0") is None
    # trtllm-gen DSv4: 64/128 until 0.6.14 (flashinfer#3545), 8..128 since; others unchanged
    assert fi.heads_for("trtllm_dsv4", "0.6.13") == (64, 128)
    assert fi.heads_for("trtllm_dsv4", "0.6.14") == fi.HEADS == (8, 16, 32, 64, 128)
    assert fi.heads_for("trtllm_dsv4", "unknown") == fi.HEADS
    assert fi.heads_for("trtllm_mla", "0.6.12") == fi.heads_for("sm120_dsv4", "0.6.12") == fi.HEADS
    # engine padding: the smallest head count of the build that fits, as vLLM pads
    case = make_case({**V4, "num_heads": 12})
    assert fi.padded_heads(case) == (16, None)
    assert fi.padded_heads(case, (64, 128)) == (64, None)
    reason = fi.padded_heads(make_case({**V4, "num_heads": 12}, head_padding="16"), (64, 128))[1]
    assert "takes 64/128 query heads; head_padding 16 gives 16" in reason


class OldFlashInfer(FakeFlashInfer):
    """A 0.6.13 build: its trtllm-gen DSv4 kernel takes 64 or 128 heads only."""

    def ops(self) -> KernelOps:
        ops = super().ops()
        ops.provider = Provider("fake-flashinfer", "0.6.13")
        return ops

    def trtllm_dsv4(self, *, query, **kw):
        assert query.shape[2] in (64, 128), "0.6.13: Expected 64 or 128 query heads"
        return super().trtllm_dsv4(query=query, **kw)


def test_old_build_pads_dsv4_heads_to_64():
    old = OldFlashInfer()
    p, _ = check(make_case(**V4_SMALL), "sm100", old)  # 12 heads: 64 on 0.6.13, 16 since
    assert p.info["padded_heads"] == 64 and old.calls[-1][1]["query"].shape[2] == 64
    # V3.2 (trtllm_batch_decode_with_kv_cache_mla) keeps its own head set
    p, _ = check(make_case(**V32_SMALL), "sm100", old)
    assert p.info["padded_heads"] == 16
    with pytest.raises(Unsupported, match="0.6.13: FlashInfer takes 64/128 query heads"):
        case = make_case(**V4_SMALL, head_padding="16")
        backend(old, "sm100").prepare(case, make_inputs(case, "cpu"), "cpu")


def _restride(cache: torch.Tensor, stride: int) -> torch.Tensor:
    """The same 64-token V4 pages at another page stride (bytes); padding bytes zero."""
    pages, page = cache.shape[:2]
    flat = torch.zeros(pages * stride + 584, dtype=torch.uint8)
    out = flat.as_strided((pages, page, 1, 584), (stride, 584, 584, 1))
    u8 = cache.view(torch.uint8)
    for p in range(pages):
        src = u8.as_strided((page * 584,), (1,), u8.storage_offset() + p * u8.stride(0))
        flat[p * stride : p * stride + page * 584] = src
    return out


def _read_as_sm120(kv: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Tokens as FlashInfer's sm120 kernel addresses them (kv_cache_io.cuh): page stride from
    the binding (stride(0) * element size), data at page * stride + t * 576, the 7 ue8m0
    scales at page * stride + 64 * 576 + t * 8."""
    page, stride = convert.sm120_page_layout(kv)
    u8 = kv.view(torch.uint8)
    flat = u8.as_strided((u8.shape[0] * stride,), (1,), u8.storage_offset())
    rows = []
    for s in slots.tolist():
        blk, t = divmod(s, page)
        data = flat[blk * stride + t * 576 :][:576]
        scales = flat[blk * stride + page * 576 + t * 8 :][:7].float()
        nope = data[:448].view(torch.float8_e4m3fn).float().view(7, 64)
        nope = nope * torch.pow(2.0, scales - 127).view(7, 1)
        rope = data[448:576].view(torch.bfloat16).float()
        rows.append(torch.cat([nope.flatten(), rope]))
    return torch.stack(rows)


def test_sm120_reads_the_page_stride_from_the_tensor():
    kv = torch.randn(300, 512).to(torch.bfloat16)
    cache = layouts.quantize_v4(kv, 256)
    want = layouts.dequantize_v4(cache)
    slots = torch.tensor([0, 1, 63, 64, 200, 255, 256, 299, 511])
    split = convert.repage_v4(cache)  # what the adapter hands the kernel
    assert convert.sm120_page_layout(split) == (64, 37440)  # engines' padded page
    # FlashInfer's tests pack pages unpadded (64 * 584 = 37376); the seed's 37888 also keeps
    # the 16-byte alignment: the kernel reads every one of them through stride(0)
    for stride in (37440, 37376, 37888):
        paged = split if stride == 37440 else _restride(split, stride)
        assert convert.sm120_page_layout(paged) == (64, stride)
        assert torch.equal(_read_as_sm120(paged, slots), want[slots])
    # a page read at the wrong stride (page_size * 584 on a padded cache) gives other bytes
    wrong = split.view(torch.uint8).as_strided(split.shape, (37376, 584, 584, 1))
    assert not torch.equal(_read_as_sm120(wrong, slots[3:]), want[slots[3:]])


def test_sm120_prepare_reports_and_checks_the_stride(fake, monkeypatch):
    case = make_case(**V4_SMALL)
    p, _ = check(case, "sm120", fake)
    assert p.info["page_stride_bytes"] == 37440
    # a page stride the kernel cannot read with cp.async.bulk (not 16-byte aligned) is refused
    monkeypatch.setattr(
        sm120, "repage_v4", lambda c: _restride(layouts.split_pages_v4(c, 64), 37380)
    )
    with pytest.raises(Unsupported, match="16-byte aligned stride of at least 37376 B; got 64"):
        backend(fake, "sm120").prepare(case, make_inputs(case, "cpu"), "cpu")
