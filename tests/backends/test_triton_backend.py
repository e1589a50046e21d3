"""The project's Triton kernels (dequant V4 / V3.2, remap), run on the CPU through Triton's
interpreter at tiny sizes, bit for bit against reference/; the gpu-marked test repeats the checks
with the compiled kernels on CUDA at realistic sizes.

NOT shown here without a GPU: that the compiled kernels give the same bits (the interpreter
runs the same kernel code through numpy, not PTX), their speed, and launch details (device
guard, specialization on 16-byte alignment).
"""

from __future__ import annotations

import sys

import pytest
import torch

triton = pytest.importorskip("triton", reason="needs triton (pip install triton)")

from dsv4bench.backends.base import Provider, Unsupported  # noqa: E402
from dsv4bench.backends.torch_ref import oracle_call  # noqa: E402
from dsv4bench.backends.triton import backend as tk  # noqa: E402
from dsv4bench.backends.triton import cache_ops  # noqa: E402
from dsv4bench.cases import inputs as case_inputs  # noqa: E402
from dsv4bench.cases.case import Case  # noqa: E402
from dsv4bench.cases.output import Output  # noqa: E402
from dsv4bench.measure import metrics  # noqa: E402
from reference import indices, layouts  # noqa: E402


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int16)


def _assert_bits_equal(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Bit-exact, except that NaN only has to be NaN (its payload is free)."""
    assert actual.dtype == expected.dtype == torch.bfloat16
    assert actual.shape == expected.shape
    nan = torch.isnan(expected)
    assert torch.equal(torch.isnan(actual), nan)
    diff = (_bits(actual) != _bits(expected)) & ~nan
    assert not bool(diff.any()), f"{int(diff.sum())} values differ, first at {diff.nonzero()[0]}"


def _reference(cache: torch.Tensor, slots: torch.Tensor | None = None) -> torch.Tensor:
    return layouts.to_workspace(cache, slots).squeeze(1)


def _restride_v4(cache: torch.Tensor, extra_stride: int, offset: int) -> torch.Tensor:
    """The same V4 cache in a bigger buffer of random bytes: page stride padded by extra_stride
    bytes and the view starting offset bytes in (the kernel must read neither kind of padding)."""
    num_pages, page_size = cache.shape[:2]
    stride = cache.stride(0) + extra_stride
    g = torch.Generator().manual_seed(1)
    buf = torch.randint(0, 256, (offset + num_pages * stride,), generator=g, dtype=torch.uint8)
    buf = buf.to(cache.device)
    shape = (num_pages, page_size, 1, layouts.V4_TOKEN_BYTES)
    view = torch.as_strided(buf, shape, (stride, 584, 584, 1), offset)
    view.copy_(cache)  # the logical bytes: token data and scales of every page
    return view


def _v4_cache(num_tokens: int, page_size: int, device="cpu", seed: int = 0) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(seed)
    kv = torch.randn(num_tokens, 512, generator=g, device=device)
    kv = kv * torch.exp2(torch.randint(-12, 12, (num_tokens, 1), generator=g, device=device))
    return layouts.quantize_v4(kv.to(torch.bfloat16), page_size)


def _v32_cache(num_tokens: int, block_size: int, scale: str, device="cpu", seed: int = 0):
    g = torch.Generator(device=device).manual_seed(seed)
    kv = torch.randn(num_tokens, 576, generator=g, device=device)
    kv = kv * torch.exp2(torch.randint(-12, 12, (num_tokens, 1), generator=g, device=device))
    return layouts.quantize_v32(kv.to(torch.bfloat16), block_size, scale=scale)


# ---- V4 dequant ---------------------------------------------------------------------------


@pytest.mark.parametrize("page_size,num_tokens", [(2, 9), (64, 150)])
def test_dequant_v4_bit_exact(page_size, num_tokens):
    cache = _v4_cache(num_tokens, page_size)
    assert cache.stride(0) == layouts.v4_page_stride(page_size) != page_size * 584
    out = cache_ops.dequant_v4(cache)
    assert out.shape == (cache.shape[0] * page_size, 512)
    _assert_bits_equal(out, _reference(cache))


@pytest.mark.parametrize("page_size", [2, 64])
def test_dequant_v4_padded_stride_and_offset(page_size):
    cache = _v4_cache(3 * page_size, page_size, seed=page_size)
    for extra, offset in ((576, 1152), (1000, 3), (0, 17)):
        view = _restride_v4(cache, extra, offset)
        assert view.storage_offset() == offset
        _assert_bits_equal(cache_ops.dequant_v4(view), _reference(cache))


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_dequant_v4_every_byte():
    """Every e4m3 byte (subnormals, -0, NaN) under every scale byte (2^-127 .. +inf)."""
    page_size = 4
    cache = _v4_cache(4 * page_size, page_size)
    data, scales = layouts._v4_token_views(cache)
    g = torch.Generator().manual_seed(3)
    data[..., :448] = torch.randint(0, 256, data[..., :448].shape, generator=g, dtype=torch.uint8)
    data[0, 0, :256] = torch.arange(256, dtype=torch.uint8)
    scales[..., :7] = torch.randint(0, 256, scales[..., :7].shape, generator=g, dtype=torch.uint8)
    scales[0, 0, :7] = torch.tensor([0, 1, 2, 127, 200, 254, 255], dtype=torch.uint8)
    _assert_bits_equal(cache_ops.dequant_v4(cache), _reference(cache))


def test_dequant_v4_e4m3_dtype_and_slots():
    cache = _v4_cache(2 * 64, 64).view(torch.float8_e4m3fn)  # FlashMLA's test writer's dtype
    slots = torch.tensor([127, 0, 64, 5, 5, 100], dtype=torch.int32)
    _assert_bits_equal(cache_ops.dequant_v4(cache, slots), _reference(cache, slots))
    _assert_bits_equal(cache_ops.dequant(cache, "v4"), _reference(cache))
    assert cache_ops.dequant_v4(cache, slots[:0]).shape == (0, 512)
    with pytest.raises(ValueError, match="slots must lie"):
        cache_ops.dequant_v4(cache, torch.tensor([128]))


def test_dequant_rejects_bad_caches():
    cache = _v4_cache(4, 2)
    with pytest.raises(ValueError, match="stride\\(1\\) == 584"):
        cache_ops.dequant_v4(torch.as_strided(cache, cache.shape, (2000, 600, 600, 1)))
    with pytest.raises(ValueError, match="v32 cache"):
        cache_ops.dequant_v32(cache)
    with pytest.raises(ValueError, match="v4 cache must be"):  # the layout is named, not inferred
        cache_ops.dequant(torch.zeros(1, 2, 1, 100, dtype=torch.uint8), "v4")
    with pytest.raises(ValueError, match="v4 or v32"):
        cache_ops.dequant(cache, "bf16")


# ---- V3.2 dequant -------------------------------------------------------------------------


@pytest.mark.parametrize("scale", ["pow2", "raw"])
def test_dequant_v32_bit_exact(scale):
    cache = _v32_cache(100, 64, scale)
    out = cache_ops.dequant_v32(cache)
    assert out.shape == (128, 576)
    _assert_bits_equal(out, _reference(cache))


def test_dequant_v32_rounding_every_byte_and_strides():
    """Random e4m3 bytes times random fp32 scales (subnormal included): one RNE rounding, as
    the oracle rounds; read through a view with padded block and token strides."""
    cache = _v32_cache(16, 4, "raw")
    rec = cache[:, :, 0]
    g = torch.Generator().manual_seed(5)
    rec[..., :512] = torch.randint(0, 256, rec[..., :512].shape, generator=g, dtype=torch.uint8)
    rec[0, 0, :256] = torch.arange(256, dtype=torch.uint8)
    sc = torch.randn(4, 4, 4, generator=g) * torch.exp2(
        torch.randint(-30, 30, (4, 4, 4), generator=g).float()
    )
    sc[0, 0] = torch.tensor([1e-40, 3.0, 1.0 / 3.0, 65504.0])
    rec[..., 512:528] = sc.contiguous().view(torch.uint8).view(4, 4, 16)
    buf = torch.randint(0, 256, (7 + 4 * 3000,), generator=g, dtype=torch.uint8)
    view = torch.as_strided(buf, cache.shape, (3000, 700, 700, 1), 7)
    view.copy_(cache)
    _assert_bits_equal(cache_ops.dequant_v32(view), _reference(cache))
    slots = torch.tensor([15, 2, 2, 0], dtype=torch.int64)
    _assert_bits_equal(cache_ops.dequant_v32(view, slots), _reference(cache, slots))


# ---- remap --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("page_size", [1, 64, 256])
def test_remap_matches_reference(dtype, page_size):
    g = torch.Generator().manual_seed(page_size)
    b, s_q, topk, max_blocks = 3, 4, 70, 5
    local = torch.randint(-3, page_size * (max_blocks + 2), (b, s_q, topk), generator=g)
    local[:, :, -5:] = -1
    local[0, 0, :3] = torch.tensor([0, page_size * max_blocks, page_size * max_blocks - 1])
    wide = torch.randint(-1, 40, (b, 2 * max_blocks), generator=g, dtype=torch.int32)
    table = wide[:, ::2]  # a non-contiguous block table, with -1 entries
    table[1, 0] = -7
    local = local.to(dtype)
    out = cache_ops.remap(local, table, page_size)
    expected = indices.to_global_slots(local, table, page_size)
    assert out.dtype == dtype and out.shape == local.shape
    assert torch.equal(out, expected)
    assert bool((out == -1).any()) and bool((out >= 0).any())


def test_remap_two_dims_and_empty():
    local = torch.tensor([[0, 5, -1, 9], [3, -1, -1, 8]], dtype=torch.int32)
    table = torch.tensor([[4, 2], [-1, 7]], dtype=torch.int32)
    assert cache_ops.remap(local, table, 4).tolist() == [[16, 9, -1, -1], [-1, -1, -1, -1]]
    empty = torch.zeros(2, 0, dtype=torch.int32)
    assert cache_ops.remap(empty, table, 4).shape == (2, 0)
    with pytest.raises(ValueError, match="block_table"):
        cache_ops.remap(local, table[:1], 4)


# ---- the backend --------------------------------------------------------------------------


def _case(op: str, **kw) -> Case:
    base = dict(scenario="t", op=op, model="v4-flash", d_qk=512, d_v=512, num_heads=64)
    return Case(**{**base, **kw})


V4_DEQUANT = _case("dequant", batch_size=1, context_len=128, page_size=64, layout="v4")
V32_DEQUANT = _case(
    "dequant", model="v3.2", d_qk=576, num_heads=128, context_len=96, page_size=64, layout="v32"
)
REMAP = _case("remap", batch_size=2, s_q=3, topk=64, context_len=200, page_size=64, layout="v4")


def test_provider_and_supports():
    b = tk.TritonKernels()
    ops = ("dequant", "remap", "indexer", "decode", "prefill", "page_split", "topk")
    assert (b.name, b.archs, b.ops) == ("triton", ("sm90", "sm100", "sm120"), ops)
    assert b.provider() == Provider(
        "triton", triton.__version__, "dsv4bench.backends.triton_kernels"
    )
    assert b.supports(V4_DEQUANT, "sm90") is None
    assert b.supports(V32_DEQUANT, "sm100") is None
    assert b.supports(REMAP, "sm120") is None
    assert "not cpu" in b.supports(V4_DEQUANT, "cpu")
    assert b.supports(_case("decode", layout="v4"), "sm90") is None  # triton_attention
    assert "not layout bf16" in b.supports(_case("dequant", layout="bf16"), "sm90")
    assert "not 576" in b.supports(_case("dequant", layout="v4", d_qk=576), "sm90")
    assert b.v32_scale_reading("sm90") is None  # fp32 scales read exactly


def test_provider_without_triton(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` raises ImportError
    with pytest.raises(Unsupported, match="Triton not found: pip install triton"):
        tk.TritonKernels().provider()


@pytest.mark.parametrize("case", [V4_DEQUANT, V32_DEQUANT, REMAP], ids=["v4", "v32", "remap"])
def test_prepare_run_finish(case):
    x = case_inputs.make_inputs(case, "cpu")
    expected = oracle_call(case, x)()
    prepared = tk.TritonKernels().prepare(case, x, "cpu")
    assert prepared.info["kernel"] in ("dequant_v4", "dequant_v32", "remap")
    poisoned = prepared.poison()  # returns the output it filled
    if case.op == "remap":
        assert bool((poisoned == tk.REMAP_POISON).all())
    else:
        assert bool(torch.isnan(poisoned).all())
    actual = prepared.finish(prepared.run())
    assert isinstance(actual, Output) and actual.lse is None
    assert actual.out.dtype == expected.out.dtype and actual.out.shape == expected.out.shape
    acc = metrics.accuracy(expected, actual)
    assert acc["mismatched"] == 0 and acc["nonfinite"] == 0, acc
    assert torch.equal(actual.out, expected.out)


def test_prepare_rejects():
    b = tk.TritonKernels()
    with pytest.raises(Unsupported, match="not layout bf16"):
        b.prepare(_case("dequant", layout="bf16"), {}, "cpu")
    with pytest.raises(Unsupported, match="triton decode reads the v32 cache"):
        b.prepare(_case("decode", layout="bf16"), {}, "cpu")
    x = case_inputs.make_inputs(V4_DEQUANT, "cpu")
    with pytest.raises(ValueError, match="k_cache rows are 584 B, layout v32 needs 656"):
        b.prepare(V32_DEQUANT, x, "cpu")


# ---- on a GPU: the compiled kernels at realistic sizes --------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_compiled_kernels_on_cuda():
    dev = "cuda"
    for page_size in (64, 256):
        cache = _v4_cache(65536, page_size, device=dev)
        expected = _reference(cache.cpu())
        _assert_bits_equal(cache_ops.dequant_v4(cache).cpu(), expected)
        view = _restride_v4(cache, 576, 576 * 3)
        _assert_bits_equal(cache_ops.dequant_v4(view).cpu(), expected)
        odd = _restride_v4(cache, 8, 1)  # unaligned: no 16-byte vector loads possible
        _assert_bits_equal(cache_ops.dequant_v4(odd).cpu(), expected)
        slots = torch.randperm(cache.shape[0] * page_size, device=dev)[:20000]
        _assert_bits_equal(cache_ops.dequant_v4(cache, slots).cpu(), expected[slots.cpu()])
    for scale in ("pow2", "raw"):
        cache = _v32_cache(65536, 64, scale, device=dev)
        _assert_bits_equal(cache_ops.dequant_v32(cache).cpu(), _reference(cache.cpu()))

    g = torch.Generator(device=dev).manual_seed(0)
    local = torch.randint(-2, 70000, (4, 1024, 2176), generator=g, device=dev, dtype=torch.int32)
    table = torch.randint(-1, 4096, (4, 1024), generator=g, device=dev, dtype=torch.int32)
    out = cache_ops.remap(local, table, 64)
    assert torch.equal(out.cpu(), indices.to_global_slots(local.cpu(), table.cpu(), 64))

    backend = tk.TritonKernels()
    serving_v4 = _case("dequant", context_len=65536, page_size=256, layout="v4")
    serving_v32 = _case(
        "dequant", model="v3.2", d_qk=576, context_len=65536, page_size=64, layout="v32"
    )
    serving_remap = _case("remap", s_q=4096, topk=2176, context_len=4096, page_size=64)
    for case in (serving_v4, serving_v32, serving_remap):
        x = case_inputs.make_inputs(case, dev)
        expected_out = oracle_call(case, x)()
        prepared = backend.prepare(case, x, dev)
        prepared.poison()
        actual = prepared.finish(prepared.run())
        torch.cuda.synchronize()
        acc = metrics.accuracy(expected_out, actual)
        assert acc["mismatched"] == 0 and acc["nonfinite"] == 0, (case.op, case.layout, acc)
