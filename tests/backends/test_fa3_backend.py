"""The fa3 backend (vLLM's FA3 build as sparse MLA): the argument mapping on the CPU around a fake
op bound by the real op's schema, discovery failures as one line, and on an H100 the real
kernel against the oracle, once per FA3 build of the kernels folder (vLLM 0.33.0's and 0.26.0's:
tests/kernel_builds.py).

The fake computes what the H100 probe showed the kernel computes
(results/sm90/studies/engine-kernels/probe.log): per query row, the slots
page_table[row, :seqused_k[row]]
(page size 1, one KV head), scores softmax_scale * (q.k + q_v.v), out = softmax . v, lse
(heads, rows) in natural log; a row with no key gives out 0 and lse -inf.
"""

from __future__ import annotations

import math

import pytest
import torch

from dsv4bench import backends
from dsv4bench.backends import fa3
from dsv4bench.backends.base import Provider, Unsupported
from dsv4bench.backends.toolchains import library
from dsv4bench.backends.torch_ref import oracle_call
from dsv4bench.cases.case import Case
from dsv4bench.cases.inputs import make_inputs
from dsv4bench.measure import metrics
from tests.kernel_builds import build_folder, build_params, expect_supported, ran_alone

# the schema of torch.ops._vllm_fa3_C.fwd in vLLM 0.26.0 (probe.log), as (name, optional)
VLLM_SCHEMA = [
    ("q", False), ("k", False), ("v", False), ("k_new", True), ("v_new", True),
    ("q_v", True), ("out", True), ("cu_seqlens_q", True), ("cu_seqlens_k", True),
    ("cu_seqlens_k_new", True), ("seqused_q", True), ("seqused_k", True),
    ("max_seqlen_q", True), ("max_seqlen_k", True), ("page_table", True),
    ("kv_batch_idx", True), ("leftpad_k", True), ("rotary_cos", True), ("rotary_sin", True),
    ("seqlens_rotary", True), ("q_descale", True), ("k_descale", True), ("v_descale", True),
    ("softmax_scale", False), ("is_causal", False), ("window_size_left", False),
    ("window_size_right", False), ("softcap", False), ("is_rotary_interleaved", False),
    ("scheduler_metadata", True), ("num_splits", False), ("pack_gqa", True),
    ("sm_margin", False), ("s_aux", True), ("cp_world_size", False), ("cp_rank", False),
    ("cp_tot_seqused_k", True),
]  # fmt: skip
# sgl-kernel's spelling of the same op (qv, attention_chunk, sinks)
SGL_SCHEMA = [
    (("qv" if n == "q_v" else n), o) for n, o in VLLM_SCHEMA if not n.startswith("cp_")
] + [("attention_chunk", False), ("sinks", True)]

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


class FakeFwd:
    """The FA3 fwd op computed in fp32; records every call's keyword arguments."""

    def __init__(self):
        self.calls: list[dict] = []
        self.write = True

    def __call__(self, **kw):
        self.calls.append(kw)
        q, k, v, table, lens = (kw[n] for n in ("q", "k", "v", "page_table", "seqused_k"))
        qv = kw["q_v"] if "q_v" in kw else kw["qv"]
        assert kw["max_seqlen_q"] == 1 and kw["window_size_left"] == -1
        assert kw.get("s_aux") is None and kw["num_splits"] == 0 and kw["softcap"] == 0.0
        assert k.dim() == v.dim() == 4 and k.shape[1:3] == (1, 1) and v.shape[1:3] == (1, 1)
        assert table.dtype == lens.dtype == torch.int32 and table.is_contiguous()
        assert q.stride(-1) == 1 and qv.stride(-1) == 1
        t, h, _ = q.shape
        assert torch.equal(kw["cu_seqlens_q"], torch.arange(t + 1, dtype=torch.int32))
        out = kw["out"] if kw["out"] is not None else torch.empty(t, h, 512, dtype=q.dtype)
        lse = torch.empty(h, t)
        for i in range(t):
            slots = table[i, : int(lens[i])].long()
            if len(slots) == 0:
                o, lse[:, i] = torch.zeros(h, 512), -math.inf
            else:
                kk, vv = k[slots, 0, 0].float(), v[slots, 0, 0].float()
                s = (q[i].float() @ kk.T + qv[i].float() @ vv.T) * kw["softmax_scale"]
                o, lse[:, i] = torch.softmax(s, -1) @ vv, torch.logsumexp(s, -1)
            if self.write:
                out[i] = o.to(out.dtype)
        return [out, lse]


