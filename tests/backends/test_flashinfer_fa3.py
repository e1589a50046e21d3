"""FlashInfer's sm90 path (FA3 MLA as sparse attention): the adapter around a fake wrapper on the
CPU, and on a GPU the real kernel, the fake checked against it on the same inputs.

The fake (FakeFA3Wrapper) takes the plan()/run() arguments of flashinfer 0.6.18's
BatchMLAPagedAttentionWrapper, checks what the real one checks (dtypes as planned, page_size 1,
head_dim_ckv 512 and kpe 0/64 for FP8, exactly one ckv scale form plus kpe_scale), and computes
what the H100 probe showed the kernel computes
(results/sm90/studies/engine-kernels/flashinfer-fa3/notes/probe.txt): K in bf16
(FP8: bf16(e4m3 * scale) per token and 128 columns, bf16(bf16(e4m3) * bf16(kpe_scale))), lse of
the keys in natural log with return_lse_base_on_e (base 2 otherwise), out 0 and lse -inf for a
row with no key, any head count. The GPU test runs once per FlashInfer build of the kernels
folder (0.7.2.post1 and 0.6.18: tests/kernel_builds.py).
"""

from __future__ import annotations

import math

import pytest
import torch

from dsv4bench.backends.base import Provider, Unsupported
from dsv4bench.backends.flashinfer import sm90 as fa3
from dsv4bench.backends.flashinfer.backend import FlashInfer, KernelOps
from dsv4bench.backends.torch_ref import oracle_call
from dsv4bench.cases.case import Case
from dsv4bench.cases.inputs import make_inputs
from dsv4bench.measure import metrics
from reference import attention
from tests.kernel_builds import build_folder, build_params, expect_supported, loaded_from, ran_alone

V32 = dict(model="v3.2", d_qk=576, layout="v32", num_heads=16, topk=200, page_size=64)
V4 = dict(
    model="v4-flash",
    d_qk=512,
    layout="v4",
    num_heads=12,
    topk=128,
    window=128,
    extra_topk=64,
    compress_ratio=4,
    page_size=256,
    sink=True,
)


def make_case(op="decode", **kw) -> Case:
    fields = dict(scenario="t", op=op, model="m", d_qk=512, d_v=512, num_heads=8)
    fields.update(kw)
    return Case(**fields)


class FakeFA3Wrapper:
    """BatchMLAPagedAttentionWrapper(backend="fa3") computed with the reference code."""

    instances: list = []

    def __init__(self, float_workspace_buffer, backend="auto"):
        assert backend == "fa3"
        self.plans = 0
        self.runs = 0
        self.write = True
        FakeFA3Wrapper.instances.append(self)

    def plan(
        self,
        qo_indptr,
        kv_indptr,
        kv_indices,
        kv_len_arr,
        num_heads,
        head_dim_ckv,
        head_dim_kpe,
        page_size,
        causal,
        sm_scale,
        q_data_type,
        kv_data_type,
    ):
        assert kv_data_type in (torch.bfloat16, torch.float16, torch.float8_e4m3fn)
        if kv_data_type == torch.float8_e4m3fn:
            assert q_data_type == torch.bfloat16
            assert head_dim_ckv == 512 and head_dim_kpe in (0, 64)
        assert page_size == 1 and causal is False
        for t in (qo_indptr, kv_indptr, kv_len_arr, kv_indices):
            assert t.dtype == torch.int32
        assert torch.equal(kv_indptr[1:] - kv_indptr[:-1], kv_len_arr)
        self.p = dict(
            qo=qo_indptr.clone(),
            kvp=kv_indptr.clone(),
            ind=kv_indices.clone(),
            heads=num_heads,
            ckv=head_dim_ckv,
            kpe=head_dim_kpe,
            scale=sm_scale,
            qt=q_data_type,
            kt=kv_data_type,
        )
        self.plans += 1

    def run(
        self,
        q_nope,
        q_pe,
        ckv_cache,
        kpe_cache,
        out=None,
        lse=None,
        return_lse=False,
        return_lse_base_on_e=False,
        *,
        ckv_scale=None,
        ckv_scale_arr=None,
        kpe_scale=None,
    ):
        p = self.p
        self.runs += 1
        assert q_nope.dtype == q_pe.dtype == p["qt"]
        assert ckv_cache.dtype == kpe_cache.dtype == p["kt"]
        t, h, _ = q_nope.shape
        assert h == p["heads"] and q_pe.shape == (t, h, p["kpe"]) and ckv_cache.shape[1] == 1
        assert torch.equal(p["qo"], torch.arange(t + 1, dtype=torch.int32))  # a row per query
        if p["kt"] == torch.float8_e4m3fn:
            assert (ckv_scale is None) != (ckv_scale_arr is None) and kpe_scale is not None
            if ckv_scale_arr is not None:
                assert ckv_scale_arr.shape == (*ckv_cache.shape[:-1], 4)
                assert ckv_scale_arr.dtype == torch.float32 and ckv_scale_arr.is_contiguous()
                g = ckv_cache.float().view(-1, 4, 128) * ckv_scale_arr.view(-1, 4, 1)
                ckv = g.to(torch.bfloat16).view(-1, 512)
            else:
                ckv = (ckv_cache.float()[:, 0] * float(ckv_scale)).to(torch.bfloat16)
            ks = torch.tensor(kpe_scale, dtype=torch.bfloat16).float()
            kpe = (kpe_cache.float()[:, 0] * ks).to(torch.bfloat16)
        else:
            assert ckv_scale is None and ckv_scale_arr is None and kpe_scale is None
            ckv, kpe = ckv_cache[:, 0], kpe_cache[:, 0]
        kv = torch.cat([ckv, kpe], -1).float()
        lens = p["kvp"][1:] - p["kvp"][:-1]
        width = max(int(lens.max()) if t else 0, 1)
        table = torch.full((t, width), -1, dtype=torch.int64)
        for i in range(t):
            s, e = int(p["kvp"][i]), int(p["kvp"][i + 1])
            table[i, : e - s] = p["ind"][s:e].long().cpu()
        q = torch.cat([q_nope, q_pe], -1).float()
        o, _, lse_e = attention.sparse_mla_prefill(q, kv.cpu()[:, None], table, p["scale"], d_v=512)
        lse_e = lse_e.masked_fill(lens.view(-1, 1) == 0, -math.inf)
        out = torch.empty_like(q_nope) if out is None else out
        lse = torch.empty(t, h) if lse is None else lse
        if self.write:
            out.copy_(o.to(out.device, out.dtype))
            lse.copy_(lse_e if return_lse_base_on_e else lse_e / math.log(2.0))
        return (out, lse) if return_lse else out


