"""The toolchains layer on its own: a build folder chosen (lib, env, newest, fallback), a site
folder found, the wrapper texts the cache keys hash kept as they were, stubs gone after a load,
a failed build remembered per module."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dsv4bench.backends.base import Provider, Unsupported
from dsv4bench.backends.q8kv8 import jit as q8_jit
from dsv4bench.backends.sgl_topk import jit as topk_jit
from dsv4bench.backends.toolchains import library, nvcc, pyfiles
from dsv4bench.backends.toolchains.compiled import Toolchain


def _kernels(tmp_path: Path, monkeypatch, *builds: str) -> Path:
    root = tmp_path / "kernels"
    for name in builds:
        (root / name / "csrc").mkdir(parents=True)
        (root / name / "csrc" / "entry.cuh").write_text("//\n")
    monkeypatch.setenv("DSV4BENCH_KERNELS", str(root))
    return root


def test_build_folder_takes_lib_then_env_then_the_newest_then_the_fallback(tmp_path, monkeypatch):
    root = _kernels(tmp_path, monkeypatch, "k-0.1", "k-0.2")
    monkeypatch.delenv("K_LIB", raising=False)
    find = lambda lib: library.build_folder(  # noqa: E731
        lib, "K_LIB", "k-*/csrc/entry.cuh", lambda p: p, lambda: "installed"
    )
    assert find(None) == root / "k-0.2"
    assert find("/my/build") == Path("/my/build")
    monkeypatch.setenv("K_LIB", "/env/build")
    assert find(None) == Path("/env/build")
    monkeypatch.delenv("K_LIB")
    (root / "k-0.2" / "csrc" / "entry.cuh").unlink()
    (root / "k-0.1" / "csrc" / "entry.cuh").unlink()
    assert find(None) == "installed"


def test_site_folder_of_a_build_and_its_one_line_when_absent(tmp_path, monkeypatch):
    root = _kernels(tmp_path, monkeypatch)
    pkg = root / "fakepkg-1.0" / "site" / "dsv4_fakepkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    assert library.site_folder(None, "dsv4_fakepkg", "fakepkg-*", "Fake") == pkg.parent
    with pytest.raises(Unsupported, match="Fake build not found: no site/dsv4_fakepkg"):
        library.site_folder(str(tmp_path), "dsv4_fakepkg", "fakepkg-*", "Fake")
    assert library.site_folder(None, "pytest", "fakepkg-*", "Fake") is None  # installed


def test_the_wrappers_are_the_text_their_cached_modules_were_keyed_by():
    head = "".join(f"#include <tvm/ffi/{h}>\n" for h in nvcc.FFI_HEADERS)
    q8 = head + '#include "entry.cuh"\nnamespace sglang {\n'
    q8 += "".join(
        f"TVM_FFI_DLL_EXPORT_TYPED_FUNC({k}, ({v}));\n" for k, v in q8_jit.ENTRIES.items()
    )
    assert q8 + "}\n" == q8_jit.WRAPPER
    assert topk_jit.topk_v2().wrapper().endswith("}  // namespace sglang\n")


def test_stubs_answer_imports_while_a_file_loads_and_are_gone_after(tmp_path):
    path = tmp_path / "kernel.py"
    path.write_text("from engine_x.utils import is_hip\nFLAG = is_hip()\n")
    module = pyfiles.load_file("dsv4_test_kernel", path, {"engine_x.utils": {"is_hip": lambda: 7}})
    assert module.FLAG == 7 and "engine_x" not in sys.modules
    path.write_text("from engine_x.more import thing\n")
    with pytest.raises(Unsupported, match="imports more of engine_x than this backend stubs"):
        pyfiles.load_file("dsv4_test_kernel2", path, {}, engine="engine_x")
    with pytest.raises(Unsupported, match="cannot load Engine X's kernel.py: .* more of Engine X"):
        pyfiles.load_file("dsv4_test_kernel3", path, {}, engine="engine_x", label="Engine X")
    sys.modules.pop("dsv4_test_kernel", None)


def test_a_failed_build_is_remembered_per_module(monkeypatch, tmp_path):
    import torch

    calls = []

    def build(src, compiler, capability, spec):
        calls.append(spec.name)
        raise nvcc.CompileError(f"nvcc failed building {spec.name}")

    monkeypatch.setenv(nvcc.ENV_NVCC, sys.executable)  # any program: never run here
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    chain = Toolchain("Fake", lambda: "src", lambda s: Provider("fake"), build, lambda s, p: p)
    spec = type("Spec", (), {"name": "a"})()
    for _ in range(2):
        with pytest.raises(nvcc.CompileError, match="building a"):
            chain.module("cuda", spec)
    assert calls == ["a"] and chain.reason() is None and chain.info(spec) == {}
