"""Every build the kernels catalog knows is a backend instance pinned to its folder of the
kernels folder: named as the build, its library's backend as base, a worker of its own; a
build not fetched (or one whose API is unknown) says so in one line without importing it."""

from __future__ import annotations

import sys

import pytest

from dsv4bench import backends
from dsv4bench.backends import Unsupported, deepgemm, flashmla
from dsv4bench.backends.toolchains import library
from dsv4bench.kernels.catalog import known_builds
from dsv4bench.kernels.store import kernels_dir
from tests.factories import load_scenario


def test_every_pinnable_build_is_an_instance():
    names = backends.names()
    pinnable = backends.pinnable_libraries()
    assert pinnable == {
        "flashmla", "fa3", "deepgemm", "flashinfer", "q8kv8", "tilelang", "sglang-topk",
        "sglang-triton", "vllm-triton", "sglang-ops", "vllm-ops", "vllm-v4-cache",
    }  # fmt: skip
    pinned = [(n, lib) for n, lib in known_builds() if lib in pinnable]
    assert {
        "flashmla-vllm-0.33.0",
        "flashmla-sgl-1.0.0",
        "fa3-vllm-0.26.0",
        "tilelang-sglang-0.5.23",
    } <= {n for n, _ in pinned}
    assert "tilelang-runtime-0.1.15" not in names  # a runtime, not a kernel build
    keys = set()
    for name, lib in pinned:
        b = backends.get(name)
        assert name in names and b.base == lib and b.lib == str(kernels_dir() / name)
        keys.add(b.process_key())
    assert len(keys) == len(pinned)  # two builds of one library never share a process


def test_an_unfetched_build_is_unsupported_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("DSV4BENCH_KERNELS", str(tmp_path))
    b = flashmla.FlashMLA(lib=str(kernels_dir() / "flashmla-vllm-0.33.0"))
    with pytest.raises(Unsupported) as e:
        b.provider()
    assert "kernels fetch" in str(e.value) and "\n" not in str(e.value)


def test_kernels_folder_follows_the_environment(tmp_path, monkeypatch):
    (tmp_path / "deepgemm-vllm-0.33.0/deep_gemm").mkdir(parents=True)
    (tmp_path / "deepgemm-vllm-0.26.0/deep_gemm").mkdir(parents=True)
    monkeypatch.setenv("DSV4BENCH_KERNELS", str(tmp_path))
    found = library.kernel_builds(deepgemm.LIBRARY)
    assert [b.label for b in found] == ["deepgemm-vllm-0.33.0", "deepgemm-vllm-0.26.0"]


def _deep_gemm(folder, text: str):
    (folder / "deep_gemm").mkdir(parents=True)
    (folder / "deep_gemm/__init__.py").write_text(text)
    return folder


def _indexer_case():
    text = "name: t\nop: indexer\nbackends: [deepgemm]\ncases:\n  - {model: v3.2, batch_size: 2}\n"
    return load_scenario(text, ("deepgemm",)).cases[0]


def test_a_pinned_deepgemm_is_read_not_imported_at_plan_time(tmp_path):
    known = _deep_gemm(tmp_path / "a", "raise RuntimeError('imported')\nfp8_fp4_paged_mqa_logits\n")
    unknown = _deep_gemm(tmp_path / "b", "__version__ = '3.0.0'\nnew_logits = None\n")
    case = _indexer_case()
    before = set(sys.modules)
    assert deepgemm.DeepGEMM(lib=str(known)).supports(case, "sm90") is None
    reason = deepgemm.DeepGEMM(lib=str(unknown)).supports(case, "sm90")
    assert reason.startswith("DeepGEMM 3.0.0: no fp8_paged_mqa_logits") and "\n" not in reason
    assert "deep_gemm" not in set(sys.modules) - before


def test_a_pinned_deepgemm_imports_its_own_folder(tmp_path, monkeypatch):
    folder = _deep_gemm(tmp_path / "b", "__version__ = '2.8.1'\n")
    monkeypatch.delitem(sys.modules, "deep_gemm", raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))
    with pytest.raises(Unsupported, match="DeepGEMM 2.8.1: no fp8_paged_mqa_logits"):
        deepgemm.DeepGEMM(lib=str(folder)).provider()  # its own folder's module, imported
    monkeypatch.delitem(sys.modules, "deep_gemm", raising=False)


def test_sgl_flash_mla_folder_loads_its_legacy_half(tmp_path):
    (tmp_path / "flash_mla").mkdir()
    (tmp_path / "flash_mla/_C_legacy.abi3.so").write_bytes(b"not a library")
    (tmp_path / "flash_mla/cuda.abi3.so").write_bytes(b"not a library")
    with pytest.raises(Unsupported) as e:
        flashmla.load_file(str(tmp_path))
    assert "_C_legacy.abi3.so" in str(e.value)  # the sm90 kernels, not the sm100 ones


def test_a_flashinfer_build_puts_its_site_first(tmp_path, monkeypatch):
    from dsv4bench.backends.flashinfer import backend as fib

    site = tmp_path / "flashinfer-0.7.2.post1/site/flashinfer"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text("__version__ = '0.7.2.post1'\n")
    monkeypatch.delitem(sys.modules, "flashinfer", raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))
    b = fib.FlashInfer(lib=str(tmp_path / "flashinfer-0.7.2.post1"))
    assert b.provider().version == "0.7.2.post1" and b.process_key().endswith("0.7.2.post1")
    monkeypatch.delitem(sys.modules, "flashinfer", raising=False)
    with pytest.raises(Unsupported, match="no site/flashinfer"):
        fib.FlashInfer(lib=str(tmp_path / "nothing")).provider()
