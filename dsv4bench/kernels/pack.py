"""`kernels pack` / `unpack`: one xz archive per build, for a GPU machine without a registry (a
call there carries at most 64 MiB, so each call carries only the builds it runs)."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

from dsv4bench.kernels.store import BUILD_FILE, Build, read_builds, verify, write_manifest

SUFFIX = ".tar.xz"


class PackError(RuntimeError):
    """An archive that is not a build, or a build whose files do not match its build.json."""


def pack(root: Path, names: list[str], out: Path) -> list[Path]:
    """out/<build>.tar.xz for each named build (every build when none is named)."""
    builds = {b.name: b for b in read_builds(root)}
    for name in names:
        if name not in builds:
            raise PackError(
                f"{name}: no such build in {root} (have: {', '.join(builds) or 'none'})"
            )
    out.mkdir(parents=True, exist_ok=True)
    made = []
    for name in names or list(builds):
        problems = verify(root, builds[name])
        if problems:
            raise PackError(f"{problems[0]} (fetch it again)")
        archive = out / f"{name}{SUFFIX}"
        partial = archive.with_name(archive.name + ".partial")
        with tarfile.open(partial, "w:xz") as tar:
            tar.add(root / name, arcname=name)
        partial.replace(archive)
        made.append(archive)
    return made


def _build_of(tar: tarfile.TarFile, archive: Path) -> Build:
    # a wheel may ship build.json files of its own deeper down (FlashInfer 0.7.4 does)
    members = [
        m for m in tar.getmembers() if m.name.endswith(f"/{BUILD_FILE}") and m.name.count("/") == 1
    ]
    if len(members) != 1:
        raise PackError(f"{archive}: not a packed build (no <build>/{BUILD_FILE})")
    return Build.from_json(json.load(tar.extractfile(members[0])))


def unpack(archive: Path, root: Path) -> tuple[Build, bool]:
    """The build of `archive` into root/<build>/, checked against its build.json; (build, False)
    when that build is already there whole."""
    with tarfile.open(archive) as tar:
        build = _build_of(tar, archive)
        if (root / build.name).is_dir() and not verify(root, build):
            return build, False
        partial = root / f".{build.name}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        tar.extractall(partial, filter="data")
    problems = verify(partial, build)
    if problems:
        shutil.rmtree(partial)
        raise PackError(f"{archive}: {problems[0]}")
    shutil.rmtree(root / build.name, ignore_errors=True)
    (partial / build.name).replace(root / build.name)
    partial.rmdir()
    write_manifest(root)
    return build, True


def archives(paths: list[Path]) -> list[Path]:
    """The archives named, folders standing for every archive in them."""
    found = []
    for path in paths:
        found += sorted(path.glob(f"*{SUFFIX}")) if path.is_dir() else [path]
    return found