def backend(kv_dtype="bf16", wrapper=FakeFA3Wrapper) -> FlashInfer:
    ops = KernelOps(Provider("fake-flashinfer", "0"), fa3_mla=wrapper)
    return FlashInfer(ops=ops, kv_dtype=kv_dtype, arch="sm90")


def judge(case: Case, p, x, device="cpu"):
    """The kernel's own error: against oracle(reads) when given, else oracle(inputs) (the
    worker judges rows against oracle(inputs) and keeps this one in info.kernel_own)."""
    if p.poison is not None:
        p.poison()
    got = p.finish(p.run())
    expected = oracle_call(case, x)()
    conversion = None
    if p.reads is not None:
        on_reads = oracle_call(case, p.reads)()
        conversion = metrics.accuracy(expected, on_reads)
        expected = on_reads
    return metrics.accuracy(expected, got), conversion, got


def run_case(case: Case, kv_dtype="bf16", x=None, device="cpu", wrapper=FakeFA3Wrapper):
    x = make_inputs(case, device) if x is None else x
    p = backend(kv_dtype, wrapper).prepare(case, x, device)
    acc, conversion, got = judge(case, p, x)
    return p, acc, conversion, got


# ---- CPU, fake wrapper --------------------------------------------------------------------


@pytest.mark.parametrize("kv_dtype", ["bf16", "e4m3"])
@pytest.mark.parametrize("base", [V32, V4], ids=["v32", "v4"])
def test_decode_matches_the_oracle_on_what_it_reads(base, kv_dtype):
    case = make_case(**base, batch_size=2, s_q=2, context_len=1024)
    p, acc, conversion, got = run_case(case, kv_dtype)
    assert acc["nonfinite"] == 0 and acc["cos_diff"] < 5e-6, acc
    assert acc["lse_max_abs"] < 1e-4
    assert got.out.shape == (2, 2, case.num_heads, 512) and got.lse.shape == (2, case.num_heads, 2)
    assert p.info["padded_heads"] == case.num_heads  # no padding: 12 and 16 heads as they are
    assert p.info["head_dim_kpe"] == (64 if base is V32 else 0)
    assert p.info["plan_ms"] >= 0 and p.info["convert_ms"] >= 0
    if kv_dtype == "bf16":
        assert p.reads is None and p.info["reads_exact"]  # bf16 of e4m3 * 2^k: exact
    else:
        assert p.reads is not None and p.info["reads_exact"]
        assert 0 < conversion["cos_diff"] < 1e-3  # the rope (and V4 tiles) lost bits


