"""`dsv4bench backends` / `plan` lines of build instances: read from the build's build.json and
checked, never loaded (two builds of one library cannot share the process); a build of a release
the adapters were not tested against is planned there, marked "untested release"."""

from __future__ import annotations

import sys

import pytest

from dsv4bench.backends import deepgemm, flashmla
from dsv4bench.commands.found import kernels_found
from dsv4bench.kernels.catalog import PACKAGES
from dsv4bench.kernels.store import Build, KernelFile, sha256_of, write_build
from tests.factories import load_scenario


def _build(root, name: str, library: str, files: dict[str, bytes], version="2.8.1") -> Build:
    kept = []
    for rel, data in files.items():
        path = root / name / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        kept.append(KernelFile(rel, f"pkg/{rel}", sha256_of(path), len(data)))
    build = Build(name, library, "vllm", "0.33.0", version, kept)
    write_build(root, build)
    return build


def test_a_fetched_build_is_described_not_loaded(tmp_path):
    _build(tmp_path, "flashmla-vllm-0.33.0", "flashmla", {"_flashmla_C.abi3.so": b"x"}, "0.33.0")
    line = kernels_found(flashmla.FlashMLA(lib=str(tmp_path / "flashmla-vllm-0.33.0")))
    assert line == "build flashmla-vllm-0.33.0: flashmla 0.33.0 from vllm==0.33.0"


def test_a_damaged_or_unknown_build_says_why_in_one_line(tmp_path):
    _build(tmp_path, "flashmla-vllm-0.33.0", "flashmla", {"_flashmla_C.abi3.so": b"x"}, "0.33.0")
    (tmp_path / "flashmla-vllm-0.33.0/_flashmla_C.abi3.so").write_bytes(b"changed")
    line = kernels_found(flashmla.FlashMLA(lib=str(tmp_path / "flashmla-vllm-0.33.0")))
    assert line.startswith("not available:") and "differs" in line and "\n" not in line
    init = b"__version__ = '3.0.0'\nnew_logits = None\n"
    _build(tmp_path, "deepgemm-vllm-9.0.0", "deepgemm", {"deep_gemm/__init__.py": init}, "3.0.0")
    before = set(sys.modules)
    line = kernels_found(deepgemm.DeepGEMM(lib=str(tmp_path / "deepgemm-vllm-9.0.0")))
    assert line.startswith("not available: DeepGEMM 3.0.0: no fp8_paged_mqa_logits")
    assert "deep_gemm" not in set(sys.modules) - before


def _instances(folder: str) -> dict:
    from dsv4bench.backends.fa3 import FA3
    from dsv4bench.backends.flashinfer.backend import FlashInfer

    return {
        "flashmla": flashmla.FlashMLA(lib=folder),
        "fa3": FA3(lib=folder),
        "flashinfer": FlashInfer(lib=folder),
        "deepgemm": deepgemm.DeepGEMM(lib=folder),
    }


# a case each library takes (the release check comes before anything it could say of a case)
PLAN_CASES = {
    "flashmla": "{op: decode, model: v4-flash, batch_size: 2}",
    "fa3": "{op: decode, model: v4-flash, batch_size: 2}",
    "flashinfer": "{op: decode, model: v4-flash, batch_size: 2}",
    "deepgemm": "{op: indexer, model: v3.2, batch_size: 2}",
}


def _case(library: str):
    text = f"name: t\nbackends: [torch]\ncases:\n  - {PLAN_CASES[library]}\n"
    return load_scenario(text, ("torch",)).cases[0]


INIT_28 = b"__version__ = '2.8.1'\nfp8_fp4_paged_mqa_logits = None\n"


@pytest.mark.parametrize("library", list(PLAN_CASES))
def test_an_untested_release_is_planned_and_marked_at_plan_time(tmp_path, library):
    files = {"deep_gemm/__init__.py": INIT_28} if library == "deepgemm" else {"lib.so": b"x"}
    package = "flashinfer-python" if library == "flashinfer" else "vllm"
    name = f"{library}-9.9.9"
    build = _build(tmp_path, name, library, files, "9.9.9")
    build.package, build.version = package, "9.9.9"
    write_build(tmp_path, build)
    before = set(sys.modules)
    b = _instances(str(tmp_path / name))[library]
    tested = ", ".join(PACKAGES[package].versions)
    assert kernels_found(b) == (
        f"build {name}: {library} 9.9.9 from {package}==9.9.9 [untested release "
        f"{package}==9.9.9 (tested: {tested}); its op schemas and signatures are checked at load]"
    )
    assert b.supports(_case(library), "sm90") is None  # planned: the load decides
    assert not {"deep_gemm", "flashinfer", "flash_mla"} & (set(sys.modules) - before)


@pytest.mark.parametrize("library", list(PLAN_CASES))
def test_a_release_the_catalog_knows_is_planned(tmp_path, library):
    files = {"deep_gemm/__init__.py": INIT_28} if library == "deepgemm" else {"lib.so": b"x"}
    build = _build(tmp_path, f"{library}-x", library, files, "0.33.0")
    if library == "flashinfer":
        build.package, build.version = "flashinfer-python", "0.6.18"
        write_build(tmp_path, build)
    b = _instances(str(tmp_path / f"{library}-x"))[library]
    assert kernels_found(b).startswith(f"build {library}-x: {library} ")
    assert b.supports(_case(library), "sm90") is None
    if library == "flashinfer":  # a library the package does not ship is no build of it
        build.package, build.version = "vllm", "0.33.0"
        write_build(tmp_path, build)
        assert b.build_reason() == (
            "flashinfer-x: flashinfer 0.33.0 from vllm, which the catalog says ships deepgemm, "
            "fa3, flashmla, not flashinfer"
        )


def test_an_unknown_package_and_an_unreadable_build_json_are_one_line(tmp_path):
    build = _build(tmp_path, "fa3-x-1.0", "fa3", {"lib.so": b"x"}, "1.0")
    build.package = "x-kernels"
    write_build(tmp_path, build)
    line = kernels_found(_instances(str(tmp_path / "fa3-x-1.0"))["fa3"])
    assert line == (
        "not available: fa3-x-1.0: fa3 1.0 from x-kernels, a package the catalog does not know "
        f"(known: {', '.join(PACKAGES)})"
    )
    (tmp_path / "fa3-x-1.0/build.json").write_text("{")
    reason = _instances(str(tmp_path / "fa3-x-1.0"))["fa3"].build_reason()
    assert reason.endswith(
        "build.json: unreadable (JSONDecodeError; dsv4bench kernels fetch again)"
    )
