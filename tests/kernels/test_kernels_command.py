"""`dsv4bench kernels`: builds cut from (fake) engine wheels, their manifest, pack and unpack
round trips, and one-line refusals."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from dsv4bench.cli import main
from dsv4bench.kernels import catalog
from dsv4bench.kernels.instances import default_builds
from dsv4bench.kernels.store import read_builds, sha256_of

VLLM_MEMBERS = {
    "vllm/_flashmla_C.abi3.so": b"flashmla",
    "vllm/_flashmla_extension_C.abi3.so": b"ext",
    "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so": b"fa3" * 1000,
    "vllm/vllm_flash_attn/flash_attn_interface.py": b"# interface\n",
    "vllm/third_party/deep_gemm/__init__.py": b"__version__ = '2.8.1'\n",
    "vllm/third_party/deep_gemm/include/x.cuh": b"// header\n",
    "vllm/engine.py": b"# not a kernel\n",
}


def _wheel(folder: Path, name: str, members: dict[str, bytes]) -> Path:
    path = folder / name
    with zipfile.ZipFile(path, "w") as z:
        for member, data in members.items():
            z.writestr(member, data)
    return path


@pytest.fixture
def wheels(tmp_path: Path) -> Path:
    folder = tmp_path / "wheels"
    folder.mkdir()
    _wheel(folder, "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl", VLLM_MEMBERS)
    members = {k: v for k, v in VLLM_MEMBERS.items() if "deep_gemm/__init__" not in k}
    members["vllm/third_party/deep_gemm/__init__.py"] = b"__version__ = '2.5.0'\n"
    _wheel(folder, "vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl", members)
    sgl = {
        "flash_mla/__init__.py": b"",
        "flash_mla/VERSION": b"1.0.0\n",
        "flash_mla/cuda.abi3.so": b"x",
    }
    _wheel(folder, "sgl_flash_mla-1.0.0-cp310-abi3-manylinux2014_x86_64.whl", sgl)
    return folder


def _kernels(*args: str) -> int:
    return main(["kernels", *args])


def test_fetch_cuts_every_build_with_its_manifest(tmp_path, wheels, capsys):
    root = tmp_path / "k"
    assert _kernels("fetch", "vllm==0.33.0", "--wheels", str(wheels), "--dir", str(root)) == 0
    builds = {b.name: b for b in read_builds(root)}
    assert sorted(builds) == ["deepgemm-vllm-0.33.0", "fa3-vllm-0.33.0", "flashmla-vllm-0.33.0"]
    assert builds["deepgemm-vllm-0.33.0"].library_version == "2.8.1"
    assert (root / "deepgemm-vllm-0.33.0/deep_gemm/include/x.cuh").is_file()
    fa3 = builds["fa3-vllm-0.33.0"]
    assert {f.path for f in fa3.files} == {"_vllm_fa3_C.abi3.so", "flash_attn_interface.py"}
    so = next(f for f in fa3.files if f.path == "_vllm_fa3_C.abi3.so")
    assert so.member == "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so"
    assert so.size == 3000 and so.sha256 == sha256_of(root / "fa3-vllm-0.33.0" / so.path)
    assert not list(root.rglob("engine.py"))  # only the kernels' members
    manifest = json.loads((root / "manifest.json").read_text())
    assert {b["name"] for b in manifest["builds"]} == set(builds)
    assert all(b["package"] == "vllm" and b["version"] == "0.33.0" for b in manifest["builds"])


def test_default_instance_is_the_newest_build(tmp_path, wheels, capsys):
    root = tmp_path / "k"
    for spec in ("vllm==0.26.0", "sgl-flash-mla", "vllm==0.33.0"):
        assert _kernels("fetch", spec, "--wheels", str(wheels), "--dir", str(root)) == 0
    defaults = default_builds(read_builds(root))
    assert defaults["flashmla"] == "flashmla-vllm-0.33.0"
    assert defaults["deepgemm"] == "deepgemm-vllm-0.33.0"
    capsys.readouterr()
    assert _kernels("list", "--dir", str(root)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 7
    sgl = next(line for line in lines if line.startswith("flashmla-sgl-1.0.0"))
    assert "1.0.0" in sgl and "ok" in sgl and "default" not in sgl
    assert any(line.startswith("deepgemm-vllm-0.26.0") and "2.5.0" in line for line in lines)


def test_pack_and_unpack_round_trip_and_damage(tmp_path, wheels, capsys):
    root, packed, there = tmp_path / "k", tmp_path / "kpack", tmp_path / "there"
    _kernels("fetch", "vllm==0.33.0", "--wheels", str(wheels), "--dir", str(root))
    assert _kernels("pack", "fa3-vllm-0.33.0", "--dir", str(root), "--out", str(packed)) == 0
    assert [p.name for p in packed.iterdir()] == ["fa3-vllm-0.33.0.tar.xz"]
    assert _kernels("unpack", str(packed), "--dir", str(there)) == 0
    assert [b.name for b in read_builds(there)] == ["fa3-vllm-0.33.0"]
    so = there / "fa3-vllm-0.33.0/_vllm_fa3_C.abi3.so"
    assert so.read_bytes() == b"fa3" * 1000
    capsys.readouterr()
    assert _kernels("unpack", str(packed), "--dir", str(there)) == 0
    assert "already there" in capsys.readouterr().out
    so.write_bytes(b"broken")  # a damaged build is unpacked again
    assert _kernels("unpack", str(packed), "--dir", str(there)) == 0
    assert so.read_bytes() == b"fa3" * 1000
    (root / "fa3-vllm-0.33.0/_vllm_fa3_C.abi3.so").write_bytes(b"broken")
    assert _kernels("pack", "fa3-vllm-0.33.0", "--dir", str(root), "--out", str(packed)) == 2
    assert "sha256 or size differs" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, expected",
    [
        (["fetch", "vllm==0.1.0"], "no member list for vllm 0.1.0"),
        (["fetch", "tensorrt"], "tensorrt: unknown package"),
        (["pack", "nope"], "nope: no such build"),
        (["unpack", "missing.tar.xz"], "no packed build at missing.tar.xz"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, expected):
    assert _kernels(*args, "--dir", str(tmp_path / "k")) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and len(err.splitlines()) == 1


def test_a_wheel_missing_a_member_is_refused(tmp_path, capsys):
    folder = tmp_path / "wheels"
    folder.mkdir()
    _wheel(folder, "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl", {"vllm/x.py": b""})
    assert _kernels("fetch", "vllm", "--wheels", str(folder), "--dir", str(tmp_path / "k")) == 2
    assert "has no vllm/_flashmla_C.abi3.so" in capsys.readouterr().err
    assert not read_builds(tmp_path / "k")


def test_an_archive_that_is_not_a_build_is_refused(tmp_path, capsys):
    import tarfile

    bad = tmp_path / "x.tar.xz"
    with tarfile.open(bad, "w:xz") as tar:
        tar.add(__file__, arcname="x/y.py")
    assert _kernels("unpack", str(bad), "--dir", str(tmp_path / "k")) == 2
    assert "not a packed build" in capsys.readouterr().err


def test_catalog_names_every_release_the_engines_ship():
    specs = catalog.default_specs()
    for spec in ("vllm==0.33.0", "vllm==0.26.0", "sgl-flash-mla==1.0.0"):
        assert spec in specs
    assert {"flashinfer-python==0.7.2.post1", "flashinfer-python==0.6.18"} <= set(specs)
    assert catalog.parse_spec("vllm")[0][1] == "0.33.0"


def test_a_ranged_requirement_takes_a_wheel_it_accepts(tmp_path):
    from dsv4bench.kernels.fetch import find_wheel

    for name in (
        "apache_tvm_ffi-0.1.15.post2-cp312-cp312-x.whl",
        "apache_tvm_ffi-0.1.12-cp312-abi3-x.whl",
    ):
        (tmp_path / name).write_bytes(b"")
    assert find_wheel(tmp_path, "apache-tvm-ffi>=0.1.11,<0.1.13").name.startswith(
        "apache_tvm_ffi-0.1.12"
    )
    assert "0.1.15.post2" in find_wheel(tmp_path, "apache-tvm-ffi>=0.1.6,<0.2,!=0.1.8").name
    assert find_wheel(tmp_path, "apache-tvm-ffi==0.1.13") is None


def _tilelang_wheels(folder: Path) -> None:
    _wheel(folder, "tilelang-0.1.15-cp39-abi3-manylinux_2_28_x86_64.whl",
           {"tilelang/__init__.py": b"", "tilelang/lib/libtvm.so": b"tvm"})  # fmt: skip
    extras = {
        "apache_tvm_ffi-0.1.12-cp312-abi3-manylinux_2_28_x86_64.whl": "tvm_ffi",
        "torch_c_dlpack_ext-0.1.5-cp312-cp312-manylinux_2_28_x86_64.whl": "torch_c_dlpack_ext",
        "cloudpickle-3.1.3-py3-none-any.whl": "cloudpickle",
        "ml_dtypes-0.6.0-cp312-cp312-manylinux_2_28_x86_64.whl": "ml_dtypes",
        "psutil-7.2.2-cp36-abi3-manylinux_2_28_x86_64.whl": "psutil",
        "tqdm-4.70.1-py3-none-any.whl": "tqdm",
    }
    for wheel, module in extras.items():
        _wheel(folder, wheel, {f"{module}/__init__.py": b""})
    lib = bytes(range(256)) * 4096  # 1 MiB: big enough to be stored once
    z3 = {
        "z3/__init__.py": b"",
        "z3/lib/libz3.so": lib,
        "z3/lib/libz3.so.4.15": lib,
        "z3_solver-4.15.4.0.data/data/bin/z3": b"an executable pip puts in bin/",
        "z3_solver-4.15.4.0.data/purelib/z3extra.py": b"",
    }
    _wheel(folder, "z3_solver-4.15.4.0-py3-none-manylinux_2_17_x86_64.whl", z3)
    # the sglang wheel holds the q8kv8 build's sources too, which take two more wheels' parts
    from tests.kernels import test_sglang_build as q8kv8

    q8kv8.write_wheels(folder)  # sglang (both kernels), FlashInfer 0.6.18, apache-tvm-ffi


def test_tilelang_is_a_runtime_and_a_deps_build_and_sglang_the_kernel(tmp_path, capsys):
    wheels, root = tmp_path / "wheels", tmp_path / "k"
    wheels.mkdir()
    _tilelang_wheels(wheels)
    args = ("--wheels", str(wheels), "--dir", str(root))
    assert _kernels("fetch", "tilelang", "sglang", *args) == 0
    builds = {b.name: b for b in read_builds(root)}
    assert sorted(builds) == ["q8kv8-sglang-0.5.23", "sglang-ops-0.5.23", "sglang-topk-0.5.23",
                              "sglang-triton-0.5.23", "tilelang-deps-0.1.15",
                              "tilelang-runtime-0.1.15", "tilelang-sglang-0.5.23"]  # fmt: skip
    runtime, deps = builds["tilelang-runtime-0.1.15"], builds["tilelang-deps-0.1.15"]
    assert {f.path for f in runtime.files} == {
        "site/tilelang/__init__.py",
        "site/tilelang/lib/libtvm.so",
    }
    assert len(deps.wheels) == 7 and "site/z3/__init__.py" in {f.path for f in deps.files}
    assert not any(f.path.startswith("site/tilelang/") for f in deps.files)
    kernel = builds["tilelang-sglang-0.5.23"]
    assert [f.path for f in kernel.files] == ["tilelang_kernel.py"] and kernel.library == "tilelang"
    assert builds["q8kv8-sglang-0.5.23"].library == "q8kv8"
    paths = {f.path for f in deps.files}
    assert "site/z3extra.py" in paths and not any(".data/" in p for p in paths)  # as pip lays out
    _kernels("pack", "tilelang-deps-0.1.15", "--dir", str(root), "--out", str(tmp_path / "p"))
    _kernels("unpack", str(tmp_path / "p"), "--dir", str(tmp_path / "there"))
    libs = [
        tmp_path / "there/tilelang-deps-0.1.15/site/z3/lib" / n
        for n in ("libz3.so", "libz3.so.4.15")
    ]
    assert libs[0].stat().st_ino == libs[1].stat().st_ino  # packed once, both names back
    assert libs[1].read_bytes() == bytes(range(256)) * 4096
    capsys.readouterr()
    assert _kernels("list", "--dir", str(root)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sum("(a runtime, no backend)" in line for line in lines) == 2
    assert any("-> backend tilelang-sglang-0.5.23" in line for line in lines)


def test_sglang_is_downloaded_for_its_own_python_and_glibc(tmp_path, monkeypatch):
    import subprocess

    from dsv4bench.kernels import fetch

    commands = []

    def pip(cmd, **kw):
        commands.append(cmd)
        _tilelang_wheels(Path(cmd[cmd.index("-d") + 1]))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(fetch.subprocess, "run", pip)
    fetch.fetch_package(catalog.SGLANG, "0.5.23", tmp_path / "k", say=lambda _: None)
    (cmd,) = commands
    assert cmd[cmd.index("--python-version") + 1] == "3.11"
    assert "manylinux_2_34_x86_64" in cmd and cmd[-1] == "sglang==0.5.23"
