"""The environment a result was measured in: GPU, driver, library versions, git commit."""

from __future__ import annotations

import os
import platform
import subprocess
from functools import cache
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
ENV_COMMIT = "DSV4BENCH_GIT_COMMIT"  # set by whoever copies a checkout without its .git


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["git", "-C", str(_ROOT), *args], capture_output=True, text=True, timeout=5
    )


def _git_commit() -> str | None:
    """The project's own commit: DSV4BENCH_GIT_COMMIT if set, else git's, but only when the
    project's root is the root of the enclosing repository (a copy placed inside another
    repository must not record that repository's commit)."""
    if os.environ.get(ENV_COMMIT):
        return os.environ[ENV_COMMIT]
    try:
        top = _git("rev-parse", "--show-toplevel")
        if top.returncode != 0 or Path(top.stdout.strip()).resolve() != _ROOT:
            return None
        out = _git("rev-parse", "--short=12", "HEAD")
        dirty = _git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def uuid_text(uuid) -> str | None:
    """torch's device uuid as nvidia-smi writes it (GPU-xxxxxxxx-...)."""
    if uuid is None:
        return None
    text = str(uuid)
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


def _version(module: str) -> str | None:
    try:
        mod = __import__(module)
    except Exception:  # an optional library that fails to import is simply absent
        return None
    return getattr(mod, "__version__", "unknown")


@cache
def collect() -> dict:
    import torch

    env = {
        "python": platform.python_version(),
        "host": platform.node(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": _version("triton"),
        "git_commit": _git_commit(),
        "gpu": None,
        "arch": "cpu",
        "driver": None,
        "cpu": platform.processor() or platform.machine(),
    }
    if torch.cuda.is_available():
        from dsv4bench.measure import hardware

        props = torch.cuda.get_device_properties(0)
        env["gpu"] = props.name
        env["gpu_uuid"] = uuid_text(getattr(props, "uuid", None))
        env["arch"] = hardware.arch_of(0)
        env["sm_count"] = props.multi_processor_count
        env["smem_per_block_optin"] = getattr(props, "shared_memory_per_block_optin", None)
        env["driver"] = _driver_version()
    return env


def _driver_version() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout else None
