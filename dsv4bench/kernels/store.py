"""The kernels folder: one folder per build, each with its `build.json` (the package and version
it came from, and every file's wheel member, sha256 and size), and `manifest.json` at the top
listing them all. The build.json files are what a packed build carries; the manifest is made
from them after every fetch or unpack."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

BUILD_FILE = "build.json"
MANIFEST = "manifest.json"


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
        files = [KernelFile(**f) for f in data.get("files", [])]
        return cls(**{**data, "files": files})


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_build(root: Path, build: Build) -> None:
    (root / build.name / BUILD_FILE).write_text(json.dumps(build.to_json(), indent=1) + "\n")


def read_builds(root: Path) -> list[Build]:
    """Every build in the kernels folder, by name; a folder without a readable build.json is not
    a build (what an older packing left is found by the backends' own globs)."""
    builds = []
    for path in sorted(root.glob(f"*/{BUILD_FILE}")):
        try:
            builds.append(Build.from_json(json.loads(path.read_text())))
        except (ValueError, TypeError, KeyError):
            continue
    return builds


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