def test_v32_e4m3_reads_the_cache_latent_in_place():
    case = make_case(**V32, batch_size=2, context_len=512)
    x = make_inputs(case, "cpu")
    p = backend("e4m3").prepare(case, x, "cpu")
    w = FakeFA3Wrapper.instances[-1]
    assert w.plans == (2 if "compile_s" in p.info else 1)  # a variant's first plan compiles
    cache = x["k_cache"]
    p.run()
    assert p.info["ckv"].startswith("V3.2 latent bytes")
    assert torch.equal(p.reads["indices"], x["indices"])
    # the reads differ from the input only in the rope bytes
    diff = (p.reads["k_cache"] != cache).reshape(-1, 656).any(0)
    assert not diff[:528].any() and diff[528:].any()


def test_v32_raw_scales_are_judged_on_the_kernels_reading_and_say_what_it_reads():
    # raw (vLLM, max|x|/448) scales: the kernel reads bf16(e4m3 * fp32 scale), not FlashMLA's
    # bf16 scale; declared as the backend's scale reading, the row is judged on what it reads
    case = make_case(**V32, batch_size=2, context_len=512, scale_convention="raw")
    be = backend("e4m3")
    reading = be.v32_scale_reading("sm90")
    assert reading == "bf16-product" == fa3.V32_SCALE_READING
    x = make_inputs(case, "cpu")
    p = be.prepare(case, x, "cpu")
    assert p.reads is not None and not p.info["reads_exact"]  # bf16-rounded, but representable
    assert p.info["reads_what"]["q"].startswith("bf16, not quantized")
    assert "fp32 scale not rounded" in p.info["reads_what"]["latent"]
    got = p.finish(p.run())
    on_reads = oracle_call(case, p.reads, reading)()
    acc = metrics.accuracy(on_reads, got)
    assert acc["cos_diff"] < 5e-6, acc  # the kernel's own error only
    exact = metrics.accuracy(oracle_call(case, x)(), got)
    assert exact["cos_diff"] > 2 * acc["cos_diff"]  # the reading and the rope moved it
    # FlashMLA's sm90 reading (the scale rounded to bf16 first) is another answer
    flashmla_way = oracle_call(case, p.reads, "bf16")()
    assert not torch.equal(flashmla_way.out, on_reads.out)


def test_one_index_list_per_query_row_over_one_pool():
    case = make_case(**V4, batch_size=2, s_q=2, context_len=1024)
    x = make_inputs(case, "cpu")
    backend().prepare(case, x, "cpu")
    p = FakeFA3Wrapper.instances[-1].p
    main = x["k_cache"].shape[0] * x["k_cache"].shape[1]
    idx, ext = x["indices"].reshape(4, -1), x["extra_indices"].reshape(4, -1)
    want = [
        torch.cat([idx[i][idx[i] >= 0], ext[i][ext[i] >= 0] + main]).to(torch.int32)
        for i in range(4)
    ]
    assert torch.equal(p["ind"], torch.cat(want))
    assert p["kvp"].tolist() == [0, *torch.cumsum(torch.tensor([len(w) for w in want]), 0)]
    assert p["ckv"] == 512 and p["kpe"] == 0 and p["scale"] == pytest.approx(512**-0.5)


def test_topk_length_shortens_the_index_lists():
    case = make_case(**V32, batch_size=2, s_q=2, context_len=1024)
    x = make_inputs(case, "cpu")
    x["topk_length"] = torch.tensor([150, 120], dtype=torch.int32)
    p, acc, _, _ = run_case(case, x=x)
    assert acc["cos_diff"] < 5e-6
    lens = FakeFA3Wrapper.instances[-1].p["kvp"].diff()
    assert lens.tolist() == [150, 150, 120, 120]


@pytest.mark.parametrize("kv_dtype", ["bf16", "e4m3"])
@pytest.mark.parametrize("base", [V32, V4], ids=["v32", "v4"])
def test_prefill_matches_the_oracle(base, kv_dtype):
    case = make_case("prefill", **base, tokens=24, context_len=600)
    p, acc, conversion, got = run_case(case, kv_dtype)
    assert acc["nonfinite"] == 0 and acc["cos_diff"] < 5e-6, acc
    assert got.out.shape == (24, case.num_heads, 512) and got.lse.shape == (24, case.num_heads)
    assert (p.reads is None) == (kv_dtype == "bf16")
    if conversion is not None:
        assert 0 < conversion["cos_diff"] < 1e-3


