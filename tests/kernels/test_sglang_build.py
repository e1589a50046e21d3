"""The q8kv8 build of the sglang wheel: its kernel sources plus members of two other wheels
(FlashInfer's CUTLASS headers, apache-tvm-ffi whole), each where the JIT looks for it; the
sglang wheel is asked of pip for CPython 3.11 on its own platform tag, the others for the GPU
machine's Python."""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

from dsv4bench.backends.q8kv8 import sources
from dsv4bench.backends.sgl_topk import sources as topk_sources
from dsv4bench.backends.sglang_triton import sources as triton_sources
from dsv4bench.kernels import catalog, fetch
from dsv4bench.kernels.store import read_builds, verify

CSRC = catalog.Q8KV8_CSRC
SGLANG = {f"{CSRC}{n}": f"// {n}\n".encode() for n in sources.KERNEL_FILES}
SGLANG["sglang/srt/server.py"] = b"# not the kernel\n"
SGLANG["sglang/kernels/ops/attention/dsa/tilelang_kernel.py"] = b"# the tilelang build's\n"
for _name in (*catalog.SGL_TOPK_SOURCES, topk_sources.HEADER_PROBE, "include/sgl_kernel/utils.h"):
    SGLANG[catalog.SGL_TOPK_JIT + _name] = b"// the sglang-topk build's\n"
SGLANG[catalog.SGL_TOPK_JIT + "csrc/elementwise/other.cuh"] = b"// not taken\n"
# the sglang-triton build's files (the loader's FILES under the attention folder)
SGLANG.update({catalog.SGLANG_ATTENTION + f: b"# sglang-triton\n" for f in triton_sources.FILES})
# the sglang-ops build's (the DSA helper kernels)
SGLANG.update({catalog.SGLANG_ATTENTION + f: b"# sglang-ops\n" for f in catalog.SGLANG_OPS})
FLASHINFER = {
    "flashinfer/data/cutlass/include/cute/tensor.hpp": b"// cute\n",
    "flashinfer/data/cutlass/include/cutlass/cutlass.h": b"// cutlass\n",
    "flashinfer/__init__.py": b"",
}
TVM = {
    "tvm_ffi/__init__.py": b"",
    "tvm_ffi/include/tvm/ffi/function.h": b"// ffi\n",
    "tvm_ffi/lib/libtvm_ffi.so": b"\x7fELF",
}


def _wheel(folder: Path, name: str, members: dict[str, bytes]) -> None:
    with zipfile.ZipFile(folder / name, "w") as z:
        for member, data in members.items():
            z.writestr(member, data)


def _wheels(tmp_path: Path) -> Path:
    folder = tmp_path / "wheels"
    folder.mkdir(exist_ok=True)  # download() makes it first
    write_wheels(folder)
    return folder


def write_wheels(folder: Path) -> None:
    """sglang 0.5.23 (both its kernel builds' members), FlashInfer 0.6.18, apache-tvm-ffi."""
    _wheel(folder, "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl", SGLANG)
    _wheel(folder, "flashinfer_python-0.6.18-py3-none-any.whl", FLASHINFER)
    _wheel(folder, "apache_tvm_ffi-0.1.15.post2-cp312-cp312-manylinux_2_28_x86_64.whl", TVM)


def test_the_build_holds_sources_cutlass_and_tvm_ffi_where_the_jit_looks(tmp_path):
    root = tmp_path / "k"
    root.mkdir()
    built = fetch.fetch_package(catalog.SGLANG, "0.5.23", root, wheels=_wheels(tmp_path),
                                say=lambda _: None)  # fmt: skip
    names = ["q8kv8-sglang-0.5.23", "tilelang-sglang-0.5.23", "sglang-topk-0.5.23",
             "sglang-triton-0.5.23", "sglang-ops-0.5.23"]  # fmt: skip
    assert [b.name for b in built] == names
    (ops_build,) = [b for b in read_builds(root) if b.library == "sglang-ops"]
    assert sorted(f.path for f in ops_build.files) == sorted(catalog.SGLANG_OPS)
    (triton_build,) = [b for b in read_builds(root) if b.library == "sglang-triton"]
    assert sorted(f.path for f in triton_build.files) == sorted(triton_sources.FILES)
    assert not triton_sources.missing_files(root / triton_build.name)  # what the backend reads
    (build,) = [b for b in read_builds(root) if b.library == "q8kv8"]
    assert build.library == "q8kv8" and not verify(root, build)
    paths = {f.path for f in build.files}
    assert "csrc/entry.cuh" in paths and "cutlass/include/cute/tensor.hpp" in paths
    assert "site/tvm_ffi/lib/libtvm_ffi.so" in paths
    assert not any("server.py" in p or "flashinfer/__init__" in p for p in paths)
    assert len(build.wheels) == 3
    found = sources.from_build(root / build.name)  # what the backend reads
    assert found.version == "0.5.23" and found.site == root / build.name / "site"


def test_pip_is_asked_for_the_sglang_wheel_as_cpython_311(tmp_path, monkeypatch):
    asked = []

    def pip(cmd, **_):
        asked.append(cmd)
        _wheels(tmp_path)  # "downloads" every wheel into tmp_path/wheels
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(fetch.subprocess, "run", pip)
    got = fetch.download("sglang==0.5.23", tmp_path / "wheels", "3.11", ("manylinux_2_34_x86_64",))
    assert got.name.startswith("sglang-0.5.23-cp311")
    cmd = asked[0]
    assert cmd[cmd.index("--python-version") + 1] == "3.11"
    assert "manylinux_2_34_x86_64" in cmd and "--no-deps" in cmd and "--only-binary=:all:" in cmd


def test_catalog_names_the_build_and_its_parts():
    assert ("q8kv8-sglang-0.5.23", "q8kv8") in catalog.known_builds()
    spec = catalog.SGLANG
    assert spec.python_version == "3.11"
    requirements = [p.requirement for p in spec.builds[0].parts]
    assert requirements == ["flashinfer-python==0.6.18", "apache-tvm-ffi==0.1.15.post2"]


def test_the_topk_build_holds_its_sources_the_headers_and_tvm_ffi(tmp_path):
    root = tmp_path / "k"
    root.mkdir()
    fetch.fetch_package(catalog.SGLANG, "0.5.23", root, wheels=_wheels(tmp_path), say=print)
    (build,) = [b for b in read_builds(root) if b.library == "sglang-topk"]
    assert not verify(root, build)
    paths = {f.path for f in build.files}
    assert {"csrc/elementwise/fast_topk.cuh", "csrc/deepseek_v4/topk_v2.cuh"} <= paths
    assert {topk_sources.HEADER_PROBE, "include/sgl_kernel/utils.h"} <= paths
    assert "site/tvm_ffi/lib/libtvm_ffi.so" in paths
    assert not any("other.cuh" in p or "server.py" in p or "cutlass" in p for p in paths)
    found = topk_sources.from_build(root / build.name)  # what the backend reads
    assert found.version == "0.5.23" and found.jit == root / build.name
