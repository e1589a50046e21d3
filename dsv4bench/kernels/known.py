"""Whether a build in the kernels folder is a release the catalog knows: the adapters were
written against those releases' APIs (op schemas, function names), so a build of another
release is refused in one line at plan time, read from its build.json without loading it."""

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
    if build.version not in package.versions:
        return (
            f"{what}=={build.version}, a release whose API the adapters were not written "
            f"against (known: {build.package} {', '.join(package.versions)}; "
            "dsv4bench/kernels/catalog.py)"
        )
    return None