def fake_backend(schema=VLLM_SCHEMA, **kw):
    fwd = FakeFwd()
    args = [fa3.Arg(n, o, False) for n, o in schema]
    ops = fa3.FA3Ops(Provider("fake-fa3", "0"), fa3.bind(args, fwd), tuple(n for n, _ in schema))
    return fa3.FA3(ops=ops, **kw), fwd


def run_case(case, x=None, schema=VLLM_SCHEMA):
    x = make_inputs(case, "cpu") if x is None else x
    b, fwd = fake_backend(schema)
    p = b.prepare(case, x, "cpu")
    p.poison()
    got = p.finish(p.run())
    acc = metrics.accuracy(oracle_call(case, x)(), got)
    return p, acc, got, fwd


@pytest.mark.parametrize("base", [V32, V4], ids=["v32", "v4"])
@pytest.mark.parametrize("s_q", [1, 2], ids=["s_q1", "mtp2"])
def test_decode_matches_the_oracle(base, s_q):
    case = make_case(**base, batch_size=2, s_q=s_q, context_len=1024)
    p, acc, got, fwd = run_case(case)
    assert acc["nonfinite"] == 0 and acc["cos_diff"] < 5e-6, acc
    assert acc["lse_max_abs"] < 1e-4
    h = case.num_heads
    assert got.out.shape == (2, s_q, h, 512) and got.lse.shape == (2, h, s_q)
    call = fwd.calls[-1]
    assert call["q"].shape == (2 * s_q, h, 64) and call["q_v"].shape == (2 * s_q, h, 512)
    assert p.info["padded_heads"] == h and p.info["query_rows"] == 2 * s_q  # no padding
    if base is V4:  # q_v = q with the 64 columns given as q zeroed, vs the whole latent
        assert (call["q_v"][..., :64] == 0).all() and "sink" in p.info
        assert call["v"].shape[-1] == 512 and call["k"].data_ptr() == call["v"].data_ptr()
    else:  # rope vs the rope cache, latent vs the latent cache
        assert call["k"].data_ptr() == call["v"].data_ptr() + 512 * 2


def test_v4_extra_cache_is_one_pool_and_one_list_per_row():
    case = make_case(**V4, batch_size=2, s_q=2, context_len=1024)
    x = make_inputs(case, "cpu")
    _, acc, _, fwd = run_case(case, x)
    assert acc["cos_diff"] < 5e-6
    call = fwd.calls[-1]
    main = x["k_cache"].shape[0] * x["k_cache"].shape[1]
    idx, ext = x["indices"].reshape(4, -1), x["extra_indices"].reshape(4, -1)
    for i in range(4):
        want = torch.cat([idx[i][idx[i] >= 0], ext[i][ext[i] >= 0] + main]).to(torch.int32)
        n = int(call["seqused_k"][i])
        assert torch.equal(call["page_table"][i, :n], want)
        assert (call["page_table"][i, n:] == 0).all()  # past the length: a valid page, unread
    assert call["max_seqlen_k"] == case.topk + case.extra_topk
    assert call["softmax_scale"] == pytest.approx(case.scale) and call["is_causal"] is True


def test_sink_scales_out_from_the_lse_inside_the_timed_call():
    case = make_case(**V4, batch_size=2, context_len=512)
    x = make_inputs(case, "cpu")
    b, fwd = fake_backend()
    p = b.prepare(case, x, "cpu")
    raw = p.run()
    plain = fa3.FA3(ops=b.kernel_ops())
    no_sink = dict(x, attn_sink=None)
    q = plain.prepare(case, no_sink, "cpu")
    base = q.run()
    scale = torch.sigmoid(base[1] - x["attn_sink"][:, None]).T.unsqueeze(-1)
    assert torch.allclose(raw[0].float(), (base[0].float() * scale), atol=1e-2)
    assert torch.equal(raw[1], base[1])  # the lse stays that of the keys


def test_topk_length_and_invalid_entries_shorten_the_lists():
    case = make_case(**V32, batch_size=2, s_q=2, context_len=1024)
    x = make_inputs(case, "cpu")
    x["topk_length"] = torch.tensor([150, 120], dtype=torch.int32)
    x["indices"] = x["indices"].clone()
    x["indices"][0, 0, 5] = -1  # a hole inside the list: compacted, not read
    _, acc, _, fwd = run_case(case, x)
    assert acc["cos_diff"] < 5e-6
    assert fwd.calls[-1]["seqused_k"].tolist() == [149, 150, 120, 120]


@pytest.mark.parametrize("base", [V32, V4], ids=["v32", "v4"])
def test_prefill_and_decode_routes_match_the_oracle(base):
    for route in ("sparse-prefill", "decode-kernel", "decode-mixed"):
        case = make_case("prefill", **base, tokens=12, context_len=600, route=route)
        _, acc, got, _ = run_case(case)
        assert acc["nonfinite"] == 0 and acc["cos_diff"] < 5e-6, (route, acc)
        assert got.out.shape == (12, case.num_heads, 512) and got.lse.shape == (12, case.num_heads)


