"""The attention oracle (reference/attention.py) against the slow, independent reference."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

import reference.attention as attention
from reference.attention import sparse_mla_decode, sparse_mla_prefill
from reference.indices import merge_window_extra
from reference.layouts import dequantize_v4, quantize_v4, quantize_v32
from tests.slow_reference import slow_decode, slow_prefill

INF = math.inf
TOL = {"atol": 2e-5, "rtol": 2e-5}


def poison(cache: torch.Tensor, slots: list[int]) -> None:
    """Fill the given slots with NaN bytes: a reader that uses them shows NaN."""
    page_size = cache.shape[1]
    for slot in slots:
        page, offset = divmod(slot, page_size)
        if cache.shape[-1] == 656:
            cache[page, offset] = 0xFF
        else:
            page_bytes = cache[page].view(-1)  # the P*584 logical bytes of a page are contiguous
            page_bytes[offset * 576 : (offset + 1) * 576] = 0xFF
            page_bytes[page_size * 576 + offset * 8 : page_size * 576 + offset * 8 + 7] = 0xFF


def make_cache(
    d_qk: int, num_tokens: int, page_size: int, gen: torch.Generator, *, scale: str = "pow2"
) -> torch.Tensor:
    kv = torch.randn(num_tokens, d_qk, generator=gen)
    if d_qk == 576:
        return quantize_v32(kv, page_size, scale=scale)
    return quantize_v4(kv, page_size)


def random_slots(
    shape: tuple[int, ...], live: int, gen: torch.Generator, *, p_invalid: float = 0.2
) -> torch.Tensor:
    idx = torch.randint(0, live, shape, generator=gen, dtype=torch.int32)
    idx[torch.rand(shape, generator=gen) < p_invalid] = -1
    return idx


@dataclass
class DecodeCase:
    d_qk: int
    b: int
    s_q: int
    h: int
    topk: int
    page_size: int
    num_tokens: int
    topk_length: list[int] | None = None
    sink: list[float] | None = None
    extra_topk: int = 0
    extra_page_size: int = 4
    extra_topk_length: list[int] | None = None
    seed: int = 0


def build_decode(c: DecodeCase) -> tuple[tuple, dict]:
    gen = torch.Generator().manual_seed(c.seed)
    cache = make_cache(c.d_qk, c.num_tokens, c.page_size, gen)
    slots_total = cache.shape[0] * cache.shape[1]
    live = c.num_tokens - 3
    # Slots the queries must never use hold NaN: the written-but-unused and the padding ones.
    poison(cache, list(range(live, slots_total)))
    q = torch.randn(c.b, c.s_q, c.h, c.d_qk, generator=gen).to(torch.bfloat16)
    indices = random_slots((c.b, c.s_q, c.topk), live, gen)
    kwargs: dict = {"d_v": 512}
    if c.topk_length is not None:
        kwargs["topk_length"] = torch.tensor(c.topk_length, dtype=torch.int32)
        for r, n in enumerate(c.topk_length):
            indices[r, :, n:] = live + 1  # NaN tokens past the length must be ignored
    if c.sink is not None:
        kwargs["attn_sink"] = torch.tensor(c.sink, dtype=torch.float32)
    if c.extra_topk:
        extra_tokens = 40
        extra = make_cache(c.d_qk, extra_tokens, c.extra_page_size, gen)
        poison(extra, [extra_tokens - 1])
        extra_indices = random_slots((c.b, c.s_q, c.extra_topk), extra_tokens - 1, gen)
        kwargs |= {"extra_k_cache": extra, "extra_indices": extra_indices}
        if c.extra_topk_length is not None:
            kwargs["extra_topk_length"] = torch.tensor(c.extra_topk_length, dtype=torch.int32)
            for r, n in enumerate(c.extra_topk_length):
                extra_indices[r, :, n:] = extra_tokens - 1
    return (q, cache, indices, c.d_qk**-0.5), kwargs


DECODE_CASES = {
    "v32": DecodeCase(576, b=2, s_q=2, h=8, topk=64, page_size=64, num_tokens=150),
    "v32-3heads-length": DecodeCase(
        576, b=3, s_q=1, h=3, topk=32, page_size=16, num_tokens=70, topk_length=[32, 5, 0]
    ),
    "v4": DecodeCase(512, b=2, s_q=2, h=8, topk=64, page_size=16, num_tokens=90),
    "v4-sink-extra": DecodeCase(
        512,
        b=2,
        s_q=2,
        h=4,
        topk=48,
        page_size=8,
        num_tokens=60,
        topk_length=[40, 7],
        sink=[0.3, INF, -INF, -2.0],
        extra_topk=16,
        extra_topk_length=[16, 3],
        seed=1,
    ),
    "v4-extra-only": DecodeCase(
        512,
        b=2,
        s_q=1,
        h=3,
        topk=16,
        page_size=256,
        num_tokens=50,
        topk_length=[0, 16],
        sink=[1.0, -1.0, 0.0],
        extra_topk=8,
        seed=2,
    ),
    "v32-sink": DecodeCase(
        576, b=1, s_q=3, h=5, topk=24, page_size=64, num_tokens=64, sink=[5.0, -INF, INF, 0, -9]
    ),
}


@pytest.mark.parametrize("name", list(DECODE_CASES))
def test_decode_matches_slow_reference(name: str) -> None:
    args, kwargs = build_decode(DECODE_CASES[name])
    out, lse = sparse_mla_decode(*args, **kwargs)
    ref_out, ref_lse = slow_decode(*args, **kwargs)
    b, s_q, h, _ = args[0].shape
    assert out.dtype == torch.float32 and out.shape == (b, s_q, h, 512)
    assert lse.dtype == torch.float32 and lse.shape == (b, h, s_q)
    assert bool(torch.isfinite(out).all())
    torch.testing.assert_close(out.double(), ref_out, **TOL)
    torch.testing.assert_close(lse.double(), ref_lse, **TOL)


def test_poisoned_slots_would_show() -> None:
    """The NaN slots other tests rely on do poison the output when a query uses them."""
    args, kwargs = build_decode(DECODE_CASES["v4-sink-extra"])
    q, cache, indices, scale = args
    for name in ("topk_length", "extra_topk_length"):
        kwargs.pop(name)
    out, _ = sparse_mla_decode(q, cache, indices, scale, **kwargs)
    assert bool(out.isnan().any())
    p_args, p_kwargs = build_prefill(PREFILL_CASES["576"])
    q, kv, idx, scale = p_args
    idx = idx.clone()
    idx[0, 0, 0] = 0
    out, _, _ = sparse_mla_prefill(q, kv, idx, scale)
    assert bool(out[0].isnan().all()) and not bool(out[1:].isnan().any())


def test_decode_sink_inf_zeroes_output_keeps_lse() -> None:
    args, kwargs = build_decode(DECODE_CASES["v4"])
    out, lse = sparse_mla_decode(*args, **kwargs)
    h = args[0].shape[2]
    sink = torch.full((h,), INF)
    sink[0] = -INF
    out_s, lse_s = sparse_mla_decode(*args, **kwargs, attn_sink=sink)
    assert torch.equal(lse_s, lse)
    assert bool((out_s[:, :, 1:] == 0).all())
    torch.testing.assert_close(out_s[:, :, 0], out[:, :, 0], atol=0, rtol=1e-6)


def test_decode_no_valid_key() -> None:
    args, kwargs = build_decode(DECODE_CASES["v32"])
    q, cache, indices, scale = args
    indices = indices.clone()
    indices[0, 1] = -1  # one query with only -1
    for sink in (None, torch.tensor([0.5, INF, -INF, 0, 0, 0, 0, 0])):
        out, lse = sparse_mla_decode(q, cache, indices, scale, attn_sink=sink)
        assert bool((out[0, 1] == 0).all())
        assert bool((lse[0, :, 1] == INF).all())
        assert bool(torch.isfinite(lse[1]).all())
    # topk_length 0 empties every query of a request.
    out, lse = sparse_mla_decode(q, cache, indices, scale, topk_length=torch.tensor([0, 64]))
    assert bool((out[0] == 0).all()) and bool((lse[0] == INF).all())
    assert bool(torch.isfinite(lse[1]).all())


def test_decode_minus_one_inside_length_is_skipped() -> None:
    args, _ = build_decode(DECODE_CASES["v4"])
    q, cache, indices, scale = args
    indices = indices.clone()
    indices[:, :, 10:] = -1
    full, full_lse = sparse_mla_decode(q, cache, indices, scale)
    cut, cut_lse = sparse_mla_decode(q, cache, indices[..., :10].contiguous(), scale)
    torch.testing.assert_close(full, cut, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(full_lse, cut_lse, atol=1e-6, rtol=1e-6)


def test_decode_duplicates_count_per_occurrence() -> None:
    gen = torch.Generator().manual_seed(3)
    cache = make_cache(512, 16, 16, gen)
    q = torch.randn(1, 1, 2, 512, generator=gen)
    once = torch.tensor([[[3, 5]]])
    twice = torch.tensor([[[3, 5, 5]]])
    out1, lse1 = sparse_mla_decode(q, cache, once, 0.1)
    out2, lse2 = sparse_mla_decode(q, cache, twice, 0.1)
    ref_out, ref_lse = slow_decode(q, cache, twice, 0.1)
    torch.testing.assert_close(out2.double(), ref_out, **TOL)
    torch.testing.assert_close(lse2.double(), ref_lse, **TOL)
    assert not torch.allclose(out1, out2)
    # With the duplicate, slot 5 carries twice its weight: lse grows by log(1 + p5).
    k = cache_rows(cache, [3, 5])
    logits = 0.1 * q[0, 0] @ k.T  # (h, 2)
    expected = torch.logsumexp(torch.stack([logits[:, 0], logits[:, 1], logits[:, 1]], 1), 1)
    torch.testing.assert_close(lse2[0, :, 0], expected, atol=1e-5, rtol=1e-5)


def cache_rows(cache: torch.Tensor, slots: list[int]) -> torch.Tensor:
    return dequantize_v4(cache)[slots]


@pytest.mark.parametrize("scale_rounding", ["bf16", "e8m0"])
def test_decode_scale_rounding_matches_slow_reference(scale_rounding: str) -> None:
    gen = torch.Generator().manual_seed(4)
    cache = make_cache(576, 64, 64, gen, scale="raw")
    q = torch.randn(1, 2, 4, 576, generator=gen)
    indices = random_slots((1, 2, 32), 64, gen)
    out, lse = sparse_mla_decode(q, cache, indices, 0.05, scale_rounding=scale_rounding)
    ref_out, ref_lse = slow_decode(q, cache, indices, 0.05, scale_rounding=scale_rounding)
    torch.testing.assert_close(out.double(), ref_out, **TOL)
    torch.testing.assert_close(lse.double(), ref_lse, **TOL)
    exact, _ = sparse_mla_decode(q, cache, indices, 0.05)
    assert not torch.equal(out, exact)


def test_decode_reads_each_used_token_once_per_block(monkeypatch: pytest.MonkeyPatch) -> None:
    args, kwargs = build_decode(DECODE_CASES["v4-sink-extra"])
    requested: list[tuple[int, list[int]]] = []
    real = attention.gather_tokens

    def recording(cache: torch.Tensor, slots: torch.Tensor, **kw: object) -> torch.Tensor:
        requested.append((cache.data_ptr(), slots.tolist()))
        return real(cache, slots, **kw)

    monkeypatch.setattr(attention, "gather_tokens", recording)
    sets = [
        (args[1], args[2], kwargs["topk_length"]),
        (kwargs["extra_k_cache"], kwargs["extra_indices"], kwargs["extra_topk_length"]),
    ]
    # Per query token: the slots it uses, for each cache.
    used = {
        cache.data_ptr(): [
            {s for s in idx[r, i, : int(lengths[r])].tolist() if s != -1}
            for r in range(idx.shape[0])
            for i in range(idx.shape[1])
        ]
        for cache, idx, lengths in sets
    }

    def reads() -> dict[int, list[int]]:
        got: dict[int, list[int]] = {ptr: [] for ptr in used}
        for ptr, slots in requested:
            got[ptr] += slots
        return {ptr: sorted(slots) for ptr, slots in got.items()}

    sparse_mla_decode(*args, **kwargs)  # one block: every used token once, nothing else
    assert reads() == {ptr: sorted(set().union(*per_query)) for ptr, per_query in used.items()}
    duplicates = sum(len(q) for q in used[args[1].data_ptr()]) - len(reads()[args[1].data_ptr()])
    assert duplicates > 0  # the queries share tokens, so reading once per block saves reads
    requested.clear()
    sparse_mla_decode(*args, **kwargs, block_bytes=1)  # one query per block
    assert reads() == {
        ptr: sorted(s for q in per_query for s in q) for ptr, per_query in used.items()
    }


def test_decode_non_contiguous_q_and_block_size() -> None:
    args, kwargs = build_decode(DECODE_CASES["v4-sink-extra"])
    q, cache, indices, scale = args
    out, lse = sparse_mla_decode(q, cache, indices, scale, **kwargs)
    # The same values behind transposed and sliced strides.
    wide = torch.zeros(q.shape[2], q.shape[0], q.shape[1], 2 * q.shape[3], dtype=q.dtype)
    wide[..., ::2] = q.permute(2, 0, 1, 3)
    q_nc = wide[..., ::2].permute(1, 2, 0, 3)
    assert not q_nc.is_contiguous() and torch.equal(q_nc, q)
    out_nc, lse_nc = sparse_mla_decode(q_nc, cache, indices, scale, **kwargs)
    torch.testing.assert_close(out_nc, out, atol=0, rtol=0)
    torch.testing.assert_close(lse_nc, lse, atol=0, rtol=0)
    out_small, lse_small = sparse_mla_decode(q, cache, indices, scale, **kwargs, block_bytes=1)
    torch.testing.assert_close(out_small, out, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(lse_small, lse, atol=1e-6, rtol=1e-6)


def test_decode_rejects_bad_inputs() -> None:
    args, _ = build_decode(DECODE_CASES["v32"])
    q, cache, indices, scale = args
    with pytest.raises(ValueError, match="d_qk"):
        sparse_mla_decode(q[..., :512], cache, indices, scale)
    bad = indices.clone()
    bad[0, 0, 0] = -2
    with pytest.raises(ValueError, match="outside"):
        sparse_mla_decode(q, cache, bad, scale)
    bad[0, 0, 0] = cache.shape[0] * cache.shape[1]
    with pytest.raises(ValueError, match="outside"):
        sparse_mla_decode(q, cache, bad, scale)
    # ...but not when the bad entry lies past topk_length.
    sparse_mla_decode(q, cache, bad[..., 1:], scale, topk_length=torch.tensor([63, 63]))
    with pytest.raises(ValueError, match="attn_sink"):
        sparse_mla_decode(q, cache, indices, scale, attn_sink=torch.zeros(3))
    with pytest.raises(ValueError, match="together"):
        sparse_mla_decode(q, cache, indices, scale, extra_k_cache=cache)
    v4_cache = make_cache(512, 16, 16, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="d_qk"):
        sparse_mla_decode(q, cache, indices, scale, extra_k_cache=v4_cache, extra_indices=indices)


@dataclass
class PrefillCase:
    d_qk: int
    s_q: int
    s_kv: int
    h: int
    topk: int
    topk_length: bool = False
    sink: list[float] | None = None
    seed: int = 0


def build_prefill(c: PrefillCase) -> tuple[tuple, dict]:
    gen = torch.Generator().manual_seed(c.seed)
    q = torch.randn(c.s_q, c.h, c.d_qk, generator=gen).to(torch.bfloat16)
    kv = torch.randn(c.s_kv, 1, c.d_qk, generator=gen).to(torch.bfloat16)
    kv[0] = math.nan  # invalid indices must not leak through a clamped gather
    indices = torch.randint(1, c.s_kv, (c.s_q, 1, c.topk), generator=gen, dtype=torch.int32)
    r = torch.rand(indices.shape, generator=gen)
    indices[r < 0.1] = -1
    indices[(r >= 0.1) & (r < 0.15)] = c.s_kv  # out of range: invalid in prefill
    indices[(r >= 0.15) & (r < 0.2)] = c.s_kv + 1000
    indices[(r >= 0.2) & (r < 0.25)] = -5
    indices[-1] = -1  # a query with no valid key
    kwargs: dict = {}
    if c.topk_length:
        lengths = torch.randint(0, c.topk + 1, (c.s_q,), generator=gen, dtype=torch.int32)
        lengths[0] = 0
        kwargs["topk_length"] = lengths
        for i, n in enumerate(lengths.tolist()):
            indices[i, 0, n:] = 0  # the NaN row, ignored past the length
    if c.sink is not None:
        kwargs["attn_sink"] = torch.tensor(c.sink)
    return (q, kv, indices, c.d_qk**-0.5), kwargs


PREFILL_CASES = {
    "576": PrefillCase(576, s_q=6, s_kv=100, h=8, topk=64),
    "512-3heads": PrefillCase(512, s_q=5, s_kv=40, h=3, topk=32, topk_length=True),
    "512-sink": PrefillCase(
        512, s_q=6, s_kv=70, h=4, topk=48, topk_length=True, sink=[0.5, INF, -INF, -3.0], seed=1
    ),
    "576-sink": PrefillCase(576, s_q=4, s_kv=20, h=2, topk=16, sink=[2.0, -1.0], seed=2),
}


@pytest.mark.parametrize("name", list(PREFILL_CASES))
def test_prefill_matches_slow_reference(name: str) -> None:
    args, kwargs = build_prefill(PREFILL_CASES[name])
    out, max_logits, lse = sparse_mla_prefill(*args, **kwargs)
    ref_out, ref_max, ref_lse = slow_prefill(*args, **kwargs)
    s_q, h, _ = args[0].shape
    assert out.dtype == max_logits.dtype == lse.dtype == torch.float32
    assert out.shape == (s_q, h, 512) and lse.shape == max_logits.shape == (s_q, h)
    assert bool(torch.isfinite(out).all())
    torch.testing.assert_close(out.double(), ref_out, **TOL)
    torch.testing.assert_close(max_logits.double(), ref_max, **TOL)
    torch.testing.assert_close(lse.double(), ref_lse, **TOL)
    # The last query has no valid key.
    assert bool((out[-1] == 0).all())
    assert bool((lse[-1] == INF).all()) and bool((max_logits[-1] == -INF).all())


def test_prefill_index_shapes_strides_and_blocks() -> None:
    args, kwargs = build_prefill(PREFILL_CASES["512-sink"])
    q, kv, indices, scale = args
    ref = sparse_mla_prefill(q, kv, indices, scale, **kwargs)
    flat = sparse_mla_prefill(q, kv[:, 0], indices[:, 0], scale, **kwargs)
    q_nc = q.transpose(0, 1).contiguous().transpose(0, 1)
    assert not q_nc.is_contiguous()
    strided = sparse_mla_prefill(q_nc, kv, indices, scale, **kwargs)
    tiny = sparse_mla_prefill(q, kv, indices, scale, **kwargs, block_bytes=1)
    for got in (flat, strided):
        for a, b in zip(got, ref, strict=True):
            torch.testing.assert_close(a, b, atol=0, rtol=0)
    for a, b in zip(tiny, ref, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_prefill_rejects_bad_inputs() -> None:
    args, _ = build_prefill(PREFILL_CASES["576"])
    q, kv, indices, scale = args
    with pytest.raises(ValueError, match="kv"):
        sparse_mla_prefill(q, kv[..., :512], indices, scale)
    with pytest.raises(ValueError, match="indices"):
        sparse_mla_prefill(q, kv, indices[:3], scale)
    with pytest.raises(ValueError, match="topk_length"):
        sparse_mla_prefill(q, kv, indices, scale, topk_length=torch.zeros(2))
    with pytest.raises(ValueError, match="d_v"):
        sparse_mla_prefill(q, kv, indices, scale, d_v=600)


def test_decode_and_prefill_agree() -> None:
    """One V4 problem both ways: FP8 decode with an extra cache, and bf16-free prefill over
    the dequantized [main; extra] kv with merged indices."""
    c = DECODE_CASES["v4-sink-extra"]
    args, kwargs = build_decode(c)
    q, cache, indices, scale = args
    out, lse = sparse_mla_decode(q, cache, indices, scale, **kwargs)

    main_kv = dequantize_v4(cache)
    extra_kv = dequantize_v4(kwargs["extra_k_cache"])
    kv = torch.cat([main_kv, extra_kv]).nan_to_num(0.0)[:, None]  # poisoned rows never used
    tokens = c.b * c.s_q
    window_len = kwargs["topk_length"].repeat_interleave(c.s_q)
    extra_len = kwargs["extra_topk_length"].repeat_interleave(c.s_q)
    merged, lengths = merge_window_extra(
        indices.view(tokens, -1),
        window_len,
        kwargs["extra_indices"].view(tokens, -1),
        extra_len,
        main_kv.shape[0],
    )
    p_out, _, p_lse = sparse_mla_prefill(
        q.view(tokens, c.h, -1),
        kv,
        merged,
        scale,
        attn_sink=kwargs["attn_sink"],
        topk_length=lengths,
    )
    torch.testing.assert_close(p_out.view_as(out), out, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(
        p_lse.view(c.b, c.s_q, c.h).transpose(1, 2), lse, atol=1e-6, rtol=1e-6
    )


@pytest.mark.gpu
def test_cuda_matches_cpu() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    saved = torch.backends.cuda.matmul.fp32_precision
    torch.backends.cuda.matmul.fp32_precision = "tf32"  # the oracle must not use it
    try:
        for case in ("v32", "v4-sink-extra"):
            args, kwargs = build_decode(DECODE_CASES[case])
            cpu = sparse_mla_decode(*args, **kwargs)
            gpu = sparse_mla_decode(*_to_cuda(args), **_to_cuda(kwargs))
            for a, b in zip(gpu, cpu, strict=True):
                assert a.is_cuda
                torch.testing.assert_close(a.cpu(), b, atol=1e-5, rtol=1e-5)
        for case in ("576", "512-sink"):
            args, kwargs = build_prefill(PREFILL_CASES[case])
            cpu = sparse_mla_prefill(*args, **kwargs)
            gpu = sparse_mla_prefill(*_to_cuda(args), **_to_cuda(kwargs))
            for a, b in zip(gpu, cpu, strict=True):
                assert a.is_cuda
                torch.testing.assert_close(a.cpu(), b, atol=1e-5, rtol=1e-5)
        assert torch.backends.cuda.matmul.fp32_precision == "tf32"
    finally:
        torch.backends.cuda.matmul.fp32_precision = saved


def _to_cuda(x):  # noqa: ANN001, ANN202
    if isinstance(x, torch.Tensor):
        if x.dtype == torch.uint8 and x.shape[-1] == 584:
            # Keep the padded page stride: copy the whole storage, then the same view.
            storage = torch.as_strided(x, (x.untyped_storage().nbytes(),), (1,), 0).cuda()
            return torch.as_strided(storage, x.shape, x.stride(), x.storage_offset())
        return x.cuda()
    if isinstance(x, tuple):
        return tuple(_to_cuda(v) for v in x)
    if isinstance(x, dict):
        return {k: _to_cuda(v) for k, v in x.items()}
    return x
