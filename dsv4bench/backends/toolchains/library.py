"""A prebuilt kernel library or package: the one discovery chain (lib option, env, packages,
engines, kernels folder, a site folder) for kernels that come as libraries (FlashMLA, FA3,
DeepGEMM, FlashInfer, and every later library backend): where a build can come from, in which
order, and what a row says about the one found.

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

For a family's own use (the public names, each documented below):
  LibraryBackend, LazyOps   a backend over one library (option `lib`), its ops found once
  pinned_release_reason     a pinned kernels-folder build the catalog does not know
  lib_env                   the environment variable a backend's `lib` option falls back on
  build_folder              a `kernels fetch` build folder: `lib`, $ENV, the newest, else a fallback
  package_dir               an installed package's folder, found without importing it
  site_folder, on_sys_path  a build's site/ folder (a package and its requirements) put first
                            on sys.path, when the package is not installed
"""

from __future__ import annotations

import hashlib
import importlib.util
import lzma
import os
import shutil
import sys
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from dsv4bench.backends.base import REASON_CHARS, Backend, Provider, Unsupported
from dsv4bench.kernels.known import release_reason
from dsv4bench.kernels.store import kernels_dir

SOURCES = ("file", "package", "engine", "kernels")
CHECKOUT = Path(__file__).resolve().parents[3]  # its .kernels/ is the kernels folder
UNPACK_DIR = Path(os.environ.get("DSV4BENCH_UNPACK_DIR", "/tmp/dsv4-kernels"))
PROBLEM_CHARS = 200  # one source's failure, within the not-found reason


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


def lib_env(name: str) -> str:
    """The environment variable naming a backend's library or build folder when its `lib`
    option does not: DSV4BENCH_<NAME>_LIB (`sglang-topk` -> DSV4BENCH_SGLANG_TOPK_LIB)."""
    return f"DSV4BENCH_{name.upper().replace('-', '_')}_LIB"


# ---- build folders and site folders --------------------------------------------------------


def build_folder(
    lib: str | None,
    env_var: str,
    pattern: str,
    from_folder: Callable[[Path], Any],
    fallback: Callable[[], Any],
) -> Any:
    """from_folder(the build folder `lib` or $env_var names), else from_folder(the kernels
    folder's newest build matching `pattern`, a path under it such as "q8kv8-*/csrc/entry.cuh"
    whose first part is the build's folder), else fallback() (e.g. installed packages)."""
    explicit = lib or (os.environ.get(env_var) if env_var else None)
    if explicit:
        return from_folder(Path(explicit).expanduser())
    root = kernels_dir()
    found = sorted(root.glob(pattern), reverse=True)
    if found:
        return from_folder(root / found[0].relative_to(root).parts[0])
    return fallback()


def package_dir(name: str) -> Path | None:
    """The folder of the installed package `name`, found without importing it; None if absent."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def site_folder(lib: str | None, package: str, builds: str, what: str) -> Path | None:
    """The site/ folder (the package and its requirements) of a `kernels fetch` build: `lib`'s
    (Unsupported if it holds no `package`), else, when `package` is neither imported nor
    installed, the kernels folder's newest build matching `builds` (e.g. "flashinfer-*");
    None: import the package as installed."""
    if lib:
        site = Path(lib) / "site"
        if not (site / package / "__init__.py").is_file():
            raise Unsupported(f"{what} build not found: no site/{package} in {lib}")
        return site
    if package in sys.modules or importlib.util.find_spec(package) is not None:
        return None
    found = sorted(kernels_dir().glob(f"{builds}/site/{package}/__init__.py"), reverse=True)
    return found[0].parents[1] if found else None


def on_sys_path(*sites: Path | None) -> None:
    """Put the site folders first on sys.path (the first given first), once each."""
    for site in reversed(sites):
        if site is not None and str(site) not in sys.path:
            sys.path.insert(0, str(site))


# ---- a backend over one library ------------------------------------------------------------


class LazyOps:
    """A kernel library's ops, found once: injected ones, a factory's, or `discover()`'s.

    Why they could not be found is remembered and raised again as Unsupported on every get."""

    def __init__(self, source, discover: Callable[[], Any]):
        self._source, self._discover = source, discover
        self.reset()

    def reset(self) -> None:
        self._ops, self._error = None, None

    @property
    def loaded(self) -> bool:
        """Whether get() has the ops at hand without searching (found, or injected)."""
        return self._ops is not None or self._source is not None

    def get(self):
        if self._ops is None and self._error is None:
            src = self._source
            try:
                if src is None:
                    self._ops = self._discover()
                else:
                    self._ops = src() if callable(src) else src
            except Unsupported as e:
                self._error = str(e)
        if self._error is not None:
            raise Unsupported(self._error)
        return self._ops


class LibraryBackend(Backend):
    """A backend over one kernel library: option `lib` (a file; None: discover(lib) searches),
    found lazily once; setting `lib` searches again. Builds that register the same torch op
    namespace cannot share a process, so an explicit `lib` is its own worker (process_key)."""

    def _find_with(self, lib: str | None, ops, discover: Callable[[str | None], Any]) -> None:
        self._lib = lib
        # injected ops (or a factory of them) instead of discovery
        self._found = LazyOps(ops, lambda: discover(self._lib))

    @property
    def lib(self) -> str | None:
        return self._lib

    @lib.setter
    def lib(self, value: str | None) -> None:
        self._lib = value
        self._found.reset()

    def kernel_ops(self):
        return self._found.get()

    def provider(self) -> Provider:
        return self.kernel_ops().provider

    def supports(self, case, arch: str) -> str | None:
        return super().supports(case, arch) or self.build_reason()

    def build_reason(self) -> str | None:
        # a kernels-folder build of a release the catalog does not know (read, not loaded)
        return pinned_release_reason(self._lib)

    def process_key(self) -> str:
        return f"{self.base}.lib={self._lib}" if self._lib else ""


def pinned_release_reason(lib: str | None) -> str | None:
    """Why the kernels-folder build at `lib` (its build.json) is no release the catalog knows;
    None for no `lib`, a known release, or a library file named by hand."""
    return release_reason(Path(lib)) if lib else None
