"""`make install` on a python3 that refuses pip installs (PEP 668: a stock Debian/Ubuntu one)
makes .venv/ and installs there, and every later target runs .venv's python; elsewhere (CI) it
installs into python3 as before. Run against a stand-in python3 that logs what it is asked."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# argv to the log; "managed" when it is the system python3 of an externally managed machine
FAKE_PYTHON = """#!/usr/bin/env bash
me=python3; [[ $0 == *.venv/bin/python ]] && me=.venv/bin/python
echo "$me $*" >> "$LOG"
case "$1 $2" in
  "-c import os, sys, sysconfig"*) [[ $me == python3 && $FAKE_MANAGED == 1 ]] ;;
  "-c import torch") exit 1 ;;
  "-m venv") mkdir -p "$3/bin" && cp "$0" "$3/bin/python" ;;
  *) exit 0 ;;
esac
"""


def make(tmp_path: Path, target: str, *, managed: bool) -> list[str]:
    """`make TARGET` in a copy of the Makefile with the stand-in python3 first on PATH; the
    commands python was given, one line each ("python3 -m pip ...")."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "python3"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    log = tmp_path / "log"
    log.write_text("")
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "LOG": str(log),
        "FAKE_MANAGED": str(int(managed)),
    }
    p = subprocess.run(
        ["make", "-s", target], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stdout + p.stderr
    return [" ".join(line.split()[:3]) for line in log.read_text().splitlines()]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs the make command")
def test_install_goes_into_a_venv_where_python3_is_externally_managed(tmp_path):
    assert make(tmp_path, "install", managed=True) == [
        "python3 -c import",  # is pip allowed here?
        "python3 -m venv",
        ".venv/bin/python -c import",  # torch there?
        ".venv/bin/python -m pip",  # torch==2.13.0
        ".venv/bin/python -m pip",  # the suite, editable
        ".venv/bin/python -m pip",  # flashinfer-bench, without its CUDA dependencies
    ]
    # from now on every target runs .venv's python, which installs into itself
    assert make(tmp_path, "install", managed=True)[0] == ".venv/bin/python -c import"
    assert all(c.startswith(".venv/bin/python ") for c in make(tmp_path, "lint", managed=True))


@pytest.mark.skipif(shutil.which("make") is None, reason="needs the make command")
def test_install_goes_into_python3_where_pip_may_install(tmp_path):
    commands = make(tmp_path, "install", managed=False)
    assert commands == ["python3 -c import"] * 2 + ["python3 -m pip"] * 3
    assert not (tmp_path / ".venv").exists()
