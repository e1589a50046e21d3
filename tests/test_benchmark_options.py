"""The README's `pytest --benchmark-only --scenario FILE` (a space, not `=`) parses, and a GPU
scenario on a CPU is skipped at once with its reason, before any oracle runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_readme_benchmark_command_skips_a_gpu_scenario_on_a_cpu_quickly():
    import torch

    if torch.cuda.is_available():
        pytest.skip("needs a machine without a CUDA GPU")
    readme = (ROOT / "README.md").read_text()
    command = "pytest --benchmark-only --scenario scenarios/sm90/decode_batch.yaml"
    assert command in readme
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    p = subprocess.run(
        [sys.executable, "-m", *command.split(), "-p", "no:cacheprovider", "-rs", "-q"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "scenario sm90-decode-batch is for sm90; this machine is cpu" in p.stdout
    assert " passed" not in p.stdout.splitlines()[-1]