def test_sgl_kernel_spelling_binds_the_same_call():
    case = make_case(**V32, batch_size=2, context_len=512)
    _, acc, _, fwd = run_case(case, schema=SGL_SCHEMA)
    assert acc["cos_diff"] < 5e-6
    assert fwd.calls[-1]["qv"] is not None and fwd.calls[-1]["attention_chunk"] == 0


def test_schema_args_reads_optional_arguments_of_a_real_op():
    args = {a.name: a for a in fa3.schema_args(torch.ops.aten.clamp)}
    assert args["min"].optional and args["max"].optional and not args["self"].optional
    assert fa3.is_optional("Tensor?") and fa3.is_optional("Optional[Tensor]")
    assert not fa3.is_optional("Tensor")


def test_an_unknown_required_argument_is_an_unsupported_api():
    args = [fa3.Arg(n, o, False) for n, o in VLLM_SCHEMA] + [fa3.Arg("new_knob", False, False)]
    with pytest.raises(Unsupported, match="unknown required argument 'new_knob'"):
        fa3.bind(args, FakeFwd())


def test_a_row_without_keys_and_explicit_head_padding():
    case = make_case(**{**V32, "head_padding": "64"}, batch_size=2, context_len=512)
    x = make_inputs(case, "cpu")
    x["indices"] = x["indices"].clone()
    x["indices"][1] = -1
    p, acc, got, fwd = run_case(case, x)
    assert acc["lse_mismatch"] == 0 and acc["cos_diff"] < 5e-6
    assert torch.isposinf(got.lse[1]).all() and (got.out[1] == 0).all()
    assert p.info["padded_heads"] == 64 and fwd.calls[-1]["q"].shape[1] == 64


def test_poison_catches_a_kernel_that_writes_nothing():
    case = make_case(**V4, batch_size=1, context_len=512)
    b, fwd = fake_backend()
    p = b.prepare(case, make_inputs(case, "cpu"), "cpu")
    fwd.write = False
    p.poison()
    assert torch.isnan(p.finish(p.run()).out).all()


def test_support_rules_and_the_fp8_refusal():
    b, _ = fake_backend()
    assert b.supports(make_case(**V32), "sm90") is None
    assert b.supports(make_case("prefill", **V4, tokens=8), "sm90") is None
    assert "runs on sm90" in b.supports(make_case(**V32), "sm100")
    assert "d_qk" in b.supports(make_case(**{**V32, "d_qk": 640}), "sm90")
    assert "exceed" in b.supports(make_case(**{**V32, "head_padding": "8"}), "sm90")
    e4m3, _ = fake_backend(kv_dtype="e4m3")
    assert "HeaddimV > 256 requires fp16 and bf16" in e4m3.supports(make_case(**V32), "sm90")
    with pytest.raises(ValueError, match="kv_dtype"):
        fa3.FA3(kv_dtype="fp4")


def test_a_wrong_library_path_is_one_line(tmp_path, monkeypatch, capsys):
    from dsv4bench import cli

    monkeypatch.delenv(fa3.ENV_LIB, raising=False)
    missing = tmp_path / "nope.so"
    b = fa3.FA3(lib=str(missing))
    with pytest.raises(Unsupported, match=r"FA3 library not found: .*nope.so"):
        b.provider()
    bad = tmp_path / "broken.so"
    bad.write_bytes(b"not a library")
    with pytest.raises(Unsupported, match="cannot load FA3 library .*broken.so"):
        fa3.FA3(lib=str(bad)).provider()
    backends.setup()
    assert cli.main(["backends", "--backend-opt", f"fa3.lib={missing}"]) == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("fa3 ")]
    assert len(line) == 1 and "not available: FA3 library not found" in line[0]
    scenario = "scenarios/compare/backends_sm90.yaml"
    opt = ["--backend-opt", f"fa3.lib={bad}", "--arch", "sm90", "--backend", "fa3"]
    assert cli.main(["plan", scenario, *opt]) == 0
    out = capsys.readouterr().out.splitlines()
    (kernels,) = [ln for ln in out if ln.startswith("kernels ")]
    assert kernels.startswith(f"kernels fa3: not available: cannot load FA3 library {bad}: ")
    # what the worker turns into an `unsupported` row: prepare() raises the same one line
    case = make_case(**V32, batch_size=1, context_len=512)
    with pytest.raises(Unsupported, match="cannot load FA3 library"):
        fa3.FA3(lib=str(bad)).prepare(case, make_inputs(case, "cpu"), "cpu")


