"""The GPU tests' builds (tests/kernel_builds.py), on a fake kernels folder: which builds become
params, why a missing or damaged one is skipped (its name and the fetch that brings it), the
kernels folder read when pytest collects, and a second build of one library sent to a pytest
of its own."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from dsv4bench.kernels.store import Build, KernelFile, sha256_of, write_build
from tests import kernel_builds
from tests.kernel_builds import build_params, expect_supported, ran_alone

BACKEND_TESTS = Path(__file__).resolve().parents[1] / "backends"


def _build(root, name: str, library: str, package: str, version: str) -> Build:
    path = root / name / "lib.so"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"kernels")
    files = [KernelFile("lib.so", "pkg/lib.so", sha256_of(path), path.stat().st_size)]
    build = Build(name, library, package, version, version, files)
    write_build(root, build)
    return build


def _skips(params) -> dict[str, str | None]:
    """build name -> its skip reason (None: it runs)."""
    return {p.id: next((m.kwargs["reason"] for m in p.marks), None) for p in params}


def test_every_catalog_build_is_a_param_and_a_missing_one_says_what_brings_it(tmp_path):
    _build(tmp_path, "flashmla-vllm-0.33.0", "flashmla", "vllm", "0.33.0")
    _build(tmp_path, "flashmla-sgl-1.0.0", "flashmla", "sgl-flash-mla", "1.0.0")
    (tmp_path / "flashmla-sgl-1.0.0/lib.so").write_bytes(b"cut short")
    _build(tmp_path, "flashmla-vllm-0.40.0", "flashmla", "vllm", "0.40.0")  # not in the catalog
    _build(tmp_path, "fa3-vllm-0.33.0", "fa3", "vllm", "0.33.0")
    skips = _skips(build_params("flashmla", tmp_path))
    # the catalog's order (newest tested vLLM first: the default build; then the releases it
    # names untested), then the folder's others
    assert list(skips) == [
        "flashmla-vllm-0.33.0",
        "flashmla-vllm-0.26.0",
        "flashmla-vllm-0.34.0",
        "flashmla-sgl-1.0.0",
        "flashmla-vllm-0.40.0",
    ]
    assert skips["flashmla-vllm-0.33.0"] is None and skips["flashmla-vllm-0.40.0"] is None
    assert skips["flashmla-vllm-0.26.0"] == (
        f"flashmla-vllm-0.26.0 is not in {tmp_path}: dsv4bench kernels fetch vllm==0.26.0 "
        "(or dsv4bench kernels unpack .kpack/flashmla-vllm-0.26.0.tar.xz)"
    )
    damaged = skips["flashmla-sgl-1.0.0"]
    assert damaged.startswith("flashmla-sgl-1.0.0/lib.so: sha256 or size differs")
    assert "dsv4bench kernels fetch sgl-flash-mla==1.0.0" in damaged
    fa3 = _skips(build_params("fa3", tmp_path))
    assert fa3 == {
        "fa3-vllm-0.33.0": None,
        "fa3-vllm-0.26.0": fa3["fa3-vllm-0.26.0"],
        "fa3-vllm-0.34.0": fa3["fa3-vllm-0.34.0"],
    }
    assert "dsv4bench kernels fetch vllm==0.34.0" in fa3["fa3-vllm-0.34.0"]
    assert "dsv4bench kernels fetch vllm==0.26.0" in fa3["fa3-vllm-0.26.0"]


def test_the_kernels_folder_is_read_when_the_params_are_made(tmp_path, monkeypatch):
    monkeypatch.setenv("DSV4BENCH_KERNELS", str(tmp_path))
    assert all(_skips(build_params("deepgemm")).values())  # an empty folder: every one skips
    _build(tmp_path, "deepgemm-vllm-0.26.0", "deepgemm", "vllm", "0.26.0")
    skips = _skips(build_params("deepgemm"))
    assert skips["deepgemm-vllm-0.26.0"] is None
    assert "dsv4bench kernels fetch vllm==0.33.0" in skips["deepgemm-vllm-0.33.0"]


def _decorators(path: Path, test: str) -> list[str]:
    """The decorators of the function `test` in a test file, as source text."""
    tree = ast.parse(path.read_text())
    found = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == test)
    return [ast.unparse(d) for d in found.decorator_list]


@pytest.mark.parametrize(
    "file, test, library",
    [
        ("test_deepgemm_backend.py", "test_real_deepgemm_matches_the_oracle", "deepgemm"),
        ("test_fa3_backend.py", "test_real_kernel_matches_the_oracle", "fa3"),
        (
            "test_flashinfer_fa3.py",
            "test_real_kernel_matches_the_oracle_and_the_fake",
            "flashinfer",
        ),
        ("test_flashmla_backend.py", "test_real_flashmla_matches_the_oracle", "flashmla"),
    ],
)
def test_each_adapters_gpu_test_runs_every_build_of_its_library(file, test, library):
    # read, not imported: a test module imported twice registers its fake torch ops twice
    decorators = _decorators(BACKEND_TESTS / file, test)
    assert "pytest.mark.gpu" in decorators
    assert f"pytest.mark.parametrize('build', build_params('{library}'))" in decorators


def _request(nodeid="tests/backends/test_x.py::test_y[decode-fa3-vllm-0.26.0]"):
    return SimpleNamespace(
        node=SimpleNamespace(nodeid=nodeid), config=SimpleNamespace(rootpath=".")
    )


def _spawned(code: int, out: str, calls: list):
    def spawn(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, code, out, "")

    return spawn


def test_a_second_build_of_a_library_runs_in_a_pytest_of_its_own(monkeypatch):
    monkeypatch.setattr(kernel_builds, "LOADED", {})
    calls: list = []
    passed = _spawned(0, "1 passed in 9.1s\n", calls)
    assert ran_alone(_request(), "fa3", "fa3-vllm-0.33.0", passed) is False  # the first: here
    assert ran_alone(_request(), "fa3", "fa3-vllm-0.33.0", passed) is False and calls == []
    assert ran_alone(_request(), "flashmla", "flashmla-sgl-1.0.0", passed) is False
    assert ran_alone(_request(), "fa3", "fa3-vllm-0.26.0", passed) is True
    assert calls[0][-1] == "tests/backends/test_x.py::test_y[decode-fa3-vllm-0.26.0]"
    assert calls[0][1:3] == ["-m", "pytest"]
    skipped = "SKIPPED [1] tests/backends/test_x.py:12: needs an sm90 GPU\n1 skipped in 2s\n"
    with pytest.raises(pytest.skip.Exception, match="fa3-vllm-0.26.0 in a pytest of its own "):
        ran_alone(_request(), "fa3", "fa3-vllm-0.26.0", _spawned(0, skipped, calls))
    with pytest.raises(pytest.skip.Exception, match="own.*: needs an sm90 GPU$"):
        ran_alone(_request(), "fa3", "fa3-vllm-0.26.0", _spawned(0, skipped, calls))
    failed = "E   AssertionError: cos_diff 0.3\n1 failed in 3s\n"
    with pytest.raises(pytest.fail.Exception, match=r"(?s)exit 1.*cos_diff 0\.3"):
        ran_alone(_request(), "fa3", "fa3-vllm-0.26.0", _spawned(1, failed, calls))
    with pytest.raises(pytest.fail.Exception, match="exit 5"):  # nothing collected there
        ran_alone(_request(), "fa3", "fa3-vllm-0.26.0", _spawned(5, "no tests ran\n", calls))


def test_an_unsupported_catalog_build_fails_and_any_other_skips():
    expect_supported("flashmla-vllm-0.26.0", None)
    with pytest.raises(pytest.fail.Exception, match="flashmla-vllm-0.26.0: no such kernel"):
        expect_supported("flashmla-vllm-0.26.0", "no such kernel")
    with pytest.raises(pytest.skip.Exception, match="flashmla-vllm-0.40.0: unknown release"):
        expect_supported("flashmla-vllm-0.40.0", "unknown release")
    # a release the catalog names but the adapters were not tested against: skipped, saying why
    with pytest.raises(pytest.skip.Exception, match="flashmla-vllm-0.34.0: takes no"):
        expect_supported("flashmla-vllm-0.34.0", "takes no")
