"""sgl-flash-mla on a CPU: its sm90 kernels are the optional legacy half
(`torch.ops.flash_mla_legacy`, `flash_mla.has_legacy()`). With the half, the adapter calls that
namespace's ops, bound by the schemas of the 1.0.0 wheel's `_C_legacy.abi3.so` (fakes computing
the oracle); without it, an installed package and a kernels-folder build are refused in one line
(`backends`, `plan`) and their rows are `unsupported` with the reason, nothing loaded."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from dsv4bench.backends import flashmla
from dsv4bench.backends.base import Unsupported
from dsv4bench.backends.flashmla import FlashMLA
from dsv4bench.backends.torch_ref import oracle_call
from dsv4bench.cases.inputs import make_inputs
from dsv4bench.commands.found import kernels_found
from dsv4bench.kernels.store import Build, KernelFile, sha256_of, write_build
from dsv4bench.measure.metrics import accuracy
from dsv4bench.run import worker
from reference import attention
from tests.factories import load_scenario

# the op schemas in sgl-flash-mla 1.0.0's flash_mla/_C_legacy.abi3.so (its strings)
LEGACY_DECODE = (
    "sparse_decode_fwd(Tensor q, Tensor kv, Tensor indices, Tensor? topk_length, "
    "Tensor? attn_sink, Tensor(a!)? tile_scheduler_metadata, Tensor(b!)? num_splits, "
    "Tensor? extra_kv, Tensor? extra_indices, Tensor? extra_topk_length, int d_v, "
    "float sm_scale, str? kv_format=None) -> (Tensor, Tensor, Tensor(a)?, Tensor(b)?)"
)
LEGACY_PREFILL = (
    "sparse_prefill_fwd(Tensor q, Tensor kv, Tensor indices, float sm_scale, int d_v, "
    "Tensor? attn_sink=None, Tensor? topk_length=None, bool return_log2_stats=False, "
    "bool return_stats=True) -> Tensor?[]"
)
CASES = """
name: sgl
backends: [flashmla]
defaults: {num_heads: 16, context_len: 512}
cases:
  - {op: decode, model: v4-flash, batch_size: 2}
  - {op: prefill, model: v4-flash, tokens: 24}
"""


def _cases():
    return load_scenario(CASES, ("flashmla",)).cases


def _package(root, has_legacy: bool):
    """A flash_mla package as sgl-flash-mla's __init__ shows it: __version__ and has_legacy."""
    (root / "flash_mla").mkdir(parents=True)
    text = f"""
    __version__ = "1.0.0"

    def has_legacy():
        return {has_legacy}
    """
    (root / "flash_mla/__init__.py").write_text(textwrap.dedent(text))
    return root


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """An installed flash_mla (sgl-flash-mla) and an empty kernels folder: found first."""
    monkeypatch.setenv("DSV4BENCH_KERNELS", str(tmp_path / "kernels"))
    monkeypatch.delitem(sys.modules, "flash_mla", raising=False)
    yield lambda has_legacy: monkeypatch.syspath_prepend(str(_package(tmp_path, has_legacy)))
    sys.modules.pop("flash_mla", None)


UNSET = "left to the schema's default"  # a Python impl gets only what the caller passed


