"""GPU tests of a kernel library run once per build: every build of it the catalog knows (the
default, newest release first) and any other the kernels folder holds, read from the kernels
folder when pytest collects. A build not there is skipped with a reason that names it and the
`dsv4bench kernels fetch` that brings it, so a GPU call that unpacked a few builds tests those.

Two builds of one library cannot share a process (one torch op namespace, one `deep_gemm` or
`flashinfer` module: the second would load nothing new, or fail), as the runner's workers know
(Backend.process_key). Here the first build a process loads runs its tests in it, and a test of
another build of that library runs again in a pytest of its own, whose outcome is the test's
(`-k BUILD` selects one build's tests: no second process then)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from dsv4bench.kernels.catalog import fetch_spec, known_builds, tested_build
from dsv4bench.kernels.store import Build, kernels_dir, read_builds, verify

# library -> the build this process loaded for a test (the others run in a pytest of their own)
LOADED: dict[str, str] = {}
OUTPUT_CHARS = 3000  # of a test's own pytest, in this test's failure


def build_params(library: str, root: Path | None = None) -> list:
    """pytest params, one per build of `library` (id and value: the build's name), in the
    catalog's order then the folder's others; one not whole in the kernels folder `root`
    (default: kernels_dir()) is marked skip with missing_reason."""
    root = kernels_dir() if root is None else root
    present = {b.name: b for b in read_builds(root) if b.library == library}
    names = [name for name, lib in known_builds() if lib == library]
    names += [name for name in present if name not in names]
    params = []
    for name in names:
        reason = missing_reason(root, name, present.get(name))
        marks = [pytest.mark.skip(reason=reason)] if reason else []
        params.append(pytest.param(name, id=name, marks=marks))
    return params


def missing_reason(root: Path, name: str, build: Build | None) -> str | None:
    """Why the build `name` cannot be tested from `root` (absent, or files that differ from its
    build.json), with what brings it; None when it is there whole."""
    if build is None:
        why = f"{name} is not in {root}"
    else:
        problems = verify(root, build, checksums=False)
        if not problems:
            return None
        why = problems[0]
    spec = fetch_spec(name)
    brings = f"dsv4bench kernels fetch {spec}" if spec else "no release the catalog knows has it"
    return f"{why}: {brings} (or dsv4bench kernels unpack .kpack/{name}.tar.xz)"


def build_folder(name: str) -> str:
    """The `lib` option that pins a backend to the build `name` of the kernels folder."""
    return str(kernels_dir() / name)


def ran_alone(request, library: str, build: str, spawn: Callable = subprocess.run) -> bool:
    """False: run the test here (this process holds `build` of `library` from now on). True:
    another build of `library` is loaded here, so the test ran in a pytest of its own and
    passed there; its skip or failure there is raised here."""
    holder = LOADED.setdefault(library, build)
    if holder == build:
        return False
    node = request.node.nodeid
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", node]
    done = spawn(cmd, cwd=str(request.config.rootpath), capture_output=True, text=True)
    out = (done.stdout or "") + (done.stderr or "")
    where = f"{build} in a pytest of its own ({holder} holds {library} in this one)"
    skipped = re.search(r"^SKIPPED \[\d+\] [^\n]*?:\d+: (.*)$", out, re.M)
    if done.returncode == 0 and skipped:
        pytest.skip(f"{where}: {skipped.group(1)}")
    if done.returncode != 0 or not re.search(r"\b1 passed\b", out):
        pytest.fail(f"{where}: exit {done.returncode}\n{out[-OUTPUT_CHARS:]}", pytrace=False)
    return True


def expect_supported(build: str, reason: str | None) -> None:
    """A build's verdict on a GPU test's case: `unsupported` fails the test for a tested
    release (its adapter was written to run the case) and skips it, saying why, for an
    untested release or any other build the kernels folder holds."""
    if reason is None:
        return
    if tested_build(build):
        pytest.fail(f"{build}: {reason}", pytrace=False)
    pytest.skip(f"{build}: {reason}")


def loaded_from(build: str, location: str) -> bool:
    """Whether a provider's location lies in the build's folder (not in another build's)."""
    return Path(location).resolve().is_relative_to(Path(build_folder(build)).resolve())
