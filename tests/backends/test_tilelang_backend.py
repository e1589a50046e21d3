"""The tilelang backend (sglang's TileLang sparse MLA kernel): on the CPU, the call sglang makes
checked by a fake kernel that asserts sglang's argument contract and computes the answer (a
fake proves argument handling only), the plan-time limits, what is missing as one line, and
loading a kernel file through stub sglang modules from a fake runtime; on an sm90 GPU, the real
kernel against the oracle."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from dsv4bench import backends
from dsv4bench.backends.base import Provider, Unsupported
from dsv4bench.backends.tilelang import backend as tlb
from dsv4bench.backends.tilelang import runtime
from dsv4bench.backends.torch_ref import oracle_call
from dsv4bench.cases.case import Case
from dsv4bench.cases.inputs import make_inputs
from dsv4bench.measure import metrics

V32 = dict(model="v3.2", d_qk=576, layout="v32", num_heads=16, topk=200, page_size=64)
V4 = dict(model="v4-flash", d_qk=512, layout="v4", num_heads=16, topk=128, window=128)


def make_case(op="decode", **kw) -> Case:
    fields = dict(scenario="t", op=op, model="m", d_qk=576, d_v=512, num_heads=8)
    fields.update(kw)
    return Case(**fields)


class FakeSparseFwd:
    """tilelang_sparse_fwd in fp32 behind sglang's asserts and the kernel factory's limits;
    records every call."""

    def __init__(self):
        self.calls: list[dict] = []

    def __call__(self, q, kv, indices, sm_scale, d_v=512):
        self.calls.append(dict(q=q, kv=kv, indices=indices, sm_scale=sm_scale, d_v=d_v))
        assert q.dim() == 3 and kv.dim() == 3 and indices.dim() == 3  # sglang's asserts
        assert indices.shape[-1] % 64 == 0, "topk must be padded to a multiple of 64"
        assert indices.shape[-1] // 64 % 2 == 0, "NI should be a multiple of 2"
        h = q.shape[1]
        assert h <= 64 or h % 64 == 0, "head_kv should be a multiple of 64"
        assert q.dtype == kv.dtype == torch.bfloat16 and indices.dtype == torch.int32
        assert kv.shape[1] == 1 and indices.shape[1] == 1 and q.shape[-1] == kv.shape[-1]
        assert q.is_contiguous() and kv.is_contiguous() and indices.is_contiguous()
        out = torch.zeros(1, q.shape[0], h, d_v, dtype=torch.bfloat16)
        for t in range(q.shape[0]):
            row = indices[t, 0]
            slots = row[row >= 0].long()
            assert (slots < kv.shape[0]).all()  # the kernel reads unchecked
            keys = kv[slots, 0].float()
            p = torch.softmax(q[t].float() @ keys.T * sm_scale, -1)
            out[0, t] = (p @ keys[:, :d_v]).to(torch.bfloat16)
        return out


def fake_backend(**kw):
    fwd = FakeSparseFwd()
    return tlb.TileLang(ops=tlb.TileLangOps(Provider("fake", "0"), fwd), **kw), fwd


def run_case(case, x=None):
    x = make_inputs(case, "cpu") if x is None else x
    b, fwd = fake_backend()
    p = b.prepare(case, x, "cpu")
    got = p.finish(p.run())
    return p, metrics.accuracy(oracle_call(case, x)(), got), got, fwd


@pytest.mark.parametrize("s_q", [1, 2], ids=["s_q1", "mtp2"])
def test_decode_is_one_bf16_pool_and_matches_the_oracle(s_q):
    case = make_case(**V32, batch_size=2, s_q=s_q, context_len=1024)
    x = make_inputs(case, "cpu")
    p, acc, got, fwd = run_case(case, x)
    assert acc["nonfinite"] == 0 and acc["cos_diff"] < 5e-6, acc
    assert got.out.shape == (2, s_q, 16, 512) and got.lse is None
    call = fwd.calls[-1]
    slots = x["k_cache"].shape[0] * x["k_cache"].shape[1]
    assert call["q"].shape == (2 * s_q, 16, 576) and call["kv"].shape == (slots, 1, 576)
    assert call["indices"].shape == (2 * s_q, 1, 256)  # topk 200 padded with -1 to 64s
    assert (call["indices"][..., 200:] == -1).all() and call["d_v"] == 512
    assert call["sm_scale"] == pytest.approx(case.scale)
    assert p.info["padded_heads"] == 16 and p.info["index_width"] == 256
    assert len(fwd.calls) == 2  # the first call (TileLang's compile) is made in prepare()


@pytest.mark.parametrize("edge", ["graph-refill-vllm", "graph-refill-sglang"])
def test_a_graph_refill_copies_the_next_batch_into_the_captured_call(edge):
    from dsv4bench.run import padded

    case = make_case(**V32, batch_size=2, context_len=512, graph_batch=4, edge=edge)
    x = make_inputs(case, "cpu")
    b, fwd = fake_backend()
    p = padded.prepare(b, case, x, "cpu", "sm90")
    acc = metrics.accuracy(oracle_call(case, x)(), p.finish(p.run()))
    assert acc["nonfinite"] == 0 and acc["cos_diff"] < 5e-6, acc
    assert p.info["graph_refill"]["refilled"].startswith("3 buffers copied in place")
    captured = fwd.calls[0]  # the other batch's call, its tensors now this batch's
    assert all(captured[k] is fwd.calls[-1][k] for k in ("q", "kv", "indices"))


@pytest.mark.parametrize("route", ["sparse-prefill", "decode-kernel", "decode-mixed"])
def test_prefill_routes_match_the_oracle(route):
    case = make_case("prefill", **V32, tokens=12, context_len=600, route=route)
    _, acc, got, fwd = run_case(case)
    assert acc["nonfinite"] == 0 and acc["cos_diff"] < 5e-6, (route, acc)
    assert got.out.shape == (12, 16, 512)
    assert fwd.calls[-1]["q"].shape == (12, 16, 576)


def test_lengths_and_entries_outside_the_workspace_become_minus_one():
    case = make_case("prefill", **V32, tokens=4, context_len=600)
    x = make_inputs(case, "cpu")
    x["topk_length"] = torch.tensor([150, 120, 3, 200], dtype=torch.int32)
    x["indices"] = x["indices"].clone()
    x["indices"][3, 0, 0] = x["kv"].shape[0] + 7  # past the workspace: invalid for prefill
    _, acc, _, fwd = run_case(case, x)
    assert acc["cos_diff"] < 5e-6
    idx = fwd.calls[-1]["indices"][:, 0]
    kept = (idx >= 0).sum(-1).tolist()
    valid = (x["indices"][:, 0] >= 0).sum(-1).tolist()
    assert kept == [min(150, valid[0]), min(120, valid[1]), 3, valid[3] - 1]


def test_heads_pass_unpadded_and_an_explicit_padding_adds_zero_queries():
    p, acc, _, fwd = run_case(make_case(**{**V32, "num_heads": 8}, context_len=512))
    assert fwd.calls[-1]["q"].shape[1] == 8 and acc["cos_diff"] < 5e-6  # sglang: tp heads
    case = make_case(**{**V32, "head_padding": "64"}, batch_size=2, context_len=512)
    p, acc, got, fwd = run_case(case)
    q = fwd.calls[-1]["q"]
    assert q.shape[1] == 64 and (q[:, 16:] == 0).all() and p.info["padded_heads"] == 64
    assert got.out.shape[2] == 16 and acc["cos_diff"] < 5e-6


@pytest.mark.parametrize(
    "fields, reason",
    [
        ({"topk": 150}, "pads topk 150 to 192, 3 blocks of 64"),
        ({"num_heads": 96}, "up to 64 heads or a multiple of 64, not 96"),
        ({"head_padding": "96", "num_heads": 8}, "not 96"),
        ({"sink": True}, "no attention sink"),
        ({"d_v": 256}, "d_v 512"),
        ({"topk": 0}, "topk > 0"),
    ],
)
def test_plan_time_limits(fields, reason):
    b, _ = fake_backend()
    assert reason in b.supports(make_case(**{**V32, **fields}), "sm90")


def test_what_the_kernel_takes():
    b, _ = fake_backend()
    for fields in ({}, {"topk": 100}, {"num_heads": 128}, {"num_heads": 1}, {"topk": 2048}):
        assert b.supports(make_case(**{**V32, **fields}), "sm90") is None, fields
    assert b.supports(make_case("prefill", **{**V32, "topk": 150}, tokens=8), "sm90") is None
    assert "runs on sm90" in b.supports(make_case(**V32), "sm100")
    v4 = b.supports(make_case(**V4), "sm90")
    assert "only as an FP8 kernel on ROCm" in v4
    assert v4 == b.supports(make_case("prefill", **V4, tokens=8), "sm90")
    with pytest.raises(Unsupported, match="3 blocks"):
        b.prepare(make_case(**{**V32, "topk": 150}), {}, "cpu")


@pytest.fixture
def nothing_installed(tmp_path, monkeypatch):
    """No tilelang, z3, tvm_ffi or sglang importable, no nvcc, an empty kernels folder."""
    real = runtime.importlib.util.find_spec
    hidden = ("tilelang", "z3", "tvm_ffi", "sglang")
    monkeypatch.setattr(
        runtime.importlib.util,
        "find_spec",
        lambda name, *a: None if name.split(".")[0] in hidden else real(name, *a),
    )
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-cuda"))
    monkeypatch.setenv("DSV4BENCH_KERNELS", str(tmp_path / "kernels"))
    monkeypatch.delenv(tlb.ENV_LIB, raising=False)
    return tmp_path


def test_what_is_missing_is_one_line_and_every_row_says_it(nothing_installed, capsys):
    from dsv4bench import cli

    b = tlb.TileLang()
    reason = b.missing_reason()
    assert reason.startswith("TileLang backend: missing tilelang, z3, tvm_ffi (")
    assert "nvcc (" in reason and "sglang's tilelang_kernel.py (" in reason
    assert "\n" not in reason
    assert b.supports(make_case(**V32), "sm90") == reason  # plan rows: unsupported with it
    with pytest.raises(Unsupported) as e:
        b.provider()  # the worker's row: unsupported with the same line
    assert str(e.value) == reason
    backends.setup()
    assert cli.main(["backends"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("tilelang")]
    assert len(lines) == 2  # the plain name and the catalog's sglang build
    assert all(
        "not available: TileLang backend: missing tilelang, z3, tvm_ffi" in ln for ln in lines
    )


def _fake_runtime(root, kernel_text: str):
    """A kernels folder holding fake runtime, deps and sglang builds; returns the three."""
    site = root / "tilelang-runtime-0.1.15/site/tilelang"
    (site / "jit/adapter").mkdir(parents=True)
    (site / "__init__.py").write_text("__version__ = '0.1.15'\n")
    (site / "language.py").write_text("")
    for pkg in ("jit", "jit/adapter"):
        (site / pkg / "__init__.py").write_text("")
    (site / "jit/adapter/base.py").write_text("class BaseKernelAdapter:\n    pass\n")
    deps = root / "tilelang-deps-0.1.15/site"
    for module in ("z3", "tvm_ffi"):
        (deps / module).mkdir(parents=True)
        (deps / module / "__init__.py").write_text("")
    kernel = root / "tilelang-sglang-0.5.23"
    kernel.mkdir()
    (kernel / "tilelang_kernel.py").write_text(kernel_text)
    (kernel / "build.json").write_text(json.dumps({"package": "sglang", "version": "0.5.23"}))
    return root / "tilelang-runtime-0.1.15", deps, kernel


KERNEL_FILE = """
import tilelang
import tilelang.language as T
import torch
from sglang.kernels.ops.quantization.fp8_kernel import is_fp8_fnuz
from sglang.srt.utils import is_gfx95_supported, is_hip
from tilelang.jit.adapter.base import BaseKernelAdapter

