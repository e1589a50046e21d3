"""`dsv4bench slurm` against a real Slurm (slurmctld + slurmd on this machine, a CPU-only node of
2 CPUs): the smoke scenario as a 4-task array and a merge equals one unsharded run job for job;
a task cancelled mid-run and resubmitted loses no row and duplicates none; a task that fails
makes the merge name its shard and fail.

Skipped, with what is missing, where Slurm cannot run (no slurm-wlm/munge, not root); with
DSV4BENCH_REQUIRE_SLURM=1 (CI) that is a failure instead. DSV4BENCH_SLURM_KEEP=DIR copies the
clean run's rows and its log (jobs, states, rows) there (results/cpu/slurm/)."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dsv4bench.run import slurm
from dsv4bench.run.merge import row_key
from tests.slurm import cluster as slurm_cluster

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "scenarios" / "smoke.yaml"
WAIT_S = 900  # a shared 2-core machine: generous; the jobs take about a minute
PRINTED: dict[Path, str] = {}  # what `slurm submit` printed, by run directory


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = slurm_cluster.missing()
    if why:
        if os.environ.get("DSV4BENCH_REQUIRE_SLURM") == "1":
            pytest.fail(f"DSV4BENCH_REQUIRE_SLURM=1 but {why}")
        pytest.skip(why)
    c = slurm_cluster.Cluster(tmp_path_factory.mktemp("slurm"))
    try:
        c.start(timeout=180)
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def unsharded(tmp_path_factory) -> dict[tuple, str]:
    """One plain run of the smoke scenario: job key -> status."""
    out = tmp_path_factory.mktemp("whole") / "run"
    done = _cli("run", SMOKE, "--arch", "cpu", "--out", out, "--quiet")
    assert done.returncode == 0, done.stderr
    return _statuses(out)


def _env(c: slurm_cluster.Cluster | None = None) -> dict[str, str]:
    env = c.env if c else dict(os.environ)
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))}


def _cli(*args, c: slurm_cluster.Cluster | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dsv4bench.cli", *map(str, args)],
        cwd=ROOT,
        env=_env(c),
        capture_output=True,
        text=True,
        timeout=600,
    )


def _rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "results.jsonl").read_text().splitlines()]


def _statuses(run: Path) -> dict[tuple, str]:
    rows = _rows(run)
    found = {row_key(r): r["status"] for r in rows}
    assert len(found) == len(rows), "a job has two rows"
    return found


def _submit(c, run: Path, *args) -> tuple[str, str]:
    done = _cli("slurm", "submit", *args, "--arch", "cpu", "--out", run, c=c)
    assert done.returncode == 0, done.stderr
    last = slurm.Spec.load(run).submissions[-1]
    assert (
        f"array job {last['array']}" in done.stdout and f"merge job {last['merge']}" in done.stdout
    )
    PRINTED[run] = done.stdout
    return last["array"], last["merge"]


def _merge_log(run: Path, merge: str) -> str:
    return (run / slurm.LOGS / f"merge-{merge}.log").read_text()


def test_smoke_as_a_4_task_array_merges_like_one_run(cluster, unsharded, tmp_path):
    run = tmp_path / "run"
    start = time.monotonic()
    array, merge = _submit(cluster, run, SMOKE, "--shards", "4", "--time", "00:30:00")
    cluster.wait_done([array, merge], WAIT_S)
    took = time.monotonic() - start
    assert cluster.states(array) == dict.fromkeys("1234", "COMPLETED")
    assert cluster.state(merge) == "COMPLETED", _merge_log(run, merge)
    merged = run / slurm.MERGED
    assert _statuses(merged) == unsharded
    assert {r["shard"] for r in _rows(merged)} == {"1/4", "2/4", "3/4", "4/4"}
    assert (merged / "report.md").is_file()
    _keep(cluster, run, [array, merge], took, len(unsharded))


def _keep(c, run: Path, ids: list[str], took: float, whole: int) -> None:
    """The run's log (jobs, states, rows) and merged rows under $DSV4BENCH_SLURM_KEEP."""
    where = os.environ.get("DSV4BENCH_SLURM_KEEP")
    if not where:
        return
    keep = Path(where)
    keep.mkdir(parents=True, exist_ok=True)
    merged = run / slurm.MERGED
    shards = [slurm.shard_state(run, i, 4) for i in range(1, 5)]
    log = [
        f"dsv4bench slurm submit scenarios/smoke.yaml --shards 4 --arch cpu --time 00:30:00 "
        f"(one node, 2 CPUs, slurm-wlm {_slurm_version(c)}); submit to merged: {took:.0f} s",
        *(f"  {line}" for line in PRINTED[run].splitlines()),
        "jobs:",
        *c.describe(ids),
        "rows:",
        *(f"  shard {s.label}: {s.rows}" for s in shards),
        f"  merged: {len(_rows(merged))} ({_count(merged)})",
        f"  one unsharded run: {whole} jobs; the merged rows hold each once, same statuses",
    ]
    (keep / "slurm-log.txt").write_text("\n".join(log) + "\n")
    with (
        open(merged / "results.jsonl", "rb") as src,
        gzip.open(keep / "results.jsonl.gz", "wb") as d,
    ):
        shutil.copyfileobj(src, d)
    for name in ("merged.json", "command.txt"):
        shutil.copy2(merged / name, keep / name)
    shutil.copytree(run / slurm.LOGS, keep / "logs", dirs_exist_ok=True)


