"""Every kernel build the catalog knows (dsv4bench.kernels.catalog) as a backend instance named
as the build (`flashmla-vllm-0.33.0`), pinned to its folder in the kernels folder: a scenario
can name every build, and a build not fetched gives `unsupported` rows that say so. The plain
backend name (`flashmla`) stays the discovery chain's pick: an installed package or engine,
else the kernels folder's newest build."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from dsv4bench.backends.base import Backend
from dsv4bench.kernels.catalog import known_builds
from dsv4bench.kernels.store import kernels_dir, read_builds


def pinnable(make: Callable[[], Backend]) -> bool:
    """Whether a table entry is a backend class with a `lib` option (a build's folder)."""
    return isinstance(make, type) and "lib" in make.options


def build_instances(table: dict[str, Callable[[], Backend]]) -> dict[str, Callable[[], Backend]]:
    """Build name -> factory of its library's backend with `lib` = the build's folder, for
    every library whose backend is pinnable (has a `lib` option): every build of a tested
    release, and every other build the kernels folder holds (a release fetched the week it came
    out, planned as an untested release)."""
    folder = kernels_dir()
    fetched = [(b.name, b.library) for b in read_builds(folder)] if folder.is_dir() else []
    return {
        name: partial(table[library], lib=str(folder / name))
        for name, library in [*known_builds(), *fetched]
        if library in table and pinnable(table[library])
    }
