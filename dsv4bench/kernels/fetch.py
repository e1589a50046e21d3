"""`kernels fetch`: download an engine package's wheel (pip, no dependencies) and cut the kernel
builds it ships out of it into the kernels folder."""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from dsv4bench.kernels.catalog import BuildSpec, Finder, PackageSpec, Part
from dsv4bench.kernels.store import Build, KernelFile, sha256_of, write_build, write_manifest

# The GPU machines run CPython 3.12 on x86-64 Linux; pure-Python and abi3 wheels fit any.
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "any")  # fmt: skip


class FetchError(RuntimeError):
    """A download or a wheel that does not hold what the catalog says (one line)."""


def _wheel_name(requirement: str) -> str:
    return re.split(r"[=<>!~;, ]", requirement, maxsplit=1)[0].replace("-", "_").lower()


def find_wheel(wheels: Path, requirement: str) -> Path | None:
    """The newest wheel in `wheels` that `requirement` (`name==version`, `name>=a,<b`, `name`)
    accepts."""
    from packaging.requirements import Requirement
    from packaging.version import InvalidVersion

    wanted = Requirement(requirement)
    name = _wheel_name(wanted.name)
    for path in sorted(wheels.glob("*.whl"), reverse=True):
        dist, ver = path.name.split("-")[:2]
        try:
            if dist.lower() == name and wanted.specifier.contains(ver, prereleases=True):
                return path
        except InvalidVersion:
            continue
    return None


def download(
    requirement: str, wheels: Path, python_version: str, platforms: tuple[str, ...] = ()
) -> Path:
    """The wheel of `requirement` in `wheels`, downloaded there by pip unless it is already
    (for CPython `python_version` on any of PLATFORMS and `platforms`)."""
    found = find_wheel(wheels, requirement)
    if found:
        return found
    wheels.mkdir(parents=True, exist_ok=True)
    tags = [a for p in (*PLATFORMS, *platforms) for a in ("--platform", p)]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", python_version, "--implementation", "cp", "-d", str(wheels),
           *tags, requirement]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    found = find_wheel(wheels, requirement)
    if done.returncode or not found:
        last = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
        raise FetchError(f"pip download {requirement}: {last}")
    return found


def _members(z: zipfile.ZipFile, spec: BuildSpec) -> list[str]:
    names = [n for n in z.namelist() if not n.endswith("/")]
    if spec.whole_wheel:
        return names
    if spec.find is not None:
        return found_members(z, names, spec.find)
    picked = []
    for want in spec.members:
        hits = (
            [n for n in names if n.startswith(want)]
            if want.endswith("/")
            else [want] * (want in names)
        )
        if not hits:
            raise FetchError(f"{Path(z.filename).name} has no {want}")
        picked += hits
    return picked


def anchors(z: zipfile.ZipFile, names: list[str], find: Finder) -> list[str]:
    """The members matching find.anchor that carry every string of find.registers."""
    hits = [n for n in names if fnmatch.fnmatch(n, find.anchor)]
    wanted = [r.encode() for r in find.registers]
    return [n for n in hits if all(w in z.read(n) for w in wanted)]


def found_members(z: zipfile.ZipFile, names: list[str], find: Finder) -> list[str]:
    """A Finder's members: those its `take` globs pick in the folder of the one anchor."""
    found = anchors(z, names, find)
    wheel = Path(z.filename).name
    if len(found) != 1:
        ops = f" registering {', '.join(find.registers)}" if find.registers else ""
        what = f"{find.anchor}{ops}"
        many = f" ({len(found)}: {', '.join(found[:3])})" if found else ""
        raise FetchError(f"{wheel}: expected one {what}, found {len(found) or 'none'}{many}")
    folder = found[0].rpartition("/")[0] + "/" if "/" in found[0] else ""
    inside = [n for n in names if n.startswith(folder)]
    return [n for n in inside if any(_takes(n[len(folder) :], t) for t in find.take)]


def _takes(rel: str, glob: str) -> bool:
    """Whether a Finder's `take` glob picks `rel` (`*` stays within one folder level)."""
    return glob == "**" or (fnmatch.fnmatch(rel, glob) and rel.count("/") == glob.count("/"))


def finder_strip(member: str, find: Finder) -> str:
    """The prefix cut off a Finder's members: up to the anchor's folder (its parent with
    keep_folder)."""
    folder = member.rpartition("/")[0]
    if find.keep_folder:
        folder = folder.rpartition("/")[0]
    return folder + "/" if folder else ""


def _library_version(folder: Path, spec: BuildSpec, package_version: str) -> str:
    """The kernel library's own version where the build says it (DeepGEMM's __version__,
    sgl-flash-mla's VERSION file); else the package's."""
    for init in folder.glob("*/__init__.py"):
        found = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)", init.read_text(), re.M)
        if found and spec.library == "deepgemm":
            return found.group(1)
    for version_file in folder.glob("*/VERSION"):
        return version_file.read_text().strip()
    return package_version


SAME_FILE_BYTES = 1 << 20  # identical files at least this big become hard links of one


def site_path(member: str) -> str | None:
    """Where pip installs a wheel member relative to site-packages: `<dist>.data/purelib/x` and
    `.../platlib/x` at `x`; the other .data schemes (scripts, headers, data) outside it: None."""
    head, _, rest = member.partition("/")
    if not head.endswith(".data"):
        return member
    scheme, _, path = rest.partition("/")
    return path if scheme in ("purelib", "platlib") else None


