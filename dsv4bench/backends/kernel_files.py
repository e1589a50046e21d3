"""Kernel libraries that travel packed in the checkout's .kernels/ (tools/gpu/pack.sh), unpacked
once into UNPACK_DIR, outside the checkout: an unpacked FA3 build is 146 MiB, more than a GPU
call may carry, so it must never land in .kernels/ itself."""

from __future__ import annotations

import lzma
import os
import shutil
import tarfile
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
