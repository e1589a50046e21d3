"""Shards run apart and merged equal one run; merge refuses what is not one comparison."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.factories import write_run

ROOT = Path(__file__).resolve().parents[2]
SAME_CASES = ROOT / "tools" / "same_cases.py"

TINY = """
name: merge-test
op: decode
backends: [torch]
timing: {warmup: 0, iters: 2, flush_l2: false}
defaults: {context_len: 128, batch_size: 1, model: v3.2, topk: 64}
cases:
  - num_heads: [4, 8, 16]
  - {op: prefill, tokens: 16, num_heads: 4}
"""


def here(capsys, *args) -> tuple[int, str, str]:
    from dsv4bench import cli

    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGPIPE)}
    try:
        code = cli.main([str(a) for a in args])
    finally:
        for s, h in handlers.items():
            signal.signal(s, h)
    out, err = capsys.readouterr()
    return code, out, err


def same_cases(a: Path, b: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, SAME_CASES, a, b], capture_output=True, text=True, timeout=60
    )


def test_two_shards_merged_hold_the_unsharded_runs_cases_and_statuses(tmp_path, capsys):
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(TINY)
    run = lambda out, *more: here(
        capsys, "run", scenario, "--out", tmp_path / out, "--quiet", *more
    )
    assert run("whole")[0] == 0
    code, _, err = run("s1", "--shard", "1/2")
    assert code == 0 and "shard 1/2: " in err
    assert run("s2", "--shard", "2/2")[0] == 0
    lines = (tmp_path / "s1" / "results.jsonl").read_text().splitlines()
    shard_rows = [json.loads(x) for x in lines]
    assert shard_rows and {r["shard"] for r in shard_rows} == {"1/2"}
    assert "--shard 1/2" in (tmp_path / "s1" / "command.txt").read_text()

    merged = tmp_path / "m"
    code, out, err = here(capsys, "merge", tmp_path / "s2", tmp_path / "s1", "--out", merged)
    assert code == 0, err
    assert (merged / "shards" / "1" / "command.txt").read_text().count("--shard 1/2") == 1
    assert json.loads((merged / "shards" / "2" / "env.json").read_text())[0]["arch"] == "cpu"
    record = json.loads((merged / "merged.json").read_text())
    assert [p["shard"] for p in record["parts"]] == ["1/2", "2/2"] and record["missing"] == []

    same = same_cases(tmp_path / "whole", merged)
    assert same.returncode == 0, same.stdout
    assert "same cases, same statuses: 4 (4 ok)" in same.stdout
    assert here(capsys, "report", merged, "--in-place")[0] == 0
    assert (merged / "report.md").is_file()

    # the tool sees a difference: one shard alone lacks the other's cases
    diff = same_cases(tmp_path / "whole", tmp_path / "s1")
    assert diff.returncode == 1 and "only in" in diff.stdout


def rows_dir(path: Path, rows: list[dict]) -> Path:
    write_run(path, rows)
    (path / "command.txt").write_text(f"dsv4bench run for {path.name}\n")
    return path


def row(case_id: str, shard: str | None = "1/2", gpu="NVIDIA H200", version="1.0") -> dict:
    r = {
        "kind": "case",
        "case_id": case_id,
        "backend": "flashmla",
        "status": "ok",
        "tags": [],
        "env": {"gpu": gpu, "arch": "sm90", "gpu_index": 0},
        "provider": {"name": "vllm", "version": version, "location": "/x"},
    }
    if shard:
        r["shard"] = shard
    return r


@pytest.mark.parametrize(
    "parts, why",
    [
        ([[row("a", "1/2")], [row("b", "1/2")]], "are both shard 1/2"),
        ([[row("a", "1/2")], [row("b", "2/3")]], "different splits"),
        ([[row("a", None)], [row("a", None)]], "is in both"),
        ([[row("a", "1/2"), row("b", "2/2")]], "several shards"),
        ([[row("a")], [row("b", "2/2", gpu="NVIDIA H100 80GB HBM3")]], "different GPU models"),
        ([[row("a")], [row("b", "2/2", version="2.0")]], "flashmla: different kernel builds"),
    ],
)
def test_merge_refuses_with_one_line_and_exit_2(tmp_path, capsys, parts, why):
    dirs = [rows_dir(tmp_path / f"p{i}", rows) for i, rows in enumerate(parts)]
    code, _, err = here(capsys, "merge", *dirs, "--out", tmp_path / "m")
    assert code == 2 and why in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "m" / "results.jsonl").exists()


def test_merge_of_mixed_builds_when_asked_and_of_missing_shards_when_partial(tmp_path, capsys):
    a = rows_dir(tmp_path / "a", [row("a", "1/3")])
    b = rows_dir(tmp_path / "b", [row("b", "3/3", gpu="NVIDIA H100 80GB HBM3", version="2")])
    # one shard of two (of three) merged and exit 0 read as a whole run: refused
    for given in ((a,), (a, b)):
        code, out, err = here(capsys, "merge", *given, "--out", tmp_path / "m", "--allow-mixed")
        assert code == 2 and not out and len(err.strip().splitlines()) == 1, err
        assert err.startswith("dsv4bench: shard(s) 2/3")
        assert not (tmp_path / "m").exists()
    args = ("--out", tmp_path / "m", "--allow-mixed", "--partial")
    code, _, err = here(capsys, "merge", a, b, *args)
    assert code == 0 and "without shard(s) 2/3" in err
    assert json.loads((tmp_path / "m" / "merged.json").read_text())["missing"] == ["2/3"]
    assert json.loads((tmp_path / "m" / "merged.json").read_text())["allow_mixed"] is True
    assert len((tmp_path / "m" / "results.jsonl").read_text().splitlines()) == 2
    for args, why in [
        ((a, a), "given twice"),
        ((a, b), "already holds results"),  # --out m again
        ((tmp_path / "nothing",), "not a run directory"),
    ]:
        code, _, err = here(
            capsys, "merge", *args, "--out", tmp_path / "m", "--allow-mixed", "--partial"
        )
        assert code == 2 and why in err


@pytest.mark.parametrize("command", ["run", "bench"])
def test_gpus_without_a_gpu_is_one_line_and_exit_2(tmp_path, capsys, command):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: --gpus is valid here")
    scenario = ROOT / "scenarios" / "smoke.yaml"
    args = [command, *([scenario] if command == "run" else []), "--out", tmp_path / "r"]
    code, _, err = here(capsys, *args, "--gpus", "all")
    assert code == 2 and err.strip() == "dsv4bench: --gpus all: this machine has no CUDA GPU"
    assert not (tmp_path / "r").exists()
    code, _, err = here(capsys, *args, "--shard", "2/1")
    assert code == 2 and "--shard 2/1" in err


def test_merge_refuses_a_part_with_an_unreadable_line(tmp_path, capsys):
    a = rows_dir(tmp_path / "a", [row("a", "1/2"), row("b", "1/2"), row("c", "1/2")])
    lines = (a / "results.jsonl").read_text().splitlines()
    lines[1] = lines[1][:20] + "\x00garbage"  # a corrupted middle line: job b would vanish
    (a / "results.jsonl").write_text("\n".join(lines) + "\n")
    b = rows_dir(tmp_path / "b", [row("d", "2/2")])
    code, _, err = here(capsys, "merge", a, b, "--out", tmp_path / "m")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "1 unreadable line(s) (line 2)" in err
    assert not (tmp_path / "m" / "results.jsonl").exists()


def test_an_unsharded_run_and_shard_1_keep_their_own_provenance(tmp_path, capsys):
    whole = rows_dir(tmp_path / "whole", [row("a", None)])
    s1 = rows_dir(tmp_path / "s1", [row("b", "1/2")])
    code, _, err = here(capsys, "merge", whole, s1, "--out", tmp_path / "m", "--partial")
    assert code == 0, err
    record = json.loads((tmp_path / "m" / "merged.json").read_text())
    dirs = [p["dir"] for p in record["parts"]]
    assert len(set(dirs)) == 2
    for p in record["parts"]:
        source = Path(p["source"]).name
        kept = (tmp_path / "m" / p["dir"] / "command.txt").read_text()
        assert kept == f"dsv4bench run for {source}\n"
