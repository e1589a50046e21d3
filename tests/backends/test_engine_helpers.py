"""The engine helper backends (backends/engine_helpers/): vLLM's Triton remap and sglang's DSA
helpers, loaded from their builds and run through Triton's interpreter against the oracle
(engine_helpers_run.py, in a process of its own); the guard bytes around their outputs; the
launch binding that stands in for vLLM's warmup machinery; the reasons they decline."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dsv4bench.backends.base import Unsupported
from dsv4bench.backends.engine_helpers import (
    guard,
    sglang_files,
    sglang_ops,
    vllm_files,
    vllm_triton,
    vllm_v4_cache,
)
from dsv4bench.cases.inputs import make_inputs
from dsv4bench.cases.oracle import oracle_call
from dsv4bench.kernels import catalog
from tests.factories import make_case

ROOT = Path(__file__).resolve().parents[2]
V32 = dict(d_qk=576, d_v=512, model="v3.2", layout="v32")


def _build(place) -> Path | None:
    folder = place.folder(None)
    return folder if folder is not None and place.missing_reason(None) is None else None


def _run(name: str, build: Path) -> dict:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "tests.backends.engine_helpers_run", name, str(build)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200, check=True,
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.skipif(
    _build(vllm_triton.PLACE) is None,
    reason="needs a vllm-triton build: dsv4bench kernels fetch 'vllm[ops]'",
)
def test_vllms_remap_matches_the_oracle_in_its_three_forms():
    from tests.backends.engine_helpers_run import VLLM_TRITON

    results = _run("vllm-triton", _build(vllm_triton.PLACE))
    assert set(results) == set(VLLM_TRITON) and len([k for k in results if "dcp" in k]) == 6
    assert all(r["status"] == "ok" and r["mismatched"] == 0 for r in results.values()), results


@pytest.mark.slow
@pytest.mark.skipif(
    _build(sglang_ops.PLACE) is None,
    reason="needs a sglang-ops build: dsv4bench kernels fetch sglang",
)
def test_sglangs_helpers_match_the_oracle_and_the_v41_conformance_case_fails():
    results = _run("sglang-ops", _build(sglang_ops.PLACE))
    conformance = results.pop("conformance-v41-read-as-blocks")
    assert all(r["status"] == "ok" and r["mismatched"] == 0 for r in results.values()), results
    assert len(results) == 8
    assert conformance["status"] == "incorrect" and conformance["mismatched"] > 0


# ---- guard bytes ---------------------------------------------------------------------------


def test_a_write_one_byte_past_the_output_is_caught():
    out = guard.Guarded.empty((4, 8), torch.int32, "cpu", "its output")
    out.tensor.fill_(1)
    out.check()  # inside: fine
    flat = out.buffer[guard.GUARD_BYTES + out.nbytes : guard.GUARD_BYTES + out.nbytes + 1]
    flat.fill_(0)  # the fake kernel's stray byte
    with pytest.raises(guard.OutOfBounds, match="1 of the 4096 guard bytes after it changed"):
        out.check()


def test_a_copied_cache_keeps_its_strides_and_padding_and_is_guarded():
    cache = torch.arange(2 * 10, dtype=torch.uint8)
    view = torch.as_strided(cache, (2, 1, 1, 7), (10, 7, 7, 1))  # 3 padding bytes a page
    g = guard.Guarded.copy_of(view, "its cache")
    assert g.tensor.stride() == view.stride() and torch.equal(g.inner_bytes(), cache)
    assert torch.equal(g.tensor, view)  # the same bytes at the same places
    g.tensor[1, 0, 0, 6] = 0  # the last byte of the view: inside the guards
    g.check()
    g.buffer[guard.GUARD_BYTES - 1] = 0
    with pytest.raises(guard.OutOfBounds, match="before"):
        g.check()


def _fake_remap(shift: int):
    """vLLM's wrapper's signature; writes the right answer, plus one int32 `shift` elements past
    the end of `out` when shift > 0."""

    def fn(req, table, rows, *, BLOCK_SIZE, out, valid_counts_out, **_):
        from reference.indices import to_global_slots

        out.copy_(to_global_slots(rows, table[req.long()], BLOCK_SIZE))
        valid_counts_out.copy_((out >= 0).sum(-1))
        if shift:
            flat = out.view(-1)
            torch.as_strided(flat, (1,), (1,), flat.storage_offset() + flat.numel()).fill_(7)
        return out, valid_counts_out

    return fn


def _remap_case():
    return make_case(op="remap", topk=64, batch_size=2, s_q=2, context_len=128, page_size=16, **V32)


def test_the_remap_backend_catches_a_kernel_writing_past_its_output():
    case = _remap_case()
    x = make_inputs(case, "cpu")
    good = vllm_triton.VllmTriton(ops=(None, _fake_remap(0))).prepare(case, x, "cpu")
    good.poison()
    assert good.finish(good.run()).out.shape == (2, 2, 64)
    bad = vllm_triton.VllmTriton(ops=(None, _fake_remap(1))).prepare(case, x, "cpu")
    with pytest.raises(guard.OutOfBounds, match="outside its index output"):
        bad.finish(bad.run())


def test_valid_counts_that_disagree_with_the_rows_fail():
    def lying(req, table, rows, *, out, valid_counts_out, **kw):
        _fake_remap(0)(req, table, rows, out=out, valid_counts_out=valid_counts_out, **kw)
        valid_counts_out[0] += 1

    case = _remap_case()
    p = vllm_triton.VllmTriton(ops=(None, lying)).prepare(case, make_inputs(case, "cpu"), "cpu")
    with pytest.raises(vllm_triton.CountsDisagree, match="1 of 4 rows"):
        p.finish(p.run())


# ---- vLLM's launch binding -----------------------------------------------------------------


def test_launch_binding_follows_vllms_plan():
    t = torch.zeros(3, 5)
    names = ("req_id_ptr", "out_ptr", "valid_count_ptr", "BLOCK_N", "out_stride0", "ti_stride1")
    kwargs = vllm_files._binding(
        names, {"req_id": 1, "out": t, "valid_counts": 9, "block_n": 4}, {"valid_count_ptr": 2}
    )
    assert kwargs["req_id_ptr"] == 1 and kwargs["out_ptr"] is t
    assert kwargs["valid_count_ptr"] == 2  # a launch keyword is never overwritten
    assert kwargs["BLOCK_N"] == 4  # NAME.upper()
    assert kwargs["out_stride0"] == 5 and "ti_stride1" not in kwargs  # no ti bound


# ---- what they decline, and where their files come from ------------------------------------


def test_reasons_name_what_is_missing(tmp_path):
    case = _remap_case()
    reason = vllm_triton.VllmTriton(lib=str(tmp_path)).supports(case, "sm90")
    assert "lacks mla/sparse_utils.py" in reason and "kernels fetch 'vllm[ops]'" in reason
    sgl = sglang_ops.SglangOps(lib=str(tmp_path / "none"))
    assert "no folder" in sgl.supports(case, "sm90")
    prefill = make_case(op="remap", topk=64, tokens=8, context_len=128, page_size=16, **V32)
    assert "no prefill workspace form" in sgl.case_reason(prefill)
    v41 = make_case(op="dequant", layout="v41", d_qk=512, d_v=512, model="v4-flash", page_size=64)
    assert "refuses below SM100" in sgl.case_reason(v41, "sm90")
    assert sgl.case_reason(v41, "sm100") is None
    with pytest.raises(ValueError, match="kv_layout 'v5'"):
        sglang_ops.SglangOps(kv_layout="v5")


def test_a_build_folder_is_lib_then_the_backends_env_then_the_newest(tmp_path, monkeypatch):
    monkeypatch.setenv("DSV4BENCH_KERNELS", str(tmp_path))
    monkeypatch.delenv("DSV4BENCH_VLLM_TRITON_LIB", raising=False)
    assert vllm_triton.PLACE.folder(None) is None
    for version in ("0.32.0", "0.33.0"):
        (tmp_path / f"vllm-triton-{version}").mkdir()
    assert vllm_triton.PLACE.folder(None) == tmp_path / "vllm-triton-0.33.0"
    monkeypatch.setenv("DSV4BENCH_VLLM_TRITON_LIB", str(tmp_path / "named"))
    assert vllm_triton.PLACE.folder(None) == tmp_path / "named"
    assert vllm_triton.PLACE.folder(str(tmp_path / "lib")) == tmp_path / "lib"
    assert sglang_ops.PLACE.env == "DSV4BENCH_SGLANG_OPS_LIB"


def test_vllms_file_loads_with_its_stubs_and_a_newer_import_is_the_reason(tmp_path):
    (tmp_path / "mla").mkdir()
    path = tmp_path / vllm_files.SPARSE_UTILS
    path.write_text("from vllm.utils.math_utils import cdiv\nBLOCKS = cdiv(7, 2)\n")
    assert vllm_files.sparse_utils(tmp_path).BLOCKS == 4 and "vllm" not in sys.modules
    newer = tmp_path / "newer"
    (newer / "mla").mkdir(parents=True)
    (newer / vllm_files.SPARSE_UTILS).write_text("from vllm.v2 import thing\n")
    with pytest.raises(Unsupported, match="load vLLM's sparse_utils.py: .*imports more of vLLM"):
        vllm_files.sparse_utils(newer)


def test_sglangs_files_get_the_builds_kv_layout_and_the_stubbed_arch(tmp_path):
    (tmp_path / "dsv4").mkdir()
    (tmp_path / "dsv4/kv_layout.py").write_text("class KVLayout:\n    V4 = 'v4'\n")
    (tmp_path / "dsv4/dequant_k_cache.py").write_text(
        "from sglang.kernels.jit.utils import get_jit_cuda_arch, is_hip_runtime\n"
        "from sglang.kernels.ops.attention.dsv4.kv_layout import KVLayout\n"
        "from sglang.srt.utils import is_hip\n"
        "ARCH = get_jit_cuda_arch().major, is_hip_runtime(), is_hip()\n"
    )
    files = sglang_files.files(tmp_path)
    module = files.module("dsv4/dequant_k_cache.py")
    assert module.KVLayout is files.module("dsv4/kv_layout.py").KVLayout
    major = torch.cuda.get_device_capability()[0] if torch.cuda.is_available() else 10
    assert (major, False, False) == module.ARCH and "sglang" not in sys.modules


def test_the_catalog_builds_hold_the_files_the_loaders_read():
    builds = {b.library: b for p in catalog.PACKAGES.values() for b in p.builds}
    sgl = builds["sglang-ops"]
    assert {m.removeprefix(sgl.strip) for m in sgl.members} == set(sglang_ops.PLACE.files)
    vt = builds["vllm-triton"]
    read = {*vllm_triton.PLACE.files, *vllm_v4_cache.PLACE.files}  # one build, two backends
    assert {m.removeprefix(vt.strip) for m in vt.members} == read
    names = dict(catalog.known_builds())
    assert names["sglang-ops-0.5.23"] == "sglang-ops"
    assert names["vllm-triton-0.33.0"] == "vllm-triton" and names["vllm-ops-0.33.0"] == "vllm-ops"
    assert catalog.fetch_spec("vllm-ops-0.33.0") == "vllm[ops]==0.33.0"


def test_the_projects_triton_remap_declines_the_prefill_workspace_form():
    from dsv4bench.backends.triton.backend import TritonKernels

    prefill = make_case(op="remap", topk=64, tokens=8, context_len=128, page_size=16, **V32)
    assert "prefill workspace" in TritonKernels().supports(prefill, "sm90")
    assert TritonKernels().supports(_remap_case(), "sm90") is None


# ---- the DCP form: triton_filter_and_convert_dcp_index -------------------------------------


def _dcp_case(**kw):
    fields = dict(op="remap", form="dcp", topk=64, batch_size=2, s_q=2, context_len=128)
    fields |= dict(page_size=16, dcp_size=4, dcp_rank=1, dcp_interleave=4) | kw
    return make_case(**fields, **V32)


def test_the_dcp_form_calls_vllms_function_as_flashmla_sparse_does():
    from reference import dcp

    calls = []

    def fake(req, table, rows, **kw):  # vLLM's signature; the answer from the oracle
        calls.append((req.clone(), table.shape, rows.shape, kw))
        out = torch.empty_like(rows)
        ranks = kw["dcp_size"], kw["dcp_rank"], kw["cp_kv_cache_interleave_size"]
        slots = dcp.local_slots(rows[:, None], table[req.long()], kw["BLOCK_SIZE"], *ranks)
        return out.copy_(slots[:, 0])

    case = _dcp_case()
    x = make_inputs(case, "cpu")
    prepared = vllm_triton.VllmTriton(ops=(None, None, fake)).prepare(case, x, "cpu")
    prepared.poison()  # the warm-up's output, filled and let go
    got = prepared.finish(prepared.run())
    assert torch.equal(got.out, oracle_call(case, x)().out)
    req, table_shape, rows_shape, kw = calls[-1]
    assert req.tolist() == [0, 0, 1, 1] and table_shape == (2, 2) and rows_shape == (4, 64)
    assert kw["compact_valid_to_front"] is False and "return_valid_counts" not in kw
    assert (kw["dcp_size"], kw["dcp_rank"], kw["cp_kv_cache_interleave_size"]) == (4, 1, 4)
    assert kw["BLOCK_STRIDE_ROWS"] == kw["BLOCK_SIZE"] == 16 and kw["NUM_TOPK_TOKENS"] == 64
    assert prepared.info["form"] == "dcp" and "no guard bytes" in prepared.info["output"]
    last = prepared.run()
    prepared.poison()
    assert bool((last == vllm_triton.POISON).all())


def test_a_build_without_the_dcp_function_declines_the_form_alone():
    case = _dcp_case()
    x = make_inputs(case, "cpu")
    backend = vllm_triton.VllmTriton(ops=(None, _fake_remap(0)))
    assert "no triton_filter_and_convert_dcp_index" in backend.supports(case, "sm90")  # plan's
    assert backend.supports(_remap_case(), "sm90") is None
    with pytest.raises(Unsupported, match="no triton_filter_and_convert_dcp_index"):
        backend.prepare(case, x, "cpu")
    assert backend.prepare(_remap_case(), make_inputs(_remap_case(), "cpu"), "cpu") is not None


def test_the_other_remaps_decline_the_dcp_form_and_the_f64_one_agrees_with_the_oracle():
    from dsv4bench.backends.f64.backend import ReferenceF64
    from dsv4bench.backends.triton.backend import TritonKernels

    case = _dcp_case(context_len=64, dcp_interleave=1)  # s_q 2 of 64 visible: -1 pads
    assert "not one DCP rank's" in TritonKernels().supports(case, "sm90")
    assert "no DCP form" in sglang_ops.SglangOps(lib="/none").case_reason(case)
    wide = dataclasses.replace(case, topk=8192, context_len=8192)  # no compaction: any width
    assert vllm_triton.VllmTriton(lib="/none").case_reason(wide) is None
    for form in ("dcp", "dcp-compact"):
        case = dataclasses.replace(case, form=form)
        x = make_inputs(case, "cpu")
        want = oracle_call(case, x)().out
        prepared = ReferenceF64().prepare(case, x, "cpu")
        assert torch.equal(prepared.finish(prepared.run()).out, want)
        assert bool((want == -1).any()) and bool((want >= 0).any())
    assert "not one DCP rank's (form dcp-compact)" in TritonKernels().supports(case, "sm90")


def test_the_compact_dcp_form_calls_it_as_the_common_sparse_impl_does_and_checks_counts():
    from reference import dcp

    def fake(counts_shift: int):
        def call(req, table, rows, **kw):
            ranks = kw["dcp_size"], kw["dcp_rank"], kw["cp_kv_cache_interleave_size"]
            slots = dcp.local_slots(rows[:, None], table[req.long()], kw["BLOCK_SIZE"], *ranks)
            out = dcp.compact(slots[:, 0]).to(torch.int32)
            counts = (out >= 0).sum(-1).to(torch.int32) + counts_shift
            call.kw = kw
            return out, counts

        return call

    case = _dcp_case(form="dcp-compact")
    x = make_inputs(case, "cpu")
    good = fake(0)
    prepared = vllm_triton.VllmTriton(ops=(None, None, good)).prepare(case, x, "cpu")
    assert torch.equal(prepared.finish(prepared.run()).out, oracle_call(case, x)().out)
    assert good.kw["return_valid_counts"] is True and "compact_valid_to_front" not in good.kw
    assert prepared.info["form"] == "dcp-compact"
    bad = vllm_triton.VllmTriton(ops=(None, None, fake(1))).prepare(case, x, "cpu")
    with pytest.raises(vllm_triton.CountsDisagree, match="4 of 4 rows' valid counts"):
        bad.finish(bad.run())
    wide = dataclasses.replace(case, topk=8192, context_len=8192)  # compaction across tiles
    assert "across tiles" in vllm_triton.VllmTriton(lib="/none").case_reason(wide)