def test_the_checkout_default_is_found_and_unpacked_outside_the_checkout(tmp_path, monkeypatch):
    import lzma

    monkeypatch.setattr(library, "UNPACK_DIR", tmp_path / "unpacked")
    d = tmp_path / ".kernels" / "fa3-vllm-9.9.9"
    d.mkdir(parents=True)
    with lzma.open(d / (fa3.LIB_FILE + ".xz"), "wb") as f:
        f.write(b"\x7fELF fake")
    found = library.kernel_builds(fa3.LIBRARY, tmp_path)[0].path
    assert found.endswith(".so.xz")
    so = library.unpack_xz(type(d)(found))
    assert so.read_bytes() == b"\x7fELF fake"
    assert so.parent == tmp_path / "unpacked" / "fa3-vllm-9.9.9"  # never into .kernels/
    assert library.kernel_builds(fa3.LIBRARY, tmp_path)[0].path == found and list(d.iterdir()) == [
        type(d)(found)
    ]


# ---- GPU: the real kernel ------------------------------------------------------------------

BIG_V32 = {**V32, "num_heads": 128, "topk": 2048, "context_len": 4096}
BIG_V4 = {**V4, "num_heads": 64, "extra_topk": 512, "context_len": 4096}
GPU_CASES = [
    ("decode-v32", make_case(**BIG_V32, batch_size=4, s_q=2)),
    ("decode-v32-h16", make_case(**{**BIG_V32, "num_heads": 16}, batch_size=8)),
    ("decode-v4", make_case(**BIG_V4, batch_size=4, s_q=2)),
    ("decode-v4-h8", make_case(**{**BIG_V4, "num_heads": 8}, batch_size=3)),
    ("prefill-v32", make_case("prefill", **BIG_V32, tokens=256)),
    ("prefill-v4", make_case("prefill", **BIG_V4, tokens=256)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("build", build_params("fa3"))
@pytest.mark.parametrize("name,case", GPU_CASES, ids=[n for n, _ in GPU_CASES])
def test_real_kernel_matches_the_oracle(request, name, case, build):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs an sm90 GPU")
    if ran_alone(request, "fa3", build):
        return
    b = fa3.FA3(lib=build_folder(build))
    expect_supported(build, b.supports(case, "sm90"))
    prov = b.provider()
    x = make_inputs(case, "cuda")
    p = b.prepare(case, x, "cuda")
    p.poison()
    got = p.finish(p.run())
    torch.cuda.synchronize()
    acc = metrics.accuracy(oracle_call(case, x)(), got)
    print(name, build, prov.name, prov.version, acc["cos_diff"], acc["lse_max_abs"])
    assert acc["nonfinite"] == 0 and acc["cos_diff"] < 5e-6, acc
    assert acc["lse_max_abs"] < 1e-3


def test_every_page_table_entry_is_a_page_of_the_pool():
    """A row's tail past seqused_k holds page 0 (a valid page, unread), never the -1 of the
    engine's top-k: every entry of the table FA3 gets is a slot of the pool."""
    case = make_case(**V32, batch_size=2, s_q=2, context_len=1024)
    x = make_inputs(case, "cpu")
    x["topk_length"] = torch.tensor([150, 120], dtype=torch.int32)
    x["indices"] = x["indices"].clone()
    x["indices"][1, :, 100:] = -1  # the tail an engine's top-k writes
    _, _, _, fwd = run_case(case, x)
    call = fwd.calls[-1]
    slots = x["k_cache"].shape[0] * x["k_cache"].shape[1]
    table = call["page_table"]
    assert bool((table >= 0).all()) and bool((table < slots).all()), table.min()
    for i, n in enumerate(call["seqused_k"].tolist()):
        assert (table[i, n:] == 0).all()


@pytest.mark.parametrize("base", [V32, V4], ids=["v32", "v4"])
def test_a_graph_refill_copies_the_next_batch_into_the_captured_call(base):
    # run/padded.py: prepared on another batch, this batch's pool, page table and lengths
    # copied into that call's buffers in place; the call (eager on a CPU) answers this batch
    from dsv4bench.run import padded

    case = make_case(
        **base, batch_size=3, graph_batch=5, context_len=1024, edge="graph-refill-vllm"
    )
    x = make_inputs(case, "cpu")
    b, fwd = fake_backend()
    p = padded.prepare(b, case, x, "cpu", "sm90")
    assert len(fwd.calls) == 0  # prepare() does not run the kernel
    got = p.finish(p.run())
    (call,) = fwd.calls
    assert call["q"].shape[0] == 5 * case.s_q  # the captured batch's rows
    assert metrics.accuracy(oracle_call(case, x)(), got)["cos_diff"] < 5e-6
