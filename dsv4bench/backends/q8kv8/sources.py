"""What building the Q8KV8 kernel needs, found without building it: sglang's kernel sources,
CUTLASS headers, apache-tvm-ffi (headers, libtvm_ffi and its Python loader) and nvcc. Each
missing piece is one line (Unsupported), so `backends`, `plan` and the rows say it.

Where from, in order: the `lib` option or $DSV4BENCH_Q8KV8_LIB (a `kernels fetch` build
folder: csrc/, cutlass/include/, site/tvm_ffi/), else the kernels folder's newest q8kv8 build,
else installed packages (sglang's csrc, FlashInfer's bundled CUTLASS, tvm_ffi)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dsv4bench.backends.base import Unsupported
from dsv4bench.backends.toolchains.library import build_folder, lib_env, package_dir
from dsv4bench.backends.toolchains.nvcc import missing_tvm_ffi, tvm_ffi_includes
from dsv4bench.kernels.catalog import Q8KV8_CSRC

ENV_LIB = lib_env("q8kv8")
KERNEL_FILES = ("entry.cuh", "kernel.cuh", "params.h", "config.h")
CUTLASS_PROBE = "cute/tensor.hpp"
HOW = "dsv4bench kernels fetch sglang==0.5.23 (or --backend-opt q8kv8.lib=BUILD)"


@dataclass(frozen=True)
class Sources:
    """The files a build of the kernel reads; `site` is put on sys.path to import tvm_ffi."""

    label: str  # where they came from: a build name or "installed packages"
    version: str  # sglang's
    csrc: Path
    cutlass: Path  # the include folder (holds cute/ and cutlass/)
    tvm_ffi: Path  # the tvm_ffi package folder (include/, lib/)
    site: Path | None = None
    cache: Path | None = None  # where compiled modules go; None: the user's cache folder

    @property
    def includes(self) -> list[Path]:
        return [self.csrc, self.cutlass, *tvm_ffi_includes(self.tvm_ffi)]


def _check(src: Sources) -> Sources:
    missing = [f"sglang kernel sources ({n})" for n in KERNEL_FILES if not (src.csrc / n).is_file()]
    if not (src.cutlass / CUTLASS_PROBE).is_file():
        missing.append(f"CUTLASS headers ({CUTLASS_PROBE})")
    missing += missing_tvm_ffi(src.tvm_ffi)
    if missing:
        raise Unsupported(f"Q8KV8 {src.label}: no {', '.join(missing)}; {HOW}")
    return src


def from_build(folder: Path) -> Sources:
    """A `kernels fetch` build folder (csrc/, cutlass/include/, site/tvm_ffi/)."""
    if not folder.is_dir():
        raise Unsupported(f"Q8KV8 build not found: no folder {folder}; {HOW}")
    version = folder.name.rsplit("-", 1)[-1]
    return _check(
        Sources(
            label=f"build {folder.name}",
            version=version,
            csrc=folder / "csrc",
            cutlass=folder / "cutlass" / "include",
            tvm_ffi=folder / "site" / "tvm_ffi",
            site=folder / "site",
            cache=folder / "jit",
        )
    )


def from_installed() -> Sources:
    """sglang's sources, FlashInfer's CUTLASS and tvm_ffi as installed (never imported here)."""
    sglang, flashinfer, tvm = (package_dir(n) for n in ("sglang", "flashinfer", "tvm_ffi"))
    missing = [n for n, d in (("sglang", sglang), ("flashinfer-python", flashinfer),
                              ("apache-tvm-ffi", tvm)) if d is None]  # fmt: skip
    if missing:
        raise Unsupported(f"Q8KV8 sources not found: no {', '.join(missing)} installed; {HOW}")
    from importlib import metadata

    return _check(
        Sources(
            label="installed packages",
            version=metadata.version("sglang"),
            csrc=sglang.parent / Q8KV8_CSRC,
            cutlass=flashinfer / "data" / "cutlass" / "include",
            tvm_ffi=tvm,
        )
    )


def discover(lib: str | None = None) -> Sources:
    """`lib` or $DSV4BENCH_Q8KV8_LIB, else the kernels folder's newest build, else installed."""
    return build_folder(lib, ENV_LIB, "q8kv8-*/csrc/entry.cuh", from_build, from_installed)
