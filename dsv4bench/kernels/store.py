"""The kernels folder: one folder per build, each with its `build.json` (the package and version
it came from, and every file's wheel member, sha256 and size), and `manifest.json` at the top
listing them all. The build.json files are what a packed build carries; the manifest is made
from them after every fetch or unpack."""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

BUILD_FILE = "build.json"
MANIFEST = "manifest.json"
# a build's name is its folder: one path component, no `..`, no leading dot (partial folders)
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_+-]*(\.[A-Za-z0-9_+-]+)*")
SHA256 = re.compile(r"[0-9a-f]{64}")
TEXT_FIELDS = ("name", "library", "package", "version", "library_version")


class BuildError(ValueError):
    """A build.json that does not describe a build (hand-edited, cut, of another layout)."""


CHECKOUT = Path(__file__).resolve().parents[2]


def kernels_dir(checkout: Path | None = None) -> Path:
    """The kernels folder: $DSV4BENCH_KERNELS, else the checkout's `.kernels`."""
    env = os.environ.get("DSV4BENCH_KERNELS")
    return Path(env) if env else (checkout or CHECKOUT) / ".kernels"


@dataclass
class KernelFile:
    path: str  # relative to the build's folder
    member: str  # where it was in the wheel
    sha256: str
    size: int


@dataclass
class Build:
    name: str  # flashmla-vllm-0.33.0: its folder and its backend instance
    library: str  # flashmla, fa3, deepgemm, flashinfer
    package: str  # the distribution it came from (vllm, sgl-flash-mla, flashinfer-python)
    version: str  # of that package
    library_version: str  # of the kernel library itself, when it says (DeepGEMM 2.8.1)
    files: list[KernelFile] = field(default_factory=list)
    wheels: list[str] = field(default_factory=list)  # the wheel file names it was cut from

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Build:
        """The build a build.json holds, every field checked (BuildError names the field): its
        name and file paths become paths under the kernels folder, so they must stay in it."""
        if not isinstance(data, dict):
            raise BuildError(f"expected an object, got {type(data).__name__}")
        _check_keys(data, {f.name for f in fields(cls)}, "build")
        for key in TEXT_FIELDS:
            _need(isinstance(data.get(key), str), key, "a string")
        _need(NAME.fullmatch(data["name"]) is not None, "name", "one folder name, no '/' or '..'")
        wheels = data.get("wheels", [])
        wheel_names = isinstance(wheels, list) and all(isinstance(w, str) for w in wheels)
        _need(wheel_names, "wheels", "a list of wheel file names")
        files = data.get("files", [])
        _need(isinstance(files, list), "files", "a list")
        return cls(**{**data, "files": [_file(f, i) for i, f in enumerate(files)]})


def _need(ok: bool, key: str, expected: str) -> None:
    if not ok:
        raise BuildError(f"{key}: expected {expected}")


def _check_keys(data: dict, known: set[str], where: str) -> None:
    missing = sorted(k for k in known if k not in data and k not in ("files", "wheels"))
    extra = sorted(k for k in data if k not in known)
    if missing or extra:
        what = f"missing {', '.join(missing)}" if missing else f"unknown key {', '.join(extra)}"
        raise BuildError(f"{where}: {what}")


def _file(data, i: int) -> KernelFile:
    where = f"files[{i}]"
    _need(isinstance(data, dict), where, "an object")
    _check_keys(data, {"path", "member", "sha256", "size"}, where)
    path = data["path"]
    inside = isinstance(path, str) and path != "" and not Path(path).is_absolute()
    _need(inside and ".." not in Path(path).parts, f"{where}.path", "a relative path inside")
    _need(isinstance(data["member"], str), f"{where}.member", "a string")
    sha = data["sha256"]
    _need(isinstance(sha, str) and SHA256.fullmatch(sha) is not None, f"{where}.sha256", "hex")
    size = data["size"]
    _need(type(size) is int and size >= 0, f"{where}.size", "a byte count")
    return KernelFile(**data)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_build(root: Path, build: Build) -> None:
    (root / build.name / BUILD_FILE).write_text(json.dumps(build.to_json(), indent=1) + "\n")


def read_build(path: Path) -> Build:
    """The build of one build.json; BuildError (one line naming the file) when it is not one."""
    try:
        data = json.loads(path.read_bytes())
    except OSError as e:
        raise BuildError(f"{path}: unreadable ({e.strerror or e})") from None
    except ValueError as e:  # not JSON, not UTF-8
        raise BuildError(f"{path}: not JSON ({e})") from None
    try:
        return Build.from_json(data)
    except BuildError as e:
        raise BuildError(f"{path}: {e}") from None


def read_builds(root: Path) -> list[Build]:
    """Every build in the kernels folder, by name; a folder without a readable build.json is not
    a build (what an older packing left is found by the backends' own globs)."""
    return scan(root)[0]


def scan(root: Path) -> tuple[list[Build], list[tuple[str, str]]]:
    """(the builds whose build.json reads, (folder name, why) of each one that does not)."""
    builds, damaged = [], []
    for path in sorted(root.glob(f"*/{BUILD_FILE}")):
        try:
            build = read_build(path)
        except BuildError as e:
            damaged.append((path.parent.name, str(e)))
            continue
        if build.name != path.parent.name:
            damaged.append((path.parent.name, f"{path}: name {build.name!r} is not its folder's"))
            continue
        builds.append(build)
    return builds, damaged


def write_manifest(root: Path) -> Path:
    builds = read_builds(root)
    path = root / MANIFEST
    path.write_text(json.dumps({"builds": [b.to_json() for b in builds]}, indent=1) + "\n")
    return path


def verify(root: Path, build: Build, checksums: bool = True) -> list[str]:
    """What differs between a build's folder and its build.json: missing files, wrong sizes or
    (with `checksums`: a build can hold 400 MiB) checksums; empty when it is whole."""
    problems = []
    for f in build.files:
        path = root / build.name / f.path
        if not path.is_file():
            problems.append(f"{build.name}/{f.path}: missing")
        elif path.stat().st_size != f.size or (checksums and sha256_of(path) != f.sha256):
            problems.append(f"{build.name}/{f.path}: sha256 or size differs from {BUILD_FILE}")
    return problems
