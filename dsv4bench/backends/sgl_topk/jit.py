"""Building sglang's top-k modules as sglang 0.5.23's load_jit does: one generated wrapper per
module that includes the kernel source and exports its entry points with
TVM_FFI_DLL_EXPORT_TYPED_FUNC, nvcc with load_jit's defaults (-DSGL_CUDA_ARCH, -std=c++20 -O3
--expt-relaxed-constexpr, the sm_90a target), one cached .so per (sources, wrapper, flags,
nvcc), loaded with tvm_ffi. The cache and lock are the Q8KV8 build's (q8kv8/jit.py).

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

import hashlib
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dsv4bench.backends.base import Unsupported
from dsv4bench.backends.q8kv8.jit import cache_dir as _cache_dir
from dsv4bench.backends.q8kv8.jit import compile_cached, nvcc_version
from dsv4bench.backends.sgl_topk.sources import WHAT, Sources

FFI_HEADERS = ("container/tensor.h", "dtype.h", "error.h", "extra/c_env_api.h", "function.h")
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
        return "\n".join(
            [
                *(f"#include <tvm/ffi/{h}>" for h in FFI_HEADERS),
                f'#include "{self.source}"',
                "namespace sglang {",
                *(f"TVM_FFI_DLL_EXPORT_TYPED_FUNC({n}, ({f}));" for n, f in self.exports),
                "}  // namespace sglang",
                "",
            ]
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
    h = hashlib.sha256()
    files = [src.jit / "csrc" / spec.source, *sorted((src.jit / "include").rglob("*"))]
    for path in files:
        if path.is_file():
            h.update(str(path.relative_to(src.jit)).encode() + path.read_bytes())
    h.update(spec.wrapper().encode())
    h.update(" ".join(cmd[1:]).encode())  # the nvcc path aside: a version says what it is
    h.update(version.encode())
    return h.hexdigest()[:16]


def build(
    src: Sources, spec: ModuleSpec, nvcc: str, capability, run: Callable = subprocess.run
) -> tuple[Path, dict]:
    """The module file (built now, or found in the cache) and what the row records."""
    version = nvcc_version(nvcc, WHAT)
    probe = command(nvcc, src, capability, Path("wrapper.cu"), Path("module.so"))
    stem = f"sgl-{spec.name}-{cache_key(src, spec, probe, version)}"
    return compile_cached(
        _cache_dir(src, "sglang-topk"), stem, spec.wrapper(),
        lambda wrapper, out: command(nvcc, src, capability, wrapper, out),
        f"sglang {spec.name} from {src.label}", version, run,
    )  # fmt: skip


def load(src: Sources, module: Path):
    """The module, through the tvm_ffi beside the headers it was built against."""
    if src.site is not None and str(src.site) not in sys.path:
        sys.path.insert(0, str(src.site))
    try:
        import tvm_ffi
    except Exception as e:  # a broken or absent runtime is a reason, not a crash
        raise Unsupported(f"{WHAT}: cannot import tvm_ffi: {type(e).__name__}: {e}") from e
    return tvm_ffi.load_module(str(module))
