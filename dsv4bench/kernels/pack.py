"""`kernels pack` / `unpack`: one xz archive per build, for a GPU machine without a registry (a
call there carries at most 64 MiB, so each call carries only the builds it runs)."""

from __future__ import annotations

import json
import lzma
import shutil
import tarfile
from pathlib import Path

from dsv4bench.kernels.store import BUILD_FILE, Build, BuildError, scan, verify, write_manifest

SUFFIX = ".tar.xz"


class PackError(RuntimeError):
    """An archive that is not a build, or a build whose files do not match its build.json."""


def pack(root: Path, names: list[str], out: Path) -> list[Path]:
    """out/<build>.tar.xz for each named build (every build when none is named)."""
    found, damaged = scan(root)
    builds = {b.name: b for b in found}
    for name, why in damaged:  # a build.json that does not read packs nothing whole
        if not names or name in names:
            raise PackError(f"{why} (fetch it again)")
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
    """The archive's build.json, checked, before anything is extracted: every member lies in
    the folder of the build's name (one folder name: see store.NAME)."""
    members = tar.getmembers()
    # a wheel may ship build.json files of its own deeper down (FlashInfer 0.7.4 does)
    found = [m for m in members if m.name.endswith(f"/{BUILD_FILE}") and m.name.count("/") == 1]
    if len(found) != 1:
        raise PackError(f"{archive}: not a packed build (no <build>/{BUILD_FILE})")
    try:
        build = Build.from_json(json.load(tar.extractfile(found[0])))
    except (BuildError, ValueError) as e:
        raise PackError(f"{archive}: {found[0].name}: {e}") from None
    if found[0].name != f"{build.name}/{BUILD_FILE}":
        raise PackError(f"{archive}: {found[0].name} names build {build.name!r}, not its folder")
    stray = [
        m.name for m in members if m.name != build.name and not m.name.startswith(f"{build.name}/")
    ]
    if stray:
        raise PackError(f"{archive}: {stray[0]} lies outside the build's folder {build.name}/")
    return build


def unpack(archive: Path, root: Path) -> tuple[Build, bool]:
    """The build of `archive` into root/<build>/, checked against its build.json; (build, False)
    when that build is already there whole. An archive that is cut, empty or not xz is a
    PackError, as is one whose build.json does not read."""
    try:
        return _unpack(archive, root)
    except (tarfile.TarError, lzma.LZMAError, EOFError) as e:
        shutil.rmtree(root / f".{archive.name}.partial", ignore_errors=True)
        why = str(e) or type(e).__name__
        raise PackError(f"{archive}: not a readable, whole {SUFFIX} build ({why})") from None


def _unpack(archive: Path, root: Path) -> tuple[Build, bool]:
    with tarfile.open(archive, "r:xz") as tar:
        build = _build_of(tar, archive)
        if (root / build.name).is_dir() and not verify(root, build):
            return build, False
        partial = root / f".{archive.name}.partial"
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