def test_decode_kernel_route_and_explicit_head_padding():
    for route in ("decode-kernel", "decode-mixed"):  # (T, 1) or (1, T) decode-shaped inputs
        case = make_case("prefill", **V4, tokens=8, context_len=600, route=route)
        p, acc, _, got = run_case(case)
        assert acc["cos_diff"] < 5e-6 and got.out.shape == (8, 12, 512)
    padded = make_case(**{**V32, "head_padding": "64"}, batch_size=1, context_len=512)
    p, acc, _, got = run_case(padded)
    assert p.info["padded_heads"] == 64 and got.out.shape[2] == 16 and acc["cos_diff"] < 5e-6


def test_a_row_without_keys_gives_zero_and_the_oracles_inf():
    case = make_case(**V32, batch_size=2, context_len=512)
    x = make_inputs(case, "cpu")
    x["indices"] = x["indices"].clone()
    x["indices"][1] = -1
    p, acc, _, got = run_case(case, x=x)
    assert acc["lse_mismatch"] == 0 and acc["cos_diff"] < 5e-6
    assert torch.isposinf(got.lse[1]).all() and (got.out[1] == 0).all()


def test_poison_catches_a_kernel_that_writes_nothing():
    case = make_case(**V4, batch_size=1, context_len=512)
    p = backend().prepare(case, make_inputs(case, "cpu"), "cpu")
    FakeFA3Wrapper.instances[-1].write = False
    p.poison()
    got = p.finish(p.run())
    assert torch.isnan(got.out).all()


def test_sm90_support_rules():
    b = backend()
    assert b.supports(make_case(**V32), "sm90") is None
    assert b.supports(make_case("prefill", **V4, tokens=8), "sm90") is None
    assert "d_qk" in b.supports(make_case(**{**V32, "d_qk": 640}), "sm90")
    assert "exceed" in b.supports(make_case(**{**V32, "head_padding": "8"}), "sm90")
    assert "decode kernels" in b.supports(make_case("prefill", **V4, tokens=8), "sm100")
    assert b.options == {"kv_dtype": "bf16", "past_planner_limit": False, "lib": None}
    assert backend("e4m3").kv_dtype == "e4m3"


def test_past_the_planners_work_items_is_unsupported_unless_asked():
    at, past = (make_case("prefill", **V4, tokens=t) for t in (16384, 16385))
    assert backend().supports(at, "sm90") is None
    why = backend().supports(past, "sm90")
    assert why.startswith("16385 query rows > the 16384 work items") and "past_planner_limit" in why
    assert "16386 query rows" in backend().supports(
        make_case(**V32, batch_size=8193, s_q=2), "sm90"
    )
    ops = KernelOps(Provider("fake-flashinfer", "0"), fa3_mla=FakeFA3Wrapper)
    anyway = FlashInfer(ops=ops, arch="sm90", past_planner_limit=True)
    assert anyway.supports(past, "sm90") is None
    # prepare (in the worker) honours the option too, and says the row is past the limit
    small = make_case("prefill", **{**V4, "num_heads": 8}, tokens=16385, context_len=16385)
    with pytest.raises(Unsupported, match="16385 query rows"):
        backend().prepare(small, make_inputs(small, "cpu"), "cpu")
    p = anyway.prepare(small, make_inputs(small, "cpu"), "cpu")
    assert p.info["planner_limit"].startswith("16385 query rows > FlashInfer's 16384")


def test_pow2_scales_and_groups():
    x = torch.tensor([0.5, 0.75, 1.0, 448.0, 449.0, 1e-30])
    assert fa3.pow2_at_least(x).tolist() == [0.5, 1.0, 1.0, 512.0, 512.0, 2.0**-99]
    v = torch.randn(3, 512) * torch.tensor([1e-3, 1.0, 1e3]).view(3, 1)
    q, s, reads = fa3.e4m3_groups(v)
    assert s.shape == (3, 4) and torch.equal(torch.log2(s), torch.log2(s).round())
    assert torch.equal(reads, q.float().view(3, 4, 128).mul(s[..., None]).view(3, 512))
    assert metrics.compare_tensors(v, reads)["cos_diff"] < 1e-3


# ---- GPU: the real kernel ------------------------------------------------------------------


