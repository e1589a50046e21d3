"""The one discovery chain for kernels that come as libraries (FlashMLA, FA3, DeepGEMM, and
every later library backend): where a build can come from, in which order, and what a row
says about the one found.

Sources (SOURCES), in the order `discover` tries them:
  file     a library file named by the backend's `lib` option or its environment variable: an
           explicit choice, so it wins, and its failure is the answer (no fallback)
  package  an installed Python package (flash_mla, sgl_kernel, deep_gemm)
  engine   an engine package's bundled ops (vLLM's _flashmla_C, vllm_flash_attn,
           vllm.third_party.deep_gemm), loaded without importing the engine where possible
  kernels  the checkout's kernels folder (.kernels/<build>/...): the lexically last build;
           packed files (.xz, .tar.xz of an older packing) are unpacked once into
           UNPACK_DIR, outside the checkout (an unpacked FA3 build is 146 MiB, more than a GPU
           call may carry, so it must never land in .kernels/ itself)
A package or engine source that is installed but fails is a problem named in the final
not-found reason, and the chain goes on (a LibrarySpec with `strict` stops there instead).

A backend describes its library once, as a LibrarySpec (its sources and how each loads), and
its ops come from `discover(spec, lib)`; the Provider its loader returns is what
`dsv4bench backends` prints and every row records. `find_builds(spec)` lists every build the
sources hold, in the chain's order of preference (newest first within the kernels folder), and
`load_build(spec, build)` loads one of them: what instances that pin one build each (several
builds of one library side by side) use instead of `discover`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import lzma
import os
import shutil
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from dsv4bench.backends.base import Provider, Unsupported
from dsv4bench.kernels.store import kernels_dir

SOURCES = ("file", "package", "engine", "kernels")
CHECKOUT = Path(__file__).resolve().parents[2]  # its .kernels/ is the kernels folder
UNPACK_DIR = Path(os.environ.get("DSV4BENCH_UNPACK_DIR", "/tmp/dsv4-kernels"))
PROBLEM_CHARS = 200  # one source's failure, within the not-found reason
REASON_CHARS = 300  # a load failure's one-line reason


class Absent(Exception):
    """A source holds no build; the message (if any) joins the not-found reason."""


@dataclass(frozen=True)
class Build:
    """One build of a library that a source holds (located, not loaded)."""

    source: str  # one of SOURCES
    label: str  # the source's name in reasons: "vllm", "sgl-kernel", a folder name
    path: str  # the package's or the library file's location
    version: str = ""


@dataclass(frozen=True)
class Source:
    """One place a library can come from. `locate()` lists the builds there, preferred first
    ([] or Absent: none; any other exception: installed but unusable); `load(build)` returns
    the backend's ops for one of them (with their Provider) or raises."""

    kind: str  # one of SOURCES
    label: str
    locate: Callable[[], list[Build]]
    load: Callable[[Build], Any]


@dataclass(frozen=True)
class LibrarySpec:
    """A library as the chain searches it.

    sources: the package and engine sources, in order. load_file: the ops from a library file
    or folder (the `file` source, and the kernels folder's builds unless `kernels` says
    otherwise). env_var: names a library file when the `lib` option does not. kernels: globs
    under the checkout's kernels folder, the first that matches wins (e.g. a plain .so before
    its packed .so.xz). strict: an installed source that fails ends the search."""

    name: str
    not_found: str
    sources: tuple[Source, ...] = ()
    load_file: Callable[[str], Any] | None = None
    env_var: str = ""
    kernels: tuple[str, ...] = ()
    load_kernels: Callable[[Build], Any] | None = None
    strict: bool = False


def discover(spec: LibrarySpec, lib: str | None = None) -> Any:
    """The ops of the first build the chain finds: `lib` (or $env_var), else the first package
    or engine source that loads, else the kernels folder; Unsupported naming what failed."""
    explicit = lib or (os.environ.get(spec.env_var) if spec.env_var else None)
    if explicit and spec.load_file is not None:
        return spec.load_file(explicit)
    problems = []
    for source in spec.sources:
        try:
            builds = source.locate()
            if builds:
                return source.load(builds[0])
        except Absent as e:
            problems += [str(e)] if str(e) else []
        except Exception as e:  # installed but unusable: say why, try the next
            if spec.strict:
                raise Unsupported(f"{spec.not_found}: {_why(e)}"[:REASON_CHARS]) from e
            problems.append(f"{source.label}: {_why(e)}"[:PROBLEM_CHARS])
    builds = kernel_builds(spec)
    if builds:
        return _load_kernels(spec, builds[0])
    raise Unsupported(spec.not_found + (f" ({'; '.join(problems)})" if problems else ""))


def find_builds(spec: LibrarySpec, root: Path | None = None) -> list[Build]:
    """Every build the sources hold, in the chain's order: the file $env_var names, then each
    package and engine source's, then the kernels folder's (newest first). A source that
    fails to locate is left out (loading it says why)."""
    found = []
    named = os.environ.get(spec.env_var) if spec.env_var else None
    if named:
        found.append(Build("file", spec.env_var, named))
    for source in spec.sources:
        try:
            found += source.locate()
        except Exception:  # absent or unusable: discover() says why
            continue
    return found + kernel_builds(spec, root)


