"""The `kernels found` line of `backends` and `plan`: which build a backend found, or why none
(asked in commands/isolated.py's child process for a backend that loads a kernel library)."""

from __future__ import annotations

from pathlib import Path


def kernels_found(b) -> str:
    """Which build a backend found, or why none (one line: its rows will say unsupported)."""
    from dsv4bench import backends

    lib = getattr(b, "lib", None)
    if b.process_key() and lib and (Path(lib) / "build.json").is_file():
        return pinned_build(b, Path(lib))  # never loaded here: two builds cannot share a process
    try:
        prov = b.provider()
    except backends.Unsupported as e:
        return f"not available: {e}"
    return f"{prov.name} {prov.version}".strip()


def pinned_build(b, folder: Path) -> str:
    """A build instance's line from its build.json, checked but not loaded (its worker loads
    it); a reason when its files differ or the backend knows the build will not run."""
    from dsv4bench.kernels.store import BuildError, read_build, verify

    try:
        build = read_build(folder / "build.json")
    except BuildError as e:
        return f"not available: {e} (dsv4bench kernels fetch again)"
    problems = verify(folder.parent, build, checksums=False)  # every plan: sizes only
    if problems:
        return f"not available: {problems[0]} (dsv4bench kernels fetch again)"
    reason = b.build_reason()
    if reason:
        return f"not available: {reason}"
    from dsv4bench.kernels.known import untested_release

    source = f"{build.package}=={build.version}"
    note = untested_release(folder)
    tail = f" [{note}]" if note else ""
    return f"build {build.name}: {build.library} {build.library_version} from {source}{tail}"