FLAGS = (is_hip(), is_gfx95_supported(), is_fp8_fnuz())

def tilelang_sparse_fwd(q, kv, indices, sm_scale, d_v=512):
    return FLAGS
"""


@pytest.fixture
def clean_imports(monkeypatch):
    """sys.path and sys.modules as they were, after a test that imports a fake tilelang."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.split(".")[0] in ("tilelang", "z3", "tvm_ffi", runtime.MODULE):
            del sys.modules[name]


def test_a_fetched_build_loads_through_stub_sglang_modules(tmp_path, monkeypatch, clean_imports):
    rt, deps, kernel = _fake_runtime(tmp_path, KERNEL_FILE)
    (tmp_path / "cuda/bin").mkdir(parents=True)
    (tmp_path / "cuda/bin/nvcc").write_text("")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    b = tlb.TileLang(lib=str(kernel), runtime=str(rt))
    assert b.missing_reason() is None and b.build_reason() is None
    prov = b.provider()
    assert prov.version == "sglang 0.5.23 on tilelang 0.1.15 (tilelang-runtime-0.1.15)"
    assert prov.location == str((kernel / "tilelang_kernel.py").resolve())
    assert b.kernel_ops().sparse_fwd(None, None, None, 1.0) == (False, False, False)
    assert not [m for m in sys.modules if m.split(".")[0] == "sglang"]  # the stubs are gone
    assert sys.path[:2] == [str(rt / "site"), str(deps)]
    assert b.process_key().endswith(f"runtime={rt}")


