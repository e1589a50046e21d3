"""Building sglang's Q8KV8 kernel: a wrapper exporting its three entry points through tvm-ffi,
nvcc with sglang's flags, one cached .so per (sources, flags, nvcc), loaded with tvm_ffi.

sglang 0.5.23 builds it the same way (sglang/kernels/ops/attention/
sparse_mla_q8kv8_prefill_sm90.py: load_jit with cuda_wrappers dispatch, dispatch_full,
dispatch_topk_length, _q8kv8_cuda_flags and its JIT defaults -std=c++20 -O3
--expt-relaxed-constexpr). A build takes about 90 s (docs/kernel-facts.md, Q8KV8): the
first worker pays it; the others wait on a lock file and load the same file, and a module is
renamed into place whole, so no worker ever loads half a file."""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from dsv4bench.backends.base import Unsupported
from dsv4bench.backends.q8kv8.sources import Sources

ENTRIES = {  # the module's names -> entry.cuh's functions
    "dispatch": "sparse_prefill_q8kv8_dispatch",
    "dispatch_full": "sparse_prefill_q8kv8_dispatch_full",
    "dispatch_topk_length": "sparse_prefill_q8kv8_dispatch_topk_length",
}
HEADERS = ("container/tensor.h", "dtype.h", "error.h", "extra/c_env_api.h", "function.h")
WRAPPER = "\n".join(
    [
        *(f"#include <tvm/ffi/{h}>" for h in HEADERS),
        '#include "entry.cuh"',
        "namespace sglang {",
        *(f"TVM_FFI_DLL_EXPORT_TYPED_FUNC({k}, ({v}));" for k, v in ENTRIES.items()),
        "}",
        "",
    ]
)
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
TAIL_LINES = 12  # of nvcc's output, in a failed build's row


class CompileError(RuntimeError):
    """nvcc failed: the row is an error row with nvcc's last lines."""


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


def nvcc_version(nvcc: str, what: str = "Q8KV8") -> str:
    done = subprocess.run([nvcc, "--version"], capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        raise Unsupported(f"{what}: {nvcc} --version failed (rc {done.returncode})")
    return lines[-1]


def cache_key(src: Sources, cmd: list[str], version: str) -> str:
    """Sources, wrapper, command line and nvcc's version: a change to any builds anew."""
    h = hashlib.sha256()
    for path in sorted(src.csrc.iterdir()):
        if path.is_file():
            h.update(path.name.encode() + path.read_bytes())
    h.update(WRAPPER.encode())
    h.update(" ".join(cmd[1:]).encode())  # the nvcc path aside: a version says what it is
    h.update(version.encode())
    return h.hexdigest()[:16]


def cache_dir(src, name: str = "q8kv8") -> Path:
    """The build's jit/ folder (src.cache) when writable, else the user's cache folder."""
    if src.cache is not None:
        try:
            src.cache.mkdir(parents=True, exist_ok=True)
            if os.access(src.cache, os.W_OK):
                return src.cache
        except OSError:
            pass
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    folder = base / "dsv4bench" / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def build(src: Sources, nvcc: str, capability, run: Callable = subprocess.run) -> tuple[Path, dict]:
    """The module file (built now, or found in the cache) and what the row records."""
    probe = command(nvcc, src, capability, Path("wrapper.cu"), Path("q8kv8.so"))
    version = nvcc_version(nvcc)
    return compile_cached(
        cache_dir(src), f"q8kv8-{cache_key(src, probe, version)}", WRAPPER,
        lambda wrapper, out: command(nvcc, src, capability, wrapper, out),
        f"Q8KV8 from {src.label}", version, run,
    )  # fmt: skip


def compile_cached(
    folder: Path,
    stem: str,
    wrapper_text: str,
    make_command: Callable[[Path, Path], list[str]],
    what: str,
    version: str,
    run: Callable = subprocess.run,
) -> tuple[Path, dict]:
    """folder/stem.so, built by make_command(wrapper, out) unless already there; the build
    info a row records (module, nvcc, built_s: 0 when cached)."""
    module = folder / f"{stem}.so"
    info = {"module": str(module), "nvcc": version, "built_s": 0.0}
    with open(folder / f"{stem}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder; the others wait, then find the file
        if module.is_file():
            return module, info
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            wrapper = Path(tmp) / "wrapper.cu"
            wrapper.write_text(wrapper_text)
            partial = Path(tmp) / "module.so"
            start = time.perf_counter()
            done = run(make_command(wrapper, partial), capture_output=True, text=True)
            info["built_s"] = round(time.perf_counter() - start, 1)
            if done.returncode or not partial.is_file():
                tail = (done.stdout + done.stderr).strip().splitlines()[-TAIL_LINES:]
                raise CompileError(
                    f"nvcc failed (rc {done.returncode}) building {what}: " + " | ".join(tail)
                )
            os.replace(partial, module)
    return module, info


def load(src: Sources, module: Path):
    """The module's three entry points, through the tvm_ffi beside the headers it was built
    against."""
    if src.site is not None and str(src.site) not in sys.path:
        sys.path.insert(0, str(src.site))
    try:
        import tvm_ffi
    except Exception as e:  # a broken or absent runtime is a reason, not a crash
        raise Unsupported(f"Q8KV8: cannot import tvm_ffi: {type(e).__name__}: {e}") from e
    return tvm_ffi.load_module(str(module))
