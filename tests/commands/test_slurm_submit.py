"""`dsv4bench slurm` without a cluster: what submit asks of sbatch (a fake sbatch on PATH that
records its arguments: argument handling only; tests/slurm/ runs the real scheduler), the
refusals, and the merge step refusing a shard that did not finish."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from dsv4bench.run import slurm
from tests.factories import write_run

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "scenarios" / "smoke.yaml"

FAKE_SBATCH = """#!/usr/bin/env python3
import json, sys
from pathlib import Path
log = Path(sys.argv[0]).parent / "calls.jsonl"
calls = log.read_text().splitlines() if log.exists() else []
if "refuse" in " ".join(sys.argv):
    sys.exit("sbatch: error: invalid partition specified: refuse")
with open(log, "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
print(f"{101 + len(calls)};cluster")
"""
FAKE_SQUEUE = """#!/bin/sh
cat "$(dirname "$0")/queued" 2>/dev/null
"""


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("sbatch", FAKE_SBATCH), ("squeue", FAKE_SQUEUE)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")

    def calls() -> list[list[str]]:
        log = bin_dir / "calls.jsonl"
        return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []

    calls.bin = bin_dir
    return calls


def _flags(call: list[str]) -> list[str]:
    return call[: call.index("--wrap")]


def test_cpu_sweep_is_an_array_and_a_dependent_merge(run_cli, fake_slurm, tmp_path):
    out = tmp_path / "run"
    code, stdout, err = run_cli(
        *("slurm", "submit", SMOKE, "--shards", "4", "--arch", "cpu", "--out", out),
        *("--partition", "batch", "--account", "lab", "--time", "00:20:00"),
    )
    assert code == 0, err
    array, merge = fake_slurm()
    assert "--array=1-4" in array and "--dependency=afterany:101" in merge
    for call in (array, merge):
        assert {"--partition=batch", "--account=lab", "--time=00:20:00"} <= set(call)
        assert not [a for a in _flags(call) if a.startswith(("--gres", "--gpus"))]
    assert array[-1].endswith(f"-m dsv4bench.cli slurm task {out}")
    assert merge[-1].endswith(f"-m dsv4bench.cli slurm merge {out}")
    assert "array job 101: tasks 1-4" in stdout and "merge job 102 (after 101)" in stdout
    spec = slurm.Spec.load(out)
    assert spec.run_args == ["--arch", "cpu"] and spec.shards == 4
    assert spec.submissions[0]["array"] == "101" and spec.submissions[0]["merge"] == "102"


@pytest.mark.parametrize(
    "flags, asked, run_gpus",
    [
        ([], ["--ntasks=1", "--gpus-per-task=1"], False),
        (["--gpus-per-task", "2"], ["--ntasks=1", "--gpus-per-task=2"], True),
        (["--gres", "gpu:h100:1"], ["--gres=gpu:h100:1"], False),
    ],
)
def test_gpus_are_asked_the_slurm_way(run_cli, fake_slurm, tmp_path, flags, asked, run_gpus):
    out = tmp_path / "run"
    code, _, err = run_cli("slurm", "submit", SMOKE, "--shards", "2", "--out", out, *flags)
    assert code == 0, err
    array, merge = fake_slurm()
    assert [a for a in _flags(array) if a.startswith(("--gres", "--gpus", "--ntasks"))] == asked
    assert not [a for a in _flags(merge) if a.startswith(("--gres", "--gpus"))]  # merge: CPU
    assert ("--gpus" in slurm.Spec.load(out).run_args) == run_gpus


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--shards", "0"], "--shards 0: expected 1 or more"),
        (["--shards", "999"], "--shards 999: these scenarios have only 58 jobs"),
        (["--shards", "2", "--gpus-per-task", "1"], "--arch cpu runs on CPU nodes"),
        (["--shards", "2", "--baseline", "/nonexistent"], "--baseline /nonexistent: no such"),
        (["--shards", "2", "--partition", "refuse"], "sbatch refused the job: sbatch: error"),
    ],
)
def test_bad_submissions_are_one_line(run_cli, fake_slurm, tmp_path, flags, says):
    out = tmp_path / "r"
    code, _, err = run_cli("slurm", "submit", SMOKE, "--arch", "cpu", "--out", out, *flags)
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err
    assert fake_slurm() == [] and not out.exists()  # the same command, corrected, runs


def test_bad_scenario_is_refused_before_anything_is_submitted(run_cli, fake_slurm, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nop: decode\ncases: [{num_heads: -3}]\n")
    code, _, err = run_cli("slurm", "submit", bad, "--shards", "2", "--out", tmp_path / "r")
    assert code == 2 and "bad.yaml" in err
    assert fake_slurm() == [] and not (tmp_path / "r").exists()


def _row(case_id: str, shard: str) -> dict:
    return {"kind": "case", "case_id": case_id, "backend": "torch", "status": "ok", "tags": []}


def _slurm_run(tmp_path: Path, rows_of: dict[int, int], finished: dict[int, int]) -> Path:
    """A run directory as the tasks leave it: shard I with rows_of[I] rows, and the exit
    status of those whose task ran to its end."""
    run = tmp_path / "run"
    (run / slurm.LOGS).mkdir(parents=True)
    spec = slurm.Spec(
        scenarios=[str(SMOKE)],
        shards=4,
        run_args=["--arch", "cpu"],
        python="python3",
        workdir=str(ROOT),
        resources=slurm.Resources(),
        submissions=[{"array": "7", "tasks": "1-4", "merge": "8"}],
    )
    spec.save(run)
    for i, n in rows_of.items():
        rows = [{**_row(f"c{i}-{k}", f"{i}/4"), "shard": f"{i}/4"} for k in range(n)]
        write_run(slurm.shard_dir(run, i), rows)
    for i, rc in finished.items():
        slurm.record_task(slurm.shard_dir(run, i), f"7_{i}", rc)
    return run


def test_merge_names_a_cancelled_shard_and_merges_nothing(run_cli, tmp_path):
    # shard 3 has rows but its task never ended: merging it would drop its other jobs silently
    run = _slurm_run(tmp_path, {1: 3, 2: 3, 3: 1, 4: 3}, {1: 0, 2: 1, 4: 0})
    code, _, err = run_cli("slurm", "merge", run)
    assert code == 2
    assert "shard 3/4 missing: 1 rows, its task did not finish" in err
    assert "shard 1/4" not in err and "shard 2/4" not in err  # exit 1: failed cases, all rows
    assert f"dsv4bench slurm resubmit {run}" in err
    assert not (run / slurm.MERGED).exists()


def test_merge_names_a_failed_shard_with_its_error(run_cli, tmp_path):
    run = _slurm_run(tmp_path, {1: 3, 2: 3, 4: 3}, {1: 0, 2: 0, 3: 2, 4: 0})
    (run / slurm.LOGS / "shard-3-7.log").write_text("dsv4bench: bad.yaml: line 3: not YAML\n")
    code, _, err = run_cli("slurm", "merge", run)
    assert code == 2
    assert "shard 3/4 missing: task 7_3 exited 2 (dsv4bench: bad.yaml: line 3: not YAML)" in err
    assert not (run / slurm.MERGED).exists()
    code, out, _ = run_cli("slurm", "status", run)
    assert code == 1 and "shard 1/4: 3 rows, finished" in out and "shard 3/4: task 7_3" in out


def test_resubmit_runs_the_missing_shards_again(run_cli, fake_slurm, tmp_path):
    run = _slurm_run(tmp_path, {1: 3, 2: 1, 3: 3, 4: 3}, {1: 0, 3: 0, 4: 0})
    (fake_slurm.bin / "queued").write_text("8 8\n")  # the first merge job: still queued
    code, _, err = run_cli("slurm", "resubmit", run)
    assert code == 2 and "job(s) 8 of" in err and "still queued" in err and fake_slurm() == []
    (fake_slurm.bin / "queued").write_text("")
    code, stdout, err = run_cli("slurm", "resubmit", run, "--time", "01:00:00")
    assert code == 0, err
    array, merge = fake_slurm()
    assert "--array=2" in array and "--time=01:00:00" in array
    assert "--dependency=afterany:101" in merge
    assert "shard(s) 2 to run again" in stdout
    assert len(slurm.Spec.load(run).submissions) == 2


def test_array_ranges():
    assert slurm.ranges([1, 2, 3, 5, 7, 8]) == "1-3,5,7-8" and slurm.ranges([4]) == "4"


def test_the_task_step_wants_an_array_task_of_the_run(run_cli, tmp_path, monkeypatch):
    run = _slurm_run(tmp_path, {}, {})
    monkeypatch.delenv("SLURM_ARRAY_TASK_ID", raising=False)
    code, _, err = run_cli("slurm", "task", run)
    assert code == 2 and "SLURM_ARRAY_TASK_ID=None: expected 1..4 (an array task)" in err
    code, _, err = run_cli("slurm", "task", run, env={"SLURM_ARRAY_TASK_ID": "5"})
    assert code == 2 and "SLURM_ARRAY_TASK_ID=5" in err
    code, _, err = run_cli("slurm", "merge", tmp_path / "nothing")
    assert code == 2 and "no slurm.json (not a run `dsv4bench slurm submit` made)" in err
