"""A kernel built by nvcc from sources through tvm-ffi: nvcc found, cache key, lock, build once,
load. What a family declares (its wrapper text, flags, includes) stays in the family; how any
such module is compiled, cached and loaded is here.

Public names (each documented below):
  find_nvcc          the suite's nvcc ($DSV4BENCH_NVCC, PATH, $CUDA_HOME/bin), or Unsupported
  cuda_home_nvcc     the nvcc a compiler that looks in $CUDA_HOME first (TileLang) would find
  nvcc_version       nvcc's version line, part of every cache key
  missing_tvm_ffi    what a tvm_ffi package folder lacks for a build against it
  ffi_wrapper        a wrapper source exporting C++ functions through tvm-ffi
  cache_key          a hash of files, wrapper, command line and nvcc version
  cache_dir          where built modules go (the build's own folder if writable)
  compile_cached     folder/stem.so built once under one lock (CompileError: nvcc's tail)
  load               a built module, through the tvm_ffi of the build's site folder

A build takes long (about 90 s for Q8KV8: docs/kernel-facts.md): the first worker pays it; the
others wait on a lock file and load the same file, and a module is renamed into place whole, so
no worker ever loads half a file."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from importlib import metadata
from pathlib import Path

from dsv4bench.backends.base import Unsupported
from dsv4bench.backends.toolchains.library import on_sys_path

ENV_NVCC = "DSV4BENCH_NVCC"
TAIL_LINES = 12  # of nvcc's output, in a failed build's row
FFI_HEADERS = ("container/tensor.h", "dtype.h", "error.h", "extra/c_env_api.h", "function.h")


class CompileError(RuntimeError):
    """nvcc failed: the row is an error row with nvcc's last lines."""


def find_nvcc(what: str) -> str:
    """$DSV4BENCH_NVCC, nvcc on PATH, $CUDA_HOME/bin/nvcc or /usr/local/cuda/bin/nvcc;
    Unsupported naming `what` needs it when there is none."""
    explicit = os.environ.get(ENV_NVCC)
    if explicit:
        if not (Path(explicit).is_file() and os.access(explicit, os.X_OK)):
            raise Unsupported(f"{what} is built by nvcc: ${ENV_NVCC}={explicit} is no program")
        return explicit
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    for candidate in (shutil.which("nvcc"), str(Path(cuda_home) / "bin" / "nvcc")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise Unsupported(
        f"{what} is built on first use by nvcc: no nvcc on PATH or in {cuda_home}/bin "
        f"(install the CUDA toolkit, or set ${ENV_NVCC})"
    )


def cuda_home_nvcc() -> str | None:
    """The nvcc a compiler that searches as TileLang does finds (tilelang/env.py
    _find_cuda_home): $CUDA_HOME or $CUDA_PATH, else nvcc on PATH, else the nvidia-cuda-nvcc
    wheel's, else /usr/local/cuda's; None if none."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home:
        nvcc = Path(home) / "bin" / "nvcc"
        return str(nvcc) if nvcc.is_file() else None
    on_path = shutil.which("nvcc")
    if on_path:
        return on_path
    try:
        files = metadata.files("nvidia-cuda-nvcc") or []
    except metadata.PackageNotFoundError:
        files = []
    for file in files:
        if file.name == "nvcc":
            return str(file.locate())
    default = Path("/usr/local/cuda/bin/nvcc")
    return str(default) if default.is_file() else None


def nvcc_version(nvcc: str, what: str) -> str:
    """nvcc's last `--version` line ("Build cuda_12.8..."); Unsupported if it fails."""
    done = subprocess.run([nvcc, "--version"], capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        raise Unsupported(f"{what}: {nvcc} --version failed (rc {done.returncode})")
    return lines[-1]


def missing_tvm_ffi(root: Path) -> list[str]:
    """What an nvcc build against tvm-ffi needs and `root` (a tvm_ffi package) lacks."""
    missing = []
    if not (root / "include" / "tvm" / "ffi" / "function.h").is_file():
        missing.append("tvm-ffi headers (include/tvm/ffi/function.h)")
    if not any((root / "lib").glob("libtvm_ffi.*")):
        missing.append("libtvm_ffi (tvm_ffi/lib)")
    return missing


def tvm_ffi_includes(tvm_ffi: Path) -> list[Path]:
    """The include folders of a tvm_ffi package folder (its headers and dlpack's)."""
    return [tvm_ffi / "include", tvm_ffi / "3rdparty" / "dlpack" / "include"]


def ffi_wrapper(
    source: str, exports: Iterable[tuple[str, str]], namespace: str, close: str = "}"
) -> str:
    """A wrapper source that includes `source` and exports each (name, C++ function) with
    TVM_FFI_DLL_EXPORT_TYPED_FUNC inside `namespace`, closed by the line `close` (the text is
    part of the cache key: a family keeps the closing line its modules were built with)."""
    return "\n".join(
        [
            *(f"#include <tvm/ffi/{h}>" for h in FFI_HEADERS),
            f'#include "{source}"',
            f"namespace {namespace} {{",
            *(f"TVM_FFI_DLL_EXPORT_TYPED_FUNC({n}, ({f}));" for n, f in exports),
            close,
            "",
        ]
    )


def cache_key(files: Iterable[tuple[str, Path]], wrapper: str, cmd: list[str], version: str) -> str:
    """The (name, file) pairs' names and bytes, the wrapper, the command line (nvcc's path
    aside: a version says what it is) and nvcc's version: a change to any builds anew."""
    h = hashlib.sha256()
    for name, path in files:
        if path.is_file():
            h.update(name.encode() + path.read_bytes())
    h.update(wrapper.encode())
    h.update(" ".join(cmd[1:]).encode())
    h.update(version.encode())
    return h.hexdigest()[:16]


def cache_dir(preferred: Path | None, name: str) -> Path:
    """`preferred` (a build's jit/ folder) when writable, else the user's cache folder
    ($XDG_CACHE_HOME or ~/.cache)/dsv4bench/<name>."""
    if preferred is not None:
        try:
            preferred.mkdir(parents=True, exist_ok=True)
            if os.access(preferred, os.W_OK):
                return preferred
        except OSError:
            pass
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    folder = base / "dsv4bench" / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder


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


def load(module: Path, site: Path | None, what: str):
    """The built module, through the tvm_ffi in `site` (the build's site folder, put first on
    sys.path; None: the installed one) beside the headers it was built against."""
    on_sys_path(site)
    try:
        import tvm_ffi
    except Exception as e:  # a broken or absent runtime is a reason, not a crash
        raise Unsupported(f"{what}: cannot import tvm_ffi: {type(e).__name__}: {e}") from e
    return tvm_ffi.load_module(str(module))