def _real_ops(build: str) -> KernelOps:
    """The kernels folder's build `build` loaded as its pinned instance's worker loads it (its
    site/ first on sys.path), with its BatchMLAPagedAttentionWrapper."""
    ops = FlashInfer(lib=build_folder(build)).kernel_ops()
    assert ops.fa3_mla is not None, f"{build}: {ops.provider} has no BatchMLAPagedAttentionWrapper"
    assert ops.names["fa3_mla"] == "flashinfer.mla.BatchMLAPagedAttentionWrapper"
    assert loaded_from(build, ops.provider.location), ops.provider
    return ops


BIG_V32 = {**V32, "num_heads": 128, "topk": 2048, "context_len": 4096}
BIG_V4 = {**V4, "num_heads": 64, "extra_topk": 512, "context_len": 4096}
GPU_CASES = [
    ("decode-v32", make_case(**BIG_V32, batch_size=4, s_q=2)),
    ("decode-v4", make_case(**BIG_V4, batch_size=4, s_q=2)),
    ("decode-v4-h8", make_case(**{**BIG_V4, "num_heads": 8}, batch_size=3)),
    ("prefill-v32", make_case("prefill", **BIG_V32, tokens=256)),
    ("prefill-v4", make_case("prefill", **BIG_V4, tokens=256)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("build", build_params("flashinfer"))
@pytest.mark.parametrize("kv_dtype", ["bf16", "e4m3"])
@pytest.mark.parametrize("name,case", GPU_CASES, ids=[n for n, _ in GPU_CASES])
def test_real_kernel_matches_the_oracle_and_the_fake(request, name, case, kv_dtype, build):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("FlashInfer's FA3 MLA path is sm90: needs an sm90 GPU")
    if ran_alone(request, "flashinfer", build):
        return
    expect_supported(
        build, FlashInfer(lib=build_folder(build), kv_dtype=kv_dtype).supports(case, "sm90")
    )
    real = _real_ops(build)
    x = make_inputs(case, "cuda")
    p, acc, conversion, got = run_case(case, kv_dtype, x=x, device="cuda", wrapper=real.fa3_mla)
    print(
        name,
        build,
        real.provider.version,
        kv_dtype,
        {k: acc[k] for k in ("cos_diff", "lse_max_abs")},
        conversion and conversion["cos_diff"],
        p.info.get("compile_s"),
        p.info["plan_ms"],
    )
    assert acc["nonfinite"] == 0 and acc["lse_mismatch"] == 0
    tol = 5e-6 if case.op == "decode" else 7e-6  # FlashMLA's own test tolerances
    assert acc["cos_diff"] < tol and acc["lse_max_abs"] < 1e-4, acc
    # the fake, on the same inputs (moved to the CPU), agrees with the real kernel
    xc = {k: (v.cpu() if torch.is_tensor(v) else v) for k, v in x.items()}
    pf = backend(kv_dtype).prepare(case, xc, "cpu")
    fake = pf.finish(pf.run())
    both = metrics.accuracy(fake, type(got)(got.out.cpu().float(), got.lse.cpu()))
    assert both["cos_diff"] < 5e-6 and both["lse_max_abs"] < 1e-4, both


def test_v4_e4m3_with_a_dense_page_stride():
    # .cpu() of a padded V4 cache view gives page stride P*584: still one layout to read
    case = make_case(**V4, batch_size=2, context_len=512)
    x = make_inputs(case, "cpu")
    dense = {k: (v.contiguous() if k.endswith("k_cache") else v) for k, v in x.items()}
    assert dense["k_cache"].stride(0) != x["k_cache"].stride(0)
    p, acc, conversion, _ = run_case(case, "e4m3", x=dense)
    assert acc["cos_diff"] < 5e-6 and p.info["reads_exact"]


class _BackendPlanUnsupportedError(RuntimeError):
    """FlashInfer 0.7.2.post1's own refusal past the planner's capacity (its class name)."""


class RefusingWrapper(FakeFA3Wrapper):
    def plan(self, *args, **kw):
        raise _BackendPlanUnsupportedError(
            "FA MLA needs at least 16448 work items; native capacity is 16384."
        )


class BrokenWrapper(FakeFA3Wrapper):
    def plan(self, *args, **kw):
        raise RuntimeError("something else")


def test_a_plan_the_library_refuses_is_unsupported_other_errors_stay_errors():
    case = make_case(**V4, batch_size=1, context_len=512)
    with pytest.raises(Unsupported, match="FlashInfer's plan refuses it: FA MLA needs at least"):
        backend(wrapper=RefusingWrapper).prepare(case, make_inputs(case, "cpu"), "cpu")
    with pytest.raises(RuntimeError, match="something else"):
        backend(wrapper=BrokenWrapper).prepare(case, make_inputs(case, "cpu"), "cpu")
