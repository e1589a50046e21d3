"""`backends` and `plan` load kernel libraries in a process of their own: one whose loading
ends its process (a cut .so in the kernels folder: SIGBUS; tvm_ffi built for another Python)
gives that backend's line and verdicts a reason, and the command itself goes on (exit 0)."""

from __future__ import annotations

import os
from pathlib import Path

PLUGIN = ("--plugin", "tests.plugins.loads_badly")
SCENARIO = """
name: loads-badly
op: decode
arch: [cpu]
backends: [torch, loads-badly]
defaults: {model: v3.2, num_heads: 4, topk: 64, context_len: 128, page_size: 64}
cases:
  - batch_size: [1, 2]
"""
DIED = "loading its kernel library ended the process that loaded it (signal SIGBUS)"


def test_backends_survives_a_library_that_ends_its_process(run_cli):
    code, out, err = run_cli("backends", *PLUGIN)
    assert code == 0, err
    rows = {line.split()[0]: line for line in out.splitlines()}
    assert DIED in rows["loads-badly"]
    assert rows["torch"].endswith(f"reference torch {__import__('torch').__version__}")


def test_plan_survives_a_library_that_ends_its_process(run_cli, tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO)
    code, out, err = run_cli("plan", path, *PLUGIN, "--arch", "cpu")
    assert code == 0, err
    lines = out.splitlines()
    bad = [line for line in lines if " loads-badly " in line]
    assert len(bad) == 2 and all(f"unsupported: loads-badly: {DIED}" in x for x in bad)
    assert sum(" torch " in x and x.endswith("supported") for x in lines) == 2
    assert f"kernels loads-badly: not available: {DIED}" in lines
    assert "on cpu: 2 supported, 2 unsupported" in lines


def _cut_library() -> bytes:
    """Half of a real shared library (torch's smallest over 100 KiB): its program headers map
    pages past the end of the file."""
    import torch

    libs = sorted(Path(torch.__file__).parent.joinpath("lib").glob("*.so*"), key=os.path.getsize)
    whole = next(p for p in libs if p.stat().st_size > 100_000).read_bytes()
    return whole[: len(whole) // 2]


def test_a_cut_library_in_the_kernels_folder_is_a_line_of_backends(run_cli, tmp_path):
    folder = tmp_path / "fa3-vllm-0.33.0"
    folder.mkdir()
    (folder / "_vllm_fa3_C.abi3.so").write_bytes(_cut_library())
    code, out, err = run_cli("backends", env={"DSV4BENCH_KERNELS": str(tmp_path)})
    assert code == 0, err
    rows = {line.split()[0]: line for line in out.splitlines()}
    # where the loader maps past the end: SIGBUS; where it reads the headers first: its error
    assert "not available: " in rows["fa3"]
    assert "torch" in rows and "triton" in rows
