"""What building sglang's top-k kernels needs, found without building them: the two kernel
sources, sglang's header-only sgl_kernel library, apache-tvm-ffi (headers, libtvm_ffi and its
Python loader) and nvcc. Each missing piece is one line (Unsupported), so `backends`, `plan`
and the rows say it.

Where from, in order: the `lib` option or $DSV4BENCH_SGLANG_TOPK_LIB (a `kernels fetch` build
folder: csrc/, include/, site/tvm_ffi/), else the kernels folder's newest sglang-topk build, else
installed packages (sglang's kernels/jit folder, tvm_ffi)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dsv4bench.backends.base import Unsupported
from dsv4bench.backends.toolchains.library import build_folder, lib_env, package_dir
from dsv4bench.backends.toolchains.nvcc import missing_tvm_ffi, tvm_ffi_includes
from dsv4bench.kernels.catalog import SGL_TOPK_JIT, SGL_TOPK_SOURCES

ENV_LIB = lib_env("sglang-topk")
HEADER_PROBE = "include/sgl_kernel/deepseek_v4/topk_impl.cuh"
HOW = "dsv4bench kernels fetch sglang==0.5.23 (or --backend-opt sglang-topk.lib=BUILD)"
WHAT = "sglang's top-k"


@dataclass(frozen=True)
class Sources:
    """The files a build reads; `site` is put on sys.path to import tvm_ffi."""

    label: str  # where they came from: a build name or "installed packages"
    version: str  # sglang's
    jit: Path  # holds csrc/ and include/ (sglang's kernels/jit folder)
    tvm_ffi: Path  # the tvm_ffi package folder (include/, lib/)
    site: Path | None = None
    cache: Path | None = None  # where compiled modules go; None: the user's cache folder

    @property
    def includes(self) -> list[Path]:
        return [self.jit / "csrc", self.jit / "include", *tvm_ffi_includes(self.tvm_ffi)]


def _check(src: Sources) -> Sources:
    wanted = (*SGL_TOPK_SOURCES, HEADER_PROBE)
    missing = [f"sglang kernel sources ({n})" for n in wanted if not (src.jit / n).is_file()]
    missing += missing_tvm_ffi(src.tvm_ffi)
    if missing:
        raise Unsupported(f"{WHAT} {src.label}: no {', '.join(missing)}; {HOW}")
    return src


def from_build(folder: Path) -> Sources:
    """A `kernels fetch` build folder (csrc/, include/, site/tvm_ffi/)."""
    if not folder.is_dir():
        raise Unsupported(f"{WHAT} build not found: no folder {folder}; {HOW}")
    return _check(
        Sources(
            label=f"build {folder.name}",
            version=folder.name.rsplit("-", 1)[-1],
            jit=folder,
            tvm_ffi=folder / "site" / "tvm_ffi",
            site=folder / "site",
            cache=folder / "jit",
        )
    )


def from_installed() -> Sources:
    """sglang's kernels/jit folder and tvm_ffi as installed (never imported here)."""
    sglang, tvm = package_dir("sglang"), package_dir("tvm_ffi")
    missing = [n for n, d in (("sglang", sglang), ("apache-tvm-ffi", tvm)) if d is None]
    if missing:
        raise Unsupported(f"{WHAT} sources not found: no {', '.join(missing)} installed; {HOW}")
    from importlib import metadata

    return _check(
        Sources(
            label="installed packages",
            version=metadata.version("sglang"),
            jit=sglang.parent / SGL_TOPK_JIT,
            tvm_ffi=tvm,
        )
    )


def discover(lib: str | None = None) -> Sources:
    """`lib` or $DSV4BENCH_SGLANG_TOPK_LIB, else the newest build there, else installed."""
    pattern = f"sglang-topk-*/{SGL_TOPK_SOURCES[0]}"
    return build_folder(lib, ENV_LIB, pattern, from_build, from_installed)
