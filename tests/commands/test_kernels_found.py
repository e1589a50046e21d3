"""`dsv4bench backends` / `plan` lines of build instances: read from the build's build.json and
checked, never loaded (two builds of one library cannot share the process)."""

from __future__ import annotations

import sys

from dsv4bench.backends import deepgemm, flashmla
from dsv4bench.commands.read import kernels_found
from dsv4bench.kernels.store import Build, KernelFile, sha256_of, write_build


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
