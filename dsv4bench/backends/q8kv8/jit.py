"""Building sglang's Q8KV8 kernel: a wrapper exporting its three entry points through tvm-ffi,
nvcc with sglang's flags, one cached .so per (sources, flags, nvcc), loaded with tvm_ffi
(compiling, caching and loading: toolchains/nvcc.py; found and built once: compiled.py).

sglang 0.5.23 builds it the same way (sglang/kernels/ops/attention/
sparse_mla_q8kv8_prefill_sm90.py: load_jit with cuda_wrappers dispatch, dispatch_full,
dispatch_topk_length, _q8kv8_cuda_flags and its JIT defaults -std=c++20 -O3
--expt-relaxed-constexpr). A build takes about 90 s (docs/kernel-facts.md, Q8KV8)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

from dsv4bench.backends.base import Provider, Unsupported
from dsv4bench.backends.q8kv8 import sources
from dsv4bench.backends.q8kv8.sources import Sources
from dsv4bench.backends.toolchains import nvcc as toolchain_nvcc
from dsv4bench.backends.toolchains.compiled import Toolchain

WHAT = "Q8KV8"
ENTRIES = {  # the module's names -> entry.cuh's functions
    "dispatch": "sparse_prefill_q8kv8_dispatch",
    "dispatch_full": "sparse_prefill_q8kv8_dispatch_full",
    "dispatch_topk_length": "sparse_prefill_q8kv8_dispatch_topk_length",
}
WRAPPER = toolchain_nvcc.ffi_wrapper("entry.cuh", ENTRIES.items(), "sglang")
FLAGS = (
    "-std=c++20",
    "-O3",
    "--expt-relaxed-constexpr",
    "-DNDEBUG",
    "-DCUTE_USE_PACKED_TUPLE=1",
    "-DCUTLASS_ENABLE_TENSOR_CORE_MMA=1",
    "--use_fast_math",
    "-shared",
    "-Xcompiler",
    "-fPIC",
)


def gencode(capability: tuple[int, int]) -> list[str]:
    """The kernel is sm_90a code (wgmma, setmaxnreg): Hopper only."""
    if tuple(capability) != (9, 0):
        major, minor = capability
        raise Unsupported(f"the Q8KV8 kernel is sm_90a code; this device is sm_{major}{minor}")
    return ["-gencode", "arch=compute_90a,code=sm_90a"]


def command(nvcc: str, src: Sources, capability, wrapper: Path, out: Path) -> list[str]:
    lib = src.tvm_ffi / "lib"
    includes = [a for path in src.includes for a in ("-I", str(path))]
    # no rpath, as the recipe verified on an H100: importing tvm_ffi loads libtvm_ffi first
    return [nvcc, *gencode(capability), *FLAGS, *includes, str(wrapper), "-o", str(out),
            "-L", str(lib), "-ltvm_ffi"]  # fmt: skip


def cache_key(src: Sources, cmd: list[str], version: str) -> str:
    """Sources, wrapper, command line and nvcc's version: a change to any builds anew."""
    files = [(p.name, p) for p in sorted(src.csrc.iterdir())]
    return toolchain_nvcc.cache_key(files, WRAPPER, cmd, version)


def build(src: Sources, nvcc: str, capability, run: Callable = subprocess.run) -> tuple[Path, dict]:
    """The module file (built now, or found in the cache) and what the row records."""
    probe = command(nvcc, src, capability, Path("wrapper.cu"), Path("q8kv8.so"))
    version = toolchain_nvcc.nvcc_version(nvcc, WHAT)
    return toolchain_nvcc.compile_cached(
        toolchain_nvcc.cache_dir(src.cache, "q8kv8"), f"q8kv8-{cache_key(src, probe, version)}",
        WRAPPER,
        lambda wrapper, out: command(nvcc, src, capability, wrapper, out),
        f"Q8KV8 from {src.label}", version, run,
    )  # fmt: skip


def describe(src: Sources) -> Provider:
    return Provider("sglang q8kv8 (JIT)", f"sglang {src.version}", f"{src.label}: {src.csrc}")


def toolchain(lib: str | None) -> Toolchain:
    """The kernel's sources (`lib`: a build folder) and nvcc found once, its module built once."""
    return Toolchain(
        WHAT,
        lambda: sources.discover(lib),
        describe,
        lambda src, nvcc, capability, spec: build(src, nvcc, capability),
        lambda src, module: toolchain_nvcc.load(module, src.site, WHAT),
    )