def _slurm_version(c) -> str:
    return c.run("sinfo", "--version", check=False).stdout.split()[-1]


def _count(run: Path) -> str:
    counts: dict[str, int] = {}
    for r in _rows(run):
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    return ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))


def _row_count(shard: Path) -> int:
    rows = shard / "results.jsonl"
    return rows.read_text().count("\n") if rows.exists() else 0


def test_a_task_cancelled_mid_run_is_resubmitted_without_loss(cluster, unsharded, tmp_path):
    run = tmp_path / "run"
    array, merge = _submit(cluster, run, SMOKE, "--shards", "4")
    shard = slurm.shard_dir(run, 2)  # in the first wave, with task 1 (2 CPUs, 1 per task)
    cluster.wait_for(lambda: _row_count(shard) >= 1, WAIT_S, "shard 2's first row", 0.05)
    cluster.run("scancel", f"{array}_2")
    cluster.wait_for(lambda: cluster.states(array).get("2") == "CANCELLED", 120, "the cancel")
    cut = _row_count(shard)
    cluster.wait_done([array, merge], WAIT_S)
    assert cluster.state(merge) == "FAILED"
    assert "shard 2/4 missing" in _merge_log(run, merge)
    assert not (run / slurm.MERGED / "results.jsonl").exists()

    done = _cli("slurm", "resubmit", run, c=cluster)  # the documented resubmit
    assert done.returncode == 0, done.stderr
    again = slurm.Spec.load(run).submissions[-1]
    assert again["tasks"] == "2"
    cluster.wait_done([again["array"], again["merge"]], WAIT_S)
    assert cluster.state(again["merge"]) == "COMPLETED", _merge_log(run, again["merge"])
    assert 0 < cut < _row_count(shard), "the cancel did not cut the shard mid-run"
    assert "--resume" in (shard / "command.txt").read_text().splitlines()[-1]
    assert _statuses(run / slurm.MERGED) == unsharded  # no row lost, none twice


def test_a_failed_task_makes_the_merge_name_its_shard(cluster, tmp_path):
    scenario = tmp_path / "smoke.yaml"
    shutil.copy(SMOKE, scenario)
    run = tmp_path / "run"
    array, merge = _submit(cluster, run, scenario, "--shards", "2", "--hold")
    cluster.run("scontrol", "release", f"{array}_1")
    finished = lambda: cluster.states(array).get("1") == "COMPLETED"
    cluster.wait_for(finished, WAIT_S, "task 1")
    scenario.write_text("name: smoke\ncases: [unclosed\n")  # task 2 reads a broken file
    cluster.run("scontrol", "release", f"{array}_2")
    cluster.run("scontrol", "release", merge)
    cluster.wait_done([array, merge], WAIT_S)
    assert cluster.states(array)["2"] == "FAILED"
    log = _merge_log(run, merge)
    assert cluster.state(merge) == "FAILED", log
    assert f"shard 2/2 missing: task {array}_2 exited 2" in log and "smoke.yaml" in log
    assert "shard 1/2" not in log
    assert not (run / slurm.MERGED / "results.jsonl").exists()
