"""What sglang's TileLang kernels need besides their file, found without importing anything:
the TileLang compiler (`tilelang`), its requirements (`z3`, `tvm_ffi`, ...) and the CUDA compiler
it calls on a kernel's first use; then importing TileLang and loading sglang's kernel file.

Where the compiler comes from: the `runtime` option (a `tilelang-runtime-<v>` build folder of the
kernels folder), else an installed `tilelang`, else the kernels folder's newest
`tilelang-runtime-<v>` build. A build's requirements are the sibling `tilelang-deps-<v>` build
(one archive each: together they are more than one GPU call carries; docs/kernel-facts.md,
TileLang). TileLang loads z3's library from wherever `z3` imports (tilelang/__init__.py), so the
two site folders need not be one.

sglang's kernel file (sglang/kernels/ops/attention/dsa/tilelang_kernel.py) imports three flags
from sglang itself (is_hip, is_gfx95_supported, is_fp8_fnuz), whose modules import most of sglang.
The file is loaded as it is, its sglang imports answered by stub modules that hold those three
names with their CUDA values (all False) while it loads: the kernel text runs unchanged (its
sha256 is in the build's build.json), and a later release that imports more from sglang fails
to load with the missing name in the reason instead of running edited code.
"""

from __future__ import annotations

import importlib
import importlib.util
import types
from dataclasses import dataclass
from pathlib import Path

from dsv4bench.backends.base import REASON_CHARS, Unsupported
from dsv4bench.backends.toolchains import pyfiles
from dsv4bench.backends.toolchains.library import on_sys_path
from dsv4bench.backends.toolchains.nvcc import cuda_home_nvcc
from dsv4bench.kernels.store import kernels_dir

REQUIRED = ("tilelang", "z3", "tvm_ffi")  # modules TileLang cannot import without
RUNTIME_PREFIX = "tilelang-runtime-"
DEPS_PREFIX = "tilelang-deps-"
FETCH_HINT = "dsv4bench kernels fetch tilelang, or unpack its runtime and deps archives"
NVCC_HINT = "TileLang compiles each kernel with it: set CUDA_HOME or put nvcc on PATH"
MODULE = "dsv4bench_sglang_tilelang_kernel"  # the name sglang's file is loaded under
# what the kernel file imports from sglang, with the value each has on an NVIDIA GPU
SHIMS = {
    "sglang.kernels.ops.quantization.fp8_kernel": {"is_fp8_fnuz": lambda: False},
    "sglang.srt.utils": {"is_hip": lambda: False, "is_gfx95_supported": lambda: False},
}


@dataclass(frozen=True)
class Runtime:
    """Where TileLang comes from: site folders to put first on sys.path ([]: as installed)."""

    sites: tuple[Path, ...]
    label: str  # the runtime build's name, or "installed"


def find_runtime(runtime: str | None = None, root: Path | None = None) -> Runtime:
    """The `runtime` build folder (and its deps sibling); else the installed tilelang; else the
    kernels folder's newest runtime build; else nothing (Runtime((), "")) to report missing."""
    if runtime:
        return _build_runtime(Path(runtime))
    if importlib.util.find_spec("tilelang") is not None:
        return Runtime((), "installed")
    found = sorted((root or kernels_dir()).glob(f"{RUNTIME_PREFIX}*/site"), reverse=True)
    return _build_runtime(found[0].parent) if found else Runtime((), "")


def _build_runtime(folder: Path) -> Runtime:
    version = folder.name.removeprefix(RUNTIME_PREFIX)
    deps = folder.parent / f"{DEPS_PREFIX}{version}" / "site"
    sites = [folder / "site"] + ([deps] if deps.is_dir() else [])
    return Runtime(tuple(sites), folder.name)


def _module_in(name: str, sites: tuple[Path, ...]) -> bool:
    for site in sites:
        if (site / name / "__init__.py").is_file() or (site / f"{name}.py").is_file():
            return True
    return importlib.util.find_spec(name) is not None


def missing(runtime: Runtime) -> list[str]:
    """What TileLang lacks to compile a kernel, each with where to get it; [] when nothing."""
    gone = [m for m in REQUIRED if not _module_in(m, runtime.sites)]
    out = [f"{', '.join(gone)} ({FETCH_HINT})"] if gone else []
    if cuda_home_nvcc() is None:  # the nvcc TileLang finds
        out.append(f"nvcc ({NVCC_HINT})")
    return out


def import_tilelang(runtime: Runtime):
    """The tilelang module, its runtime's site folders first on sys.path."""
    on_sys_path(*runtime.sites)
    try:
        return importlib.import_module("tilelang")
    except Exception as e:  # a broken install, a library built for another glibc or CUDA
        raise Unsupported(f"cannot import tilelang: {type(e).__name__}: {e}"[:REASON_CHARS]) from e


def load_kernel_file(path: Path) -> types.ModuleType:
    """sglang's kernel file as a module of its own (MODULE), its sglang imports answered by
    stubs (SHIMS) that are gone again once it is loaded."""
    return pyfiles.load_file(MODULE, path, SHIMS)
