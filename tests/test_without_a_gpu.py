"""Without CUDA: tests marked `gpu` skip, and `make gpu-test` (pytest -m gpu) says it ran
nothing and exits 5, not 0 (a job meant to test GPUs cannot pass without one); the GPU tools
say in one line that they need one, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def gpu_tests_without_cuda(*paths: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no CUDA device, even on a GPU machine
    command = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider"]
    return subprocess.run(
        [*command, *paths], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )


def test_gpu_tests_without_their_own_skip_skip_and_the_session_says_none_ran():
    # these three carry no skip of their own: they failed on a machine without a GPU
    p = gpu_tests_without_cuda("tests/scenarios/test_workloads.py")
    assert p.returncode == 5, p.stdout + p.stderr
    assert "no CUDA GPU: 0 tests ran (3 gpu tests skipped)" in p.stdout
    assert "3 skipped" in p.stdout and "failed" not in p.stdout


@pytest.mark.slow
def test_every_gpu_test_skips_without_cuda():
    p = gpu_tests_without_cuda()
    assert p.returncode == 5, p.stdout[-3000:] + p.stderr[-3000:]
    assert "no CUDA GPU: 0 tests ran (" in p.stdout
    assert " failed" not in p.stdout and " error" not in p.stdout


@pytest.mark.parametrize(
    "tool, why",
    [
        (["gluon_breakdown.py", "decode=default"], "gluon_breakdown: needs a CUDA GPU"),
        (["oracle_bench.py", "--device", "cuda", "decode:64:4:64"], "this machine has no CUDA"),
    ],
)
def test_gpu_tools_without_cuda_say_so_in_one_line_and_exit_2(tool, why):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)}
    p = subprocess.run(
        [sys.executable, str(ROOT / "tools" / tool[0]), *tool[1:]],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 2 and not p.stdout, p.stderr
    assert why in p.stderr and "Traceback" not in p.stderr