def extract(
    wheel: Path, spec: BuildSpec, dest: Path, under: str = "", same: dict | None = None
) -> list[KernelFile]:
    """The build's members of `wheel` under dest/under (their `strip` prefix cut; a whole wheel
    laid out as pip installs it in site-packages), with checksums; paths relative to `dest`.
    A big file identical to one already in `same` (sha256 -> path, shared by a build's wheels)
    becomes a hard link of it, so that a packed build holds it once (z3 ships its library as
    libz3.so and libz3.so.4.15)."""
    files = []
    same = {} if same is None else same
    with zipfile.ZipFile(wheel) as z:
        members = _members(z, spec)
        strip = spec.strip
        if spec.find is not None:
            strip = finder_strip(anchors(z, members, spec.find)[0], spec.find)
        for member in members:
            inside = site_path(member) if spec.whole_wheel else member
            if inside is None:
                continue
            rel = under + inside.removeprefix(strip)
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            with z.open(member) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out)
            digest, size = sha256_of(target), target.stat().st_size
            if size >= SAME_FILE_BYTES and digest in same:
                target.unlink()
                os.link(same[digest], target)
            elif size >= SAME_FILE_BYTES:
                same[digest] = target
            files.append(KernelFile(rel, member, digest, size))
    return files


def extract_part(wheel: Path, library: str, part: Part, dest: Path) -> list[KernelFile]:
    """A Part's members of `wheel` (every member when it names none) under dest/part.under."""
    spec = BuildSpec(library, part.members, part.strip, whole_wheel=not part.members)
    return extract(wheel, spec, dest, part.under)


def _wheels_of(spec: BuildSpec, wheel: Path, extra: list[Path]) -> list[Path]:
    """The wheels a build is cut from: a member list's, the package's; a whole-wheel build's,
    the package's and its extra wheels, or one side of them (spec.wheels)."""
    if not spec.whole_wheel:
        return [wheel]
    sides = {"both": [wheel, *extra], "package": [wheel], "extras": extra}
    if spec.wheels not in sides:
        raise FetchError(f"{spec.library}: wheels {spec.wheels!r} (both, package or extras)")
    return sides[spec.wheels]


def newest_version(
    package: PackageSpec, python_version: str, run: Callable = subprocess.run
) -> str:
    """The newest release of `package` the registry serves for the GPU machine's Python and
    platforms (pip index versions)."""
    tags = [a for p in (*PLATFORMS, *package.platforms) for a in ("--platform", p)]
    cmd = [sys.executable, "-m", "pip", "index", "versions", package.dist.split("[")[0],
           "--only-binary=:all:", "--python-version", package.python_version or python_version,
           "--implementation", "cp", *tags]  # fmt: skip
    done = run(cmd, capture_output=True, text=True)
    found = re.search(r"^\S+ \(([^)]+)\)", done.stdout or "", re.M)
    if done.returncode or not found:
        last = ((done.stderr or "").strip().splitlines() or ["no release listed"])[-1]
        raise FetchError(f"pip index versions {package.dist}: {last}")
    return found.group(1)


def fetch_package(
    package: PackageSpec,
    version: str,
    root: Path,
    *,
    wheels: Path | None = None,
    python_version: str = "3.12",
    say: Callable[[str], None] = print,
) -> list[Build]:
    """Every build `package==version` ships, into root/<build name>/ (replacing what was there);
    no version: the newest release the registry serves."""
    if not version:
        version = newest_version(package, python_version)
        say(f"{package.dist}: newest release {version}")
    if version not in package.versions:
        tested = ", ".join(package.versions) or "none"
        say(f"{package.dist} {version}: untested release (tested: {tested}); members found by kind")
    with tempfile.TemporaryDirectory() as tmp:
        wheel_dir = wheels or Path(tmp)
        wheel = download(
            f"{package.dist}=={version}",
            wheel_dir,
            package.python_version or python_version,
            package.platforms,
        )
        extra = [download(r, wheel_dir, python_version) for r in package.extra_wheels]
        say(f"{wheel.name}: {wheel.stat().st_size / 2**20:.1f} MiB")
        builds = []
        for spec in package.builds:
            name = package.build_name(spec, version)
            folder = root / name
            partial = root / f".{name}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            under = "site/" if spec.whole_wheel else spec.under  # site/: for PYTHONPATH
            taken = list(_wheels_of(spec, wheel, extra))
            same: dict = {}
            files = [f for w in taken for f in extract(w, spec, partial, under, same)]
            for part in spec.parts:
                part_wheel = download(part.requirement, wheel_dir, python_version)
                files += extract_part(part_wheel, spec.library, part, partial)
                taken.append(part_wheel)
            build = Build(
                name=name,
                library=spec.library,
                package=package.dist,
                version=version,
                library_version=_library_version(partial / under, spec, version),
                files=files,
                wheels=[w.name for w in taken],
            )
            shutil.rmtree(folder, ignore_errors=True)
            partial.replace(folder)
            write_build(root, build)
            say(f"  {name}: {len(files)} files, {build.size / 2**20:.1f} MiB")
            builds.append(build)
    write_manifest(root)
    return builds
