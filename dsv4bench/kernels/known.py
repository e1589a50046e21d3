"""Whether a build in the kernels folder is one the catalog knows, read from its build.json
without loading it. A package or library the catalog does not know is refused in one line at
plan time; a release of a known package the adapters were not tested against is not refused but
marked "untested release" (untested_release): whether it runs is decided at load, where the
adapters read its op schemas and signatures (`unsupported` rows naming what differs)."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from dsv4bench.kernels.catalog import PACKAGES
from dsv4bench.kernels.store import BUILD_FILE, Build


def release_reason(folder: Path) -> str | None:
    """Why the build in `folder` is not one the catalog knows; None when it is, or when the
    folder has no build.json (a library named by hand: loading it says what it lacks)."""
    path = folder / BUILD_FILE
    try:
        stamp = path.stat().st_mtime_ns
    except OSError:
        return None
    return _reason(str(path), stamp)


@lru_cache(maxsize=64)
def _reason(path: str, stamp: int) -> str | None:
    """release_reason of one build.json as it was at `stamp` (a FlashInfer build's lists
    thousands of files: read once, not at every case a plan asks about)."""
    try:
        build = Build.from_json(json.loads(Path(path).read_text()))
    except (OSError, ValueError, TypeError, KeyError) as e:
        return f"{path}: unreadable ({type(e).__name__}; dsv4bench kernels fetch again)"
    package = PACKAGES.get(build.package)
    what = f"{build.name}: {build.library} {build.library_version} from {build.package}"
    if package is None:
        return f"{what}, a package the catalog does not know (known: {', '.join(PACKAGES)})"
    libraries = sorted({b.library for b in package.builds})
    if build.library not in libraries:
        return f"{what}, which the catalog says ships {', '.join(libraries)}, not {build.library}"
    return None


def untested_release(folder: Path) -> str | None:
    """ "untested release ..." for a build of a known package's release the adapters were not
    tested against; None for a tested one, a refused one (release_reason) or no build.json."""
    path = folder / BUILD_FILE
    try:
        stamp = path.stat().st_mtime_ns
    except OSError:
        return None
    return _untested(str(path), stamp)


@lru_cache(maxsize=64)
def _untested(path: str, stamp: int) -> str | None:
    if _reason(path, stamp):
        return None
    build = Build.from_json(json.loads(Path(path).read_text()))
    package = PACKAGES[build.package]
    if build.version in package.versions:
        return None
    tested = ", ".join(package.versions) or "none"
    return (
        f"untested release {build.package}=={build.version} (tested: {tested}); "
        "its op schemas and signatures are checked at load"
    )
