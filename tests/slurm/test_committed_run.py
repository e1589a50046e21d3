"""The committed Slurm run (results/cpu/slurm/) is what docs/scale-out.md shows: the log block,
its timings, and merged rows holding each smoke job once. No cluster needed."""

from __future__ import annotations

import re
from pathlib import Path

from dsv4bench.commands.common import load
from dsv4bench.rows.results import read_rows
from dsv4bench.run.merge import row_key

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "results" / "cpu" / "slurm"
DOC = ROOT / "docs" / "scale-out.md"


def _log() -> str:
    return (RUN / "slurm-log.txt").read_text()


def _seconds(clock: str) -> int:
    h, m, s = (int(x) for x in clock.split(":"))
    return 3600 * h + 60 * m + s


def test_the_doc_shows_the_committed_log():
    log = re.sub(r"/tmp/\S+?/run(?=[/: ]|$)", "RUN", _log(), flags=re.M)
    assert f"```\n{log}```" in DOC.read_text()


def test_the_doc_timings_are_the_logs():
    jobs = re.findall(r"^\s+(\S+) (dsv4bench\S*)\s+(\w+)\s+exit (\S+).* run (\S+)$", _log(), re.M)
    tasks = [_seconds(j[4]) for j in jobs if j[1] == "dsv4bench"]
    (merge,) = [_seconds(j[4]) for j in jobs if j[1] == "dsv4bench-merge"]
    assert len(tasks) == 4 and {j[2] for j in jobs} == {"COMPLETED"}
    total = re.search(r"submit to merged: (\d+) s", _log()).group(1)
    text = " ".join(DOC.read_text().split())
    assert f"at most {max(tasks)} s, and the merge job (merge, report) took {merge} s" in text
    assert f"{total} s from submission to merged rows" in text


def test_the_merged_rows_hold_each_smoke_job_once():
    rows = list(read_rows(RUN))
    keys = [row_key(r) for r in rows]
    smoke, _limits, _specs = load([str(ROOT / "scenarios" / "smoke.yaml")], None)
    assert len(set(keys)) == len(keys) == len(smoke)
    assert {r["shard"] for r in rows} == {"1/4", "2/4", "3/4", "4/4"}
    counts = {s: sum(r["status"] == s for r in rows) for s in ("ok", "unsupported")}
    assert (
        f"merged: {len(smoke)} ({counts['ok']} ok, {counts['unsupported']} unsupported)" in _log()
    )