def test_the_kernels_folder_runtime_and_its_deps_are_found(tmp_path, nothing_installed):
    rt, deps, _ = _fake_runtime(tmp_path / "kernels", KERNEL_FILE)
    found = runtime.find_runtime()
    assert found.sites == (rt / "site", deps) and found.label == "tilelang-runtime-0.1.15"
    assert runtime.missing(found) == [f"nvcc ({runtime.NVCC_HINT})"]
    (deps / "z3/__init__.py").unlink()
    assert runtime.missing(found)[0].startswith("z3 (")


def test_a_kernel_file_importing_more_of_sglang_is_refused(tmp_path, clean_imports):
    text = KERNEL_FILE + "from sglang.srt.layers import something\n"
    rt, _, kernel = _fake_runtime(tmp_path, text)
    runtime.import_tilelang(runtime.find_runtime(str(rt)))
    with pytest.raises(Unsupported, match="imports more of sglang than this backend stubs"):
        runtime.load_kernel_file(kernel / "tilelang_kernel.py")
    assert runtime.MODULE not in sys.modules and "sglang" not in sys.modules


# ---- GPU: the real kernel ------------------------------------------------------------------

BIG_V32 = {**V32, "num_heads": 128, "topk": 2048, "context_len": 4096}
GPU_CASES = [
    ("decode-h128", make_case(**BIG_V32, batch_size=4, s_q=2)),
    ("decode-h16", make_case(**{**BIG_V32, "num_heads": 16}, batch_size=8)),
    ("decode-h8", make_case(**{**BIG_V32, "num_heads": 8}, batch_size=3)),
    ("prefill-h128", make_case("prefill", **BIG_V32, tokens=256)),
    # rows with fewer keys than a 16-row load: the kernel's index register starts at slot 0
    ("prefill-short-rows", make_case("prefill", **{**BIG_V32, "context_len": 64}, tokens=64)),
    ("prefill-decode-kernel", make_case("prefill", **BIG_V32, tokens=64, route="decode-kernel")),
]


@pytest.mark.gpu
@pytest.mark.parametrize("name,case", GPU_CASES, ids=[n for n, _ in GPU_CASES])
def test_real_kernel_matches_the_oracle(name, case):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs an sm90 GPU")
    b = tlb.TileLang()
    try:
        prov = b.provider()  # names what is missing: tilelang, z3, tvm_ffi, nvcc, the file
    except Unsupported as e:
        pytest.skip(str(e))
    x = make_inputs(case, "cuda")
    p = b.prepare(case, x, "cuda")
    got = p.finish(p.run())
    torch.cuda.synchronize()
    acc = metrics.accuracy(oracle_call(case, x)(), got)
    print(name, prov.version, p.info["first_call_s"], acc["cos_diff"])
    assert acc["nonfinite"] == 0 and acc["cos_diff"] < case.tolerance.cos_diff, acc
