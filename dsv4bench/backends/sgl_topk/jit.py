"""Building sglang's top-k modules as sglang 0.5.23's load_jit does: one generated wrapper per
module that includes the kernel source and exports its entry points with
TVM_FFI_DLL_EXPORT_TYPED_FUNC, nvcc with load_jit's defaults (-DSGL_CUDA_ARCH, -std=c++20 -O3
--expt-relaxed-constexpr, the sm_90a target), one cached .so per (sources, wrapper, flags,
nvcc), loaded with tvm_ffi (compiling, caching and loading: toolchains/nvcc.py).

Modules (only the wrappers this backend calls):
  fast_topk_<k>  sglang/kernels/ops/attention/fast_topk.py _jit_fast_topk_module:
                 FastTopKKernel<k, use_pdl>::run; k is a template argument (512 or 2048)
  topk_v2        sglang/kernels/ops/attention/dsv4/topk.py _jit_topk_v2_module:
                 TopKKernel<use_pdl>::transform_paged, ::transform_ragged, ::plan (its kpool
                 entries left out). sglang passes -DSGL_TOPK_V2_MAX_C8_OCC2 and _C16_OCC1 from
                 an occupancy probe of the device; without them the header's Hopper defaults
                 hold (30 persistent clusters of 8, no 16-wide clusters).
use_pdl is is_arch_support_pdl(): true from sm90 on."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dsv4bench.backends.base import Provider, Unsupported
from dsv4bench.backends.sgl_topk import sources
from dsv4bench.backends.sgl_topk.sources import WHAT, Sources
from dsv4bench.backends.toolchains import nvcc as toolchain_nvcc
from dsv4bench.backends.toolchains.compiled import Toolchain

FLAGS = (
    "-std=c++20",
    "-O3",
    "--expt-relaxed-constexpr",
    "-shared",
    "-Xcompiler",
    "-fPIC",
)
FAST_TOPK_K = (512, 2048)  # fast_topk.py _FAST_TOPK_SUPPORTED_K
USE_PDL = "true"


@dataclass(frozen=True)
class ModuleSpec:
    name: str
    source: str  # under csrc/
    exports: tuple[tuple[str, str], ...]  # (name Python calls, C++ function)

    def wrapper(self) -> str:
        return toolchain_nvcc.ffi_wrapper(
            self.source, self.exports, "sglang", close="}  // namespace sglang"
        )


def fast_topk(k: int) -> ModuleSpec:
    if k not in FAST_TOPK_K:
        raise Unsupported(f"sglang fast_topk takes k {' or '.join(map(str, FAST_TOPK_K))}, not {k}")
    kernel = f"FastTopKKernel<{k}, {USE_PDL}>::run"
    return ModuleSpec(f"fast_topk_{k}", "elementwise/fast_topk.cuh", (("fast_topk", kernel),))


def topk_v2() -> ModuleSpec:
    kernel = f"TopKKernel<{USE_PDL}>"
    exports = tuple(
        (f"topk_{entry}", f"{kernel}::{entry}")
        for entry in ("transform_paged", "transform_ragged", "plan")
    )
    return ModuleSpec("topk_v2", "deepseek_v4/topk_v2.cuh", exports)


def arch_flags(capability: tuple[int, int]) -> list[str]:
    """The sm_90a target and the SGL_CUDA_ARCH sglang's headers require (load_jit injects it)."""
    if tuple(capability) != (9, 0):
        major, minor = capability
        raise Unsupported(f"{WHAT} is built here for sm_90a; this device is sm_{major}{minor}")
    return ["-gencode=arch=compute_90a,code=sm_90a", "-DSGL_CUDA_ARCH=900"]


def command(nvcc: str, src: Sources, capability, wrapper: Path, out: Path) -> list[str]:
    includes = [a for path in src.includes for a in ("-I", str(path))]
    return [nvcc, *arch_flags(capability), *FLAGS, *includes, str(wrapper), "-o", str(out),
            "-L", str(src.tvm_ffi / "lib"), "-ltvm_ffi"]  # fmt: skip


def cache_key(src: Sources, spec: ModuleSpec, cmd: list[str], version: str) -> str:
    """The kernel source, every sgl_kernel header, the wrapper, the command line and nvcc's
    version: a change to any builds anew."""
    files = [src.jit / "csrc" / spec.source, *sorted((src.jit / "include").rglob("*"))]
    named = [(str(p.relative_to(src.jit)), p) for p in files]
    return toolchain_nvcc.cache_key(named, spec.wrapper(), cmd, version)


def build(
    src: Sources, spec: ModuleSpec, nvcc: str, capability, run: Callable = subprocess.run
) -> tuple[Path, dict]:
    """The module file (built now, or found in the cache) and what the row records."""
    version = toolchain_nvcc.nvcc_version(nvcc, WHAT)
    probe = command(nvcc, src, capability, Path("wrapper.cu"), Path("module.so"))
    stem = f"sgl-{spec.name}-{cache_key(src, spec, probe, version)}"
    return toolchain_nvcc.compile_cached(
        toolchain_nvcc.cache_dir(src.cache, "sglang-topk"), stem, spec.wrapper(),
        lambda wrapper, out: command(nvcc, src, capability, wrapper, out),
        f"sglang {spec.name} from {src.label}", version, run,
    )  # fmt: skip


def describe(src: Sources) -> Provider:
    return Provider("sglang top-k (JIT)", f"sglang {src.version}", f"{src.label}: {src.jit}")


def toolchain(lib: str | None) -> Toolchain:
    """The sources (`lib`: a build folder) and nvcc found once, each ModuleSpec built once."""
    return Toolchain(
        WHAT,
        lambda: sources.discover(lib),
        describe,
        lambda src, nvcc, capability, spec: build(src, spec, nvcc, capability),
        lambda src, module: toolchain_nvcc.load(module, src.site, WHAT),
    )
