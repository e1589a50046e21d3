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


def _pytest(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )


ONE_CASE = """name: one
op: decode
arch: [cpu]
backends: [torch]
timing: {warmup: 0, iters: 1}
defaults: {model: v3.2, num_heads: 4, topk: 64, context_len: 128, page_size: 64}
cases:
  - batch_size: 1
"""
PLUGIN = "dsv4bench.commands.pytest_plugin"


def test_a_scenario_outside_the_checkout_runs_with_the_installed_plugin(tmp_path):
    """The entry point `make install` registers (`-p` loads the same module at the same stage
    of pytest's start), from a folder of neither the checkout nor the scenario."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["pytest11"] == {PLUGIN: PLUGIN}
    scenario = tmp_path / "elsewhere" / "one.yaml"
    scenario.parent.mkdir()
    scenario.write_text(ONE_CASE)
    (tmp_path / "cwd").mkdir()
    p = _pytest("-p", PLUGIN, "--benchmark-only", "--scenario", str(scenario), cwd=tmp_path / "cwd")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert p.stdout.splitlines()[-1].startswith("1 passed")


def test_an_unknown_bench_backend_is_one_line(tmp_path):
    p = _pytest("--benchmark-only", "--bench-backend", "nosuch", cwd=ROOT)
    assert p.returncode == 4  # pytest's usage error
    lines = [x for x in (p.stdout + p.stderr).splitlines() if "nosuch" in x]
    assert len(lines) == 1 and "--bench-backend nosuch: unknown backend (known: " in lines[0]
    assert "failed" not in p.stdout
