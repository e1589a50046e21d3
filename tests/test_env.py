"""Provenance: the project's own commit, never that of a repository that encloses a copy."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

PROBE = "from dsv4bench import env; print(env._git_commit())"


def _commit_seen_from(copy: Path, **env_vars) -> str:
    import os

    env = {k: v for k, v in os.environ.items() if k != "DSV4BENCH_GIT_COMMIT"}
    env.update(env_vars)
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=copy, capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.skipif(shutil.which("git") is None, reason="needs the git command")
def test_a_copy_inside_another_repository_records_no_commit(tmp_path):
    outer = tmp_path / "outer"
    outer.mkdir()
    subprocess.run(["git", "init", "-q", str(outer)], check=True)
    subprocess.run(
        [
            "git",
            "-C",
            str(outer),
            "-c",
            "user.email=a@b",
            "-c",
            "user.name=a",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "outer",
        ],
        check=True,
    )
    copy = outer / "dsv4bench-copy"
    shutil.copytree(ROOT / "dsv4bench", copy / "dsv4bench")
    assert _commit_seen_from(copy) == "None"
    assert _commit_seen_from(copy, DSV4BENCH_GIT_COMMIT="abc123") == "abc123"


@pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout"
)
def test_the_project_checkout_records_its_commit():
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    assert _commit_seen_from(ROOT).startswith(head)
