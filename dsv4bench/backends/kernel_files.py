"""Kernel libraries that travel packed in the checkout's .kernels/ (tools/gpu/pack.sh), unpacked
once into UNPACK_DIR, outside the checkout: an unpacked FA3 build is 146 MiB, more than a GPU
call may carry, so it must never land in .kernels/ itself."""

from __future__ import annotations

import importlib.util
import lzma
import os
import shutil
import tarfile
from importlib import metadata
from pathlib import Path

UNPACK_DIR = Path(os.environ.get("DSV4BENCH_UNPACK_DIR", "/tmp/dsv4-kernels"))


def unpack_xz(path: Path) -> Path:
    """UNPACK_DIR/<folder>/X from .kernels/<folder>/X.xz (once; as tools/gpu/setup.sh does)."""
    so = UNPACK_DIR / path.parent.name / path.with_suffix("").name
    if not so.is_file():
        so.parent.mkdir(parents=True, exist_ok=True)
        tmp = so.with_suffix(".partial")
        with lzma.open(path) as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst)
        tmp.replace(so)
    return so


def unpack_tar(path: Path, marker: str) -> Path:
    """UNPACK_DIR/<name> holding the tarball's contents (once; `marker` is a file it holds)."""
    dest = UNPACK_DIR / path.name.removesuffix(".tar.xz")
    if not (dest / marker).is_file():
        tmp = dest.with_name(dest.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        with tarfile.open(path) as tar:
            tar.extractall(tmp, filter="data")
        shutil.rmtree(dest, ignore_errors=True)
        tmp.replace(dest)
    return dest


def dist_version(dist: str) -> str:
    """An installed distribution's version, or "unknown"."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


def vllm_op_library(subdir: str, pattern: str) -> Path | None:
    """An installed vLLM's op library `vllm/SUBDIR/PATTERN`, loaded into torch.ops without
    importing vllm (that would pull in the whole engine); None if no vLLM is installed."""
    import torch

    from dsv4bench.backends.base import Unsupported

    spec = importlib.util.find_spec("vllm")
    if spec is None:
        return None
    libs = [p for d in spec.submodule_search_locations or [] for p in Path(d, subdir).glob(pattern)]
    if not libs:
        what = f"{subdir}/{pattern}" if subdir else pattern
        raise Unsupported(f"vllm {dist_version('vllm')} ships no {what.removesuffix('*.so')}")
    torch.ops.load_library(str(libs[0]))
    return libs[0]
