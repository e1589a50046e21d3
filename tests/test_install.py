"""`make install` on a python3 that refuses pip installs (PEP 668: a stock Debian/Ubuntu one)
makes .venv/ and installs there, and every later target runs .venv's python; elsewhere (CI) it
installs into python3 as before. Run against a stand-in python3 that logs what it is asked;
the check itself (MANAGED) runs on this machine's python, its standard library laid out under a
PYTHONHOME with and without the PEP 668 marker."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
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


# the install target's check, as it runs it, on the python given as PYTHON
PROBE = "managed-probe:\n\t@$(PYTHON) -c '$(MANAGED)'\n"


def python_home(tmp_path: Path, *, marker: bool) -> Path:
    """A PYTHONHOME for this interpreter: its standard library linked entry by entry into
    the layout sysconfig reads (`sysconfig.get_path("stdlib")` under the prefix), with or
    without the PEP 668 marker `EXTERNALLY-MANAGED` there."""
    home = tmp_path / ("managed" if marker else "plain")
    stdlib = Path(sysconfig.get_path("stdlib"))
    mine = home / stdlib.relative_to(sys.base_prefix)
    mine.mkdir(parents=True)
    for entry in stdlib.iterdir():
        if entry.name != "EXTERNALLY-MANAGED":  # this machine's own marker, if it has one
            (mine / entry.name).symlink_to(entry)
    if marker:
        (mine / "EXTERNALLY-MANAGED").write_text("[externally-managed]\nError=use a venv\n")
    return home


BASE_PYTHON = getattr(sys, "_base_executable", sys.executable)  # never a venv's python


def managed(tmp_path: Path, home: Path, python: str = BASE_PYTHON) -> bool:
    """Whether the Makefile's check says a real `python` under `home` is externally managed."""
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    (tmp_path / "probe.mk").write_text(PROBE)
    p = subprocess.run(
        ["make", "-s", "-f", "Makefile", "-f", "probe.mk", "managed-probe", f"PYTHON={python}"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONHOME": str(home)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    # the check answered (exit 0 or 1), not a python that failed to start or import
    assert p.returncode in (0, 2) and not re.search("Traceback|Fatal Python", p.stderr), p.stderr
    return p.returncode == 0


@pytest.mark.skipif(shutil.which("make") is None, reason="needs the make command")
def test_the_check_reads_the_pep668_marker_of_a_real_python(tmp_path):
    home = python_home(tmp_path, marker=True)
    assert managed(tmp_path, home)
    assert not managed(tmp_path, python_home(tmp_path, marker=False))
    # a venv over that marked python may install: pip never refuses inside one
    venv = tmp_path / "venv"
    subprocess.run([BASE_PYTHON, "-m", "venv", "--without-pip", str(venv)], check=True)
    assert not managed(tmp_path, home, str(venv / "bin" / "python"))
