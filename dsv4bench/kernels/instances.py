"""Which backend instance each build becomes: one per build, named as the build, and the default
instance of each library (the one a bare backend name runs) is its newest build, in the order
the catalog lists packages and their releases."""

from __future__ import annotations

from dsv4bench.kernels.catalog import PACKAGES
from dsv4bench.kernels.store import Build


def rank(build: Build) -> tuple[int, int]:
    """Sort key, lowest first: the catalog's package order, then its releases newest first;
    builds of packages it does not know come last."""
    packages = list(PACKAGES)
    if build.package not in PACKAGES:
        return (len(packages), 0)
    versions = PACKAGES[build.package].versions
    position = versions.index(build.version) if build.version in versions else len(versions)
    return (packages.index(build.package), position)


def default_builds(builds: list[Build]) -> dict[str, str]:
    """library -> the name of its default build."""
    out: dict[str, str] = {}
    for build in sorted(builds, key=rank):
        out.setdefault(build.library, build.name)
    return out