class LegacyKernels:
    """torch.ops.flash_mla_legacy's two ops with the 1.0.0 schemas, computing the oracle;
    records what the adapter passed for the schema's later, defaulted parameters."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.lib = torch.library.Library("flash_mla_legacy", "DEF")
        self.lib.define(LEGACY_DECODE)
        self.lib.define(LEGACY_PREFILL)
        self.lib.impl("sparse_decode_fwd", self.decode, "CPU")
        self.lib.impl("sparse_prefill_fwd", self.prefill, "CPU")

    def decode(
        self, q, kv, idx, length, sink, sched, splits, ekv, eidx, elen, d_v, scale, fmt=UNSET
    ):
        self.calls.append(("decode", sched is None, fmt))
        out, lse = attention.sparse_mla_decode(
            q, kv, idx, scale, d_v=d_v, topk_length=length, attn_sink=sink,
            extra_k_cache=ekv, extra_indices=eidx, extra_topk_length=elen,
        )  # fmt: skip
        sched = torch.zeros(3, 8, dtype=torch.int32) if sched is None else sched
        splits = torch.arange(q.shape[0] + 1, dtype=torch.int32) if splits is None else splits
        return out.to(q.dtype), lse, sched, splits

    def prefill(self, q, kv, idx, scale, d_v, sink, length, log2_stats=UNSET, stats=UNSET):
        self.calls.append(("prefill", log2_stats, stats))
        out, max_logits, lse = attention.sparse_mla_prefill(
            q, kv, idx, scale, d_v=d_v, attn_sink=sink, topk_length=length
        )
        return [out.to(q.dtype), max_logits, lse]


@pytest.fixture
def legacy_ops():
    kernels = LegacyKernels()
    yield kernels
    kernels.lib._destroy()  # the namespace is the process's: other tests must not find it


def test_with_its_legacy_half_the_adapter_runs_the_flash_mla_legacy_ops(installed, legacy_ops):
    installed(True)
    b = FlashMLA()
    assert b.provider().name == "flash_mla (sgl-flash-mla)" and b.provider().version == "1.0.0"
    for case in _cases():
        x = make_inputs(case, "cpu")
        p = b.prepare(case, x, "cpu")
        got = p.finish(p.run())
        acc = accuracy(oracle_call(case, x)(), got)
        assert acc["nonfinite"] == 0 and acc["cos_diff"] < 1e-5, (case.op, acc)
        assert p.info["padded_heads"] == 64 and p.info["out_in_place"] is False
    # decode: the scheduling call, then the timed one with its schedule; kv_format (None: the
    # format read from the cache width), return_log2_stats (False) and return_stats (True):
    # the schema's defaults
    assert legacy_ops.calls == [
        ("decode", True, UNSET),
        ("decode", False, UNSET),
        ("prefill", UNSET, UNSET),
    ]


def test_without_its_legacy_half_an_installed_package_is_one_line_and_unsupported_rows(
    installed, legacy_ops
):
    installed(False)
    b = FlashMLA()
    line = kernels_found(b)  # the `backends` line and plan's `kernels flashmla:` line
    assert line.startswith("not available: FlashMLA not found") and "\n" not in line
    assert "flash_mla 1.0.0: sgl-flash-mla without its legacy half (has_legacy() False" in line
    for case in _cases():
        row, prepared = worker.check(case, b, "sm90", worker.Cache())
        assert row["status"] == "unsupported" and prepared is None
        assert "without its legacy half" in row["message"] and "\n" not in row["message"]
    assert legacy_ops.calls == []


def _build_folder(root, legacy: bool):
    """A kernels-folder build of sgl-flash-mla 1.0.0 as `kernels fetch` cuts it (files not
    loadable: nothing here may load them)."""
    folder = root / "flashmla-sgl-1.0.0"
    names = ["__init__.py", "cuda.abi3.so", *(["_C_legacy.abi3.so"] if legacy else [])]
    files = []
    for name in names:
        path = folder / "flash_mla" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"not loaded")
        files.append(KernelFile(f"flash_mla/{name}", f"flash_mla/{name}", sha256_of(path), 10))
    write_build(root, Build(folder.name, "flashmla", "sgl-flash-mla", "1.0.0", "1.0.0", files))
    return folder


def test_a_build_without_its_legacy_half_is_refused_at_plan_time_without_loading(tmp_path):
    folder = _build_folder(tmp_path, legacy=False)
    b = FlashMLA(lib=str(folder))
    want = f"flashmla-sgl-1.0.0: {flashmla.NO_LEGACY}"
    assert kernels_found(b) == f"not available: {want}"
    for case in _cases():
        assert b.supports(case, "sm90") == want
        row, _ = worker.check(case, b, "sm90", worker.Cache())
        assert (row["status"], row["message"]) == ("unsupported", want)
    with pytest.raises(Unsupported, match="without its legacy half"):
        flashmla.load_file(str(folder / "flash_mla"))  # where the kernels-folder chain points
    assert not b._found.loaded  # and nothing was loaded to say so
    with_half = FlashMLA(lib=str(_build_folder(tmp_path / "other", legacy=True)))
    assert with_half.supports(_cases()[0], "sm90") is None
    assert kernels_found(with_half) == (
        "build flashmla-sgl-1.0.0: flashmla 1.0.0 from sgl-flash-mla==1.0.0"
    )


def test_plan_says_it_on_every_job_and_in_its_kernels_line(tmp_path, run_cli):
    folder = _build_folder(tmp_path, legacy=False)
    scenario = tmp_path / "sgl.yaml"
    scenario.write_text(
        CASES.replace(
            "backends: [flashmla]", f"backends: [{{name: flashmla, as: sgl, lib: {folder}}}]"
        )
    )
    code, out, _ = run_cli("plan", str(scenario), "--arch", "sm90")
    assert code == 0
    jobs = [line for line in out.splitlines() if " sgl " in line]
    assert len(jobs) == 2, out
    assert all(
        line.endswith(f"unsupported: flashmla-sgl-1.0.0: {flashmla.NO_LEGACY}") for line in jobs
    )
    assert f"kernels sgl: not available: flashmla-sgl-1.0.0: {flashmla.NO_LEGACY}" in out