def load_build(spec: LibrarySpec, build: Build) -> Any:
    """The ops of one build of find_builds(spec): what an instance pinned to a build (one
    engine's copy, one folder of the kernels folder) loads instead of searching."""
    if build.source == "file" and spec.load_file is not None:
        return spec.load_file(build.path)
    if build.source == "kernels":
        return _load_kernels(spec, build)
    for source in spec.sources:
        if source.label == build.label:
            return source.load(build)
    raise Unsupported(f"{spec.name}: no source {build.label!r} (a build of another library?)")


def kernel_builds(spec: LibrarySpec, root: Path | None = None) -> list[Build]:
    """The kernels folder's builds of the first of spec.kernels' globs that matches, newest
    (lexically last) first; their label is the build's folder (or packed file) name."""
    folder = kernels_dir(root or CHECKOUT)
    for pattern in spec.kernels:
        found = sorted(folder.glob(pattern.removeprefix(".kernels/")), reverse=True)
        if found:
            return [Build("kernels", _build_name(p), str(p), _build_name(p)) for p in found]
    return []


def _build_name(path: Path) -> str:
    """`flashmla-vllm-0.26.0` of .kernels/flashmla-vllm-0.26.0/x.so or of x-0.26.0.tar.xz."""
    name = path.name.removesuffix(".tar.xz")
    return name if name != path.name else path.parent.name


def _load_kernels(spec: LibrarySpec, build: Build) -> Any:
    if spec.load_kernels is not None:
        return spec.load_kernels(build)
    if spec.load_file is None:
        raise Unsupported(f"{spec.name}: no loader for {build.path}")
    return spec.load_file(build.path)


def _why(e: Exception) -> str:
    return f"{type(e).__name__}: {e}"


# ---- sources -------------------------------------------------------------------------------


def package_source(label: str, module: str, load: Callable[[Build], Any]) -> Source:
    """An installed Python package `module` (found without importing it)."""

    def locate() -> list[Build]:
        spec = importlib.util.find_spec(module)
        if spec is None:
            return []
        where = spec.origin or next(iter(spec.submodule_search_locations or []), "")
        return [Build("package", label, str(where), dist_version(label))]

    return Source("package", label, locate, load)


def engine_source(
    label: str, engine: str, subdir: str, pattern: str, load: Callable[[Build], Any]
) -> Source:
    """An engine's bundled op library `ENGINE/SUBDIR/PATTERN` (e.g. vllm/_flashmla_C*.so),
    located without importing the engine; absent if the engine is not installed, a problem if
    it is but ships no such library."""

    def locate() -> list[Build]:
        spec = importlib.util.find_spec(engine)
        if spec is None:
            return []
        dirs = spec.submodule_search_locations or []
        libs = [p for d in dirs for p in Path(d, subdir).glob(pattern)]
        if not libs:
            what = f"{subdir}/{pattern}" if subdir else pattern
            raise Unsupported(
                f"{engine} {dist_version(engine)} ships no {what.removesuffix('*.so')}"
            )
        return [Build("engine", label, str(libs[0]), f"{engine} {dist_version(engine)}")]

    return Source("engine", label, locate, load)


def dist_version(dist: str) -> str:
    """An installed distribution's version, or "unknown"."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


# ---- library files -------------------------------------------------------------------------


def load_op_library(path: str, name: str, file_name: str, option: str, env_var: str):
    """(the loaded file, its Provider) of a torch op library at `path` (a file, its folder, or
    a packed .xz, unpacked once into UNPACK_DIR). The Provider names the build's folder and the
    file's sha256, so two builds of one version still differ in rows."""
    import torch

    p = Path(path).expanduser()
    so = p / file_name if p.is_dir() else p
    if so.suffix == ".xz" and so.is_file():
        if not torch.cuda.is_available():  # unpacking 146 MiB for a library that cannot load
            raise Unsupported(f"{name} library {so}: no CUDA device to load it on")
        try:
            so = unpack_xz(so)
        except (OSError, lzma.LZMAError) as e:
            raise Unsupported(f"cannot unpack {name} library {p}: {e}") from e
    if not so.is_file():
        raise Unsupported(
            f"{name} library not found: {so} (from {option} or {env_var}; "
            "`dsv4bench kernels fetch` puts the engines' builds in the kernels folder)"
        )
    try:
        torch.ops.load_library(str(so))
    except Exception as e:  # built for another torch/CUDA, or a CPU-only torch
        raise Unsupported(f"cannot load {name} library {so}: {_why(e)}"[:REASON_CHARS]) from e
    return so.resolve(), file_provider(so)


def file_provider(so: Path) -> Provider:
    digest = hashlib.sha256()
    with open(so, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    so = so.resolve()
    return Provider("library file", f"{so.parent.name} sha256:{digest.hexdigest()[:12]}", str(so))


def load_engine_library(build: Build) -> None:
    """Load an engine source's op library into torch.ops (without importing the engine)."""
    import torch

    torch.ops.load_library(build.path)


def unpack_xz(path: Path) -> Path:
    """UNPACK_DIR/<folder>/X from .kernels/<folder>/X.xz (once)."""
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
